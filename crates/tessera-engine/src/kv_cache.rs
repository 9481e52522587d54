//! The KV cache in fixed-size blocks: per layer one pool `[num_blocks, BLOCK, kv_heads, d]`
//! and, for the sequence, a block table mapping position p to block `table[p / BLOCK]`.
//!
//! Decode attends over the blocks in place with the paged decode kernel; prefill gathers
//! the positions into one contiguous run for the flash kernel (a copy far cheaper than the
//! prefill's matmuls). Blocks come from a free list, so sequences can share a pool.
//!
//! Values are stored as f32 (exact) or f16 ([`KvDtype`]). Past a few hundred positions
//! decode attention reads more bytes than any weight matrix (2·kv_dim·4 bytes per
//! position and layer, 1.5 KiB for SmolLM2), so f16 halves the largest decode cost; its
//! 11-bit significand keeps keys and values to 2⁻¹² relative, as llama.cpp's default.

use crate::llama::Config;
use crate::{Error, Result};
use half::f16;
use half::slice::HalfFloatSliceExt;
use tessera_core::{Isa, TensorView, TensorViewMut};
use tessera_kernels::ops::paged_attention::{
    paged_attention, PagedKvCache, PagedParams, PagedSeqs,
};

/// Positions per block: 16 rows of `kv_heads·d` floats (3 KiB for SmolLM2), enough to
/// amortise the table lookup while wasting at most 15 positions per sequence.
pub const BLOCK: usize = 16;

/// How cached keys and values are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    /// Exact: attention sees the f32 keys and values the layers produced.
    F32,
    /// Half the bytes; keys and values rounded to f16.
    #[default]
    F16,
}

impl std::str::FromStr for KvDtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            _ => Err(Error::Model(format!("KV cache type '{s}' (f32 or f16)"))),
        }
    }
}

/// A storage element: rows convert from and to f32 on the way in and out.
trait KvElem: Copy {
    const ZERO: Self;
    fn store(dst: &mut [Self], src: &[f32]);
    fn load(src: &[Self], dst: &mut [f32]);
}

impl KvElem for f32 {
    const ZERO: Self = 0.0;
    fn store(dst: &mut [f32], src: &[f32]) {
        dst.copy_from_slice(src);
    }
    fn load(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl KvElem for f16 {
    const ZERO: Self = f16::ZERO;
    fn store(dst: &mut [f16], src: &[f32]) {
        dst.convert_from_f32_slice(src);
    }
    fn load(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

/// Per layer, a pool of keys and one of values, `per` elements each.
#[derive(Debug)]
struct Pool<T> {
    k: Vec<Vec<T>>,
    v: Vec<Vec<T>>,
}

impl<T: KvElem> Pool<T> {
    fn new(layers: usize, per: usize) -> Self {
        Pool {
            k: vec![vec![T::ZERO; per]; layers],
            v: vec![vec![T::ZERO; per]; layers],
        }
    }
    /// Stores one position's K and V rows at element offset `at` of `layer`.
    fn write(&mut self, layer: usize, at: usize, kr: &[f32], vr: &[f32]) {
        T::store(&mut self.k[layer][at..at + kr.len()], kr);
        T::store(&mut self.v[layer][at..at + vr.len()], vr);
    }
    /// Widens `k.len()` elements of `layer` from element offset `at` into `k` and `v`.
    fn read(&self, layer: usize, at: usize, k: &mut [f32], v: &mut [f32]) {
        T::load(&self.k[layer][at..at + k.len()], k);
        T::load(&self.v[layer][at..at + v.len()], v);
    }
}

#[derive(Debug)]
enum Pools {
    F32(Pool<f32>),
    F16(Pool<f16>),
}

/// Runs `$e` with `$p` bound to the pool, whichever element type it stores.
macro_rules! with_pool {
    ($pools:expr, $p:ident => $e:expr) => {
        match $pools {
            Pools::F32($p) => $e,
            Pools::F16($p) => $e,
        }
    };
}

/// Largest cache the constructor allocates (keys and values, every layer): beyond it a
/// request is an error instead of an allocation failure.
const MAX_BYTES: usize = 64 << 30;

#[derive(Debug)]
pub struct KvCache {
    kv_dim: usize,
    kv_heads: usize,
    head_dim: usize,
    pools: Pools,
    num_blocks: usize,
    free: Vec<u32>,
    table: Vec<u32>,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// An exact (f32) cache for one sequence of up to `capacity` positions.
    pub fn new(cfg: &Config, capacity: usize) -> Result<Self> {
        Self::with_dtype(cfg, capacity, KvDtype::F32)
    }

    /// A cache storing keys and values as `dtype`.
    pub fn with_dtype(cfg: &Config, capacity: usize, dtype: KvDtype) -> Result<Self> {
        let num_blocks = capacity.div_ceil(BLOCK);
        let elt = match dtype {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        };
        let per = (num_blocks * BLOCK).checked_mul(cfg.kv_dim());
        let total = per.and_then(|p| p.checked_mul(2 * elt * cfg.n_layers));
        let per = per
            .filter(|_| total.is_some_and(|t| t <= MAX_BYTES))
            .ok_or_else(|| {
                Error::Model(format!(
                    "KV cache of {capacity} positions is too large (over {} GiB)",
                    MAX_BYTES >> 30
                ))
            })?;
        Ok(KvCache {
            kv_dim: cfg.kv_dim(),
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            pools: match dtype {
                KvDtype::F32 => Pools::F32(Pool::new(cfg.n_layers, per)),
                KvDtype::F16 => Pools::F16(Pool::new(cfg.n_layers, per)),
            },
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
    pub fn dtype(&self) -> KvDtype {
        match self.pools {
            Pools::F32(..) => KvDtype::F32,
            Pools::F16(..) => KvDtype::F16,
        }
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
            with_pool!(&mut self.pools, p => p.write(layer, at, kr, vr));
        }
    }

    /// Copies positions `0..upto` of `layer` into contiguous f32 `[upto, kv_dim]` buffers.
    pub(crate) fn gather(&self, layer: usize, upto: usize, k: &mut Vec<f32>, v: &mut Vec<f32>) {
        let kd = self.kv_dim;
        k.resize(upto * kd, 0.0);
        v.resize(upto * kd, 0.0);
        let mut pos = 0;
        for &b in &self.table {
            let n = BLOCK.min(upto - pos.min(upto));
            if n == 0 {
                break;
            }
            let (src, dst) = (b as usize * BLOCK * kd, pos * kd);
            let len = n * kd;
            let (kdst, vdst) = (&mut k[dst..dst + len], &mut v[dst..dst + len]);
            with_pool!(&self.pools, p => p.read(layer, src, kdst, vdst));
            pos += n;
        }
    }

    /// Decode attention of `q` (`[1, heads, d]`) over the first `context` positions of
    /// `layer`, read in place from the blocks.
    pub(crate) fn attend(
        &self,
        layer: usize,
        context: usize,
        q: &TensorView<'_, f32>,
        out: &mut TensorViewMut<'_, f32>,
        params: PagedParams,
    ) -> Result<()> {
        let lens = [context];
        let seqs = PagedSeqs {
            block_tables: &self.table,
            max_blocks: self.table.len(),
            context_lens: &lens,
        };
        let isa = Isa::best();
        with_pool!(&self.pools, p => {
            let view = self.view(&p.k[layer], &p.v[layer]);
            paged_attention(isa, q, &view, &seqs, out, params)?
        });
        Ok(())
    }

    fn view<'a, T>(&self, k: &'a [T], v: &'a [T]) -> PagedKvCache<'a, T> {
        PagedKvCache {
            k,
            v,
            num_blocks: self.num_blocks,
            block_size: BLOCK,
            kv_heads: self.kv_heads,
            d: self.head_dim,
        }
    }

    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len;
    }
}
