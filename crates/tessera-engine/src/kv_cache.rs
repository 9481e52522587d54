//! The KV cache in fixed-size blocks: per layer one pool `[num_blocks, BLOCK, kv_heads, d]`
//! and, for the sequence, a block table mapping position p to block `table[p / BLOCK]`.
//!
//! Decode attends over the blocks in place with the paged decode kernel; prefill gathers
//! the positions into one contiguous run for the flash kernel (a copy far cheaper than the
//! prefill's matmuls). Blocks come from a free list, so sequences can share a pool.

use crate::llama::Config;
use crate::{Error, Result};
use tessera_kernels::ops::paged_attention::{PagedKvCache, PagedSeqs};

/// Positions per block: 16 rows of `kv_heads·d` floats (3 KiB for SmolLM2), enough to
/// amortise the table lookup while wasting at most 15 positions per sequence.
pub const BLOCK: usize = 16;

#[derive(Debug)]
pub struct KvCache {
    kv_dim: usize,
    kv_heads: usize,
    head_dim: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    num_blocks: usize,
    free: Vec<u32>,
    table: Vec<u32>,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// A cache for one sequence of up to `capacity` positions.
    pub fn new(cfg: &Config, capacity: usize) -> Result<Self> {
        let num_blocks = capacity.div_ceil(BLOCK);
        let per = (num_blocks * BLOCK)
            .checked_mul(cfg.kv_dim())
            .filter(|&b| b <= 1 << 32)
            .ok_or_else(|| {
                Error::Model(format!("KV cache of {capacity} positions is too large"))
            })?;
        Ok(KvCache {
            kv_dim: cfg.kv_dim(),
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            k: vec![vec![0.0; per]; cfg.n_layers],
            v: vec![vec![0.0; per]; cfg.n_layers],
            num_blocks,
            free: (0..num_blocks as u32).rev().collect(),
            table: Vec::new(),
            len: 0,
            capacity,
        })
    }
    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Makes room for positions up to `new_len` (an error, changing nothing, when full).
    pub(crate) fn reserve(&mut self, new_len: usize) -> Result<()> {
        let need = new_len.div_ceil(BLOCK).saturating_sub(self.table.len());
        if new_len > self.capacity || need > self.free.len() {
            return Err(Error::Model(format!(
                "context full: {new_len} positions > {}",
                self.capacity
            )));
        }
        for _ in 0..need {
            self.table.push(self.free.pop().expect("counted above"));
        }
        Ok(())
    }

    /// Element offset of position `pos` in a layer's pool.
    fn slot(&self, pos: usize) -> usize {
        (self.table[pos / BLOCK] as usize * BLOCK + pos % BLOCK) * self.kv_dim
    }

    /// Stores rows of K and V (`[n, kv_dim]`) for positions `pos0..pos0+n` of `layer`.
    pub(crate) fn write(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let kd = self.kv_dim;
        for (i, (kr, vr)) in k.chunks_exact(kd).zip(v.chunks_exact(kd)).enumerate() {
            let at = self.slot(pos0 + i);
            self.k[layer][at..at + kd].copy_from_slice(kr);
            self.v[layer][at..at + kd].copy_from_slice(vr);
        }
    }

    /// Copies positions `0..upto` of `layer` into contiguous `[upto, kv_dim]` buffers.
    pub(crate) fn gather(&self, layer: usize, upto: usize, k: &mut Vec<f32>, v: &mut Vec<f32>) {
        k.clear();
        v.clear();
        let kd = self.kv_dim;
        let mut pos = 0;
        for &b in &self.table {
            let n = BLOCK.min(upto - pos.min(upto));
            if n == 0 {
                break;
            }
            let at = b as usize * BLOCK * kd;
            k.extend_from_slice(&self.k[layer][at..at + n * kd]);
            v.extend_from_slice(&self.v[layer][at..at + n * kd]);
            pos += n;
        }
    }

    /// The paged view of `layer` for the decode kernel.
    pub(crate) fn paged(&self, layer: usize) -> PagedKvCache<'_, f32> {
        PagedKvCache {
            k: &self.k[layer],
            v: &self.v[layer],
            num_blocks: self.num_blocks,
            block_size: BLOCK,
            kv_heads: self.kv_heads,
            d: self.head_dim,
        }
    }

    /// The sequence's block table with `context` visible positions.
    pub(crate) fn seqs<'a>(&'a self, context: &'a [usize]) -> PagedSeqs<'a> {
        PagedSeqs {
            block_tables: &self.table,
            max_blocks: self.table.len(),
            context_lens: context,
        }
    }

    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len;
    }
}
