//! The KV cache in fixed-size blocks: per layer one pool `[num_blocks, BLOCK, kv_heads, d]`
//! ([`KvStore`]) and, per sequence, a block table mapping position p to block
//! `table[p / BLOCK]`.
//!
//! The store knows nothing of who owns which block: a single generation owns all of a
//! [`KvCache`] (its own free list and table), while the batching engine shares one store
//! between many sequences through its block manager (reference counts, prefix caching).
//! Attention reads the blocks through the varlen kernel: decode rows in place, prefill
//! chunks through one contiguous gather for the flash kernel.
//!
//! Values are stored as f32 (exact), f16 or q8 ([`KvDtype`]). Past a few hundred
//! positions decode attention reads more bytes than any weight matrix (2·kv_dim·4 bytes
//! per position and layer, 1.5 KiB for SmolLM2), so f16 halves the largest decode cost;
//! its 11-bit significand keeps keys and values to 2⁻¹² relative, as llama.cpp's
//! default. q8 halves it again: int8 codes with one f32 scale per position and KV head
//! (absmax/127, so each value is within 1/254 of its row's largest), the cache
//! llama.cpp's `-ctk/-ctv q8_0` and vLLM's 8-bit caches offer; it is opt-in because it
//! changes the model's numerics more than f16 does.

use crate::{Error, Result};
use half::f16;
use half::slice::HalfFloatSliceExt;
use tessera_core::{Element, Isa, TensorView, TensorViewMut};
use tessera_kernels::ops::paged_attention::PagedKvCache;
use tessera_kernels::ops::varlen_attention::{varlen_attention, VarlenParams, VarlenSeqs};
use tessera_kernels::simd::prefetch_for_write;

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
    /// A quarter of f32's bytes (plus a scale per row): int8 codes, one f32 scale per
    /// position and KV head.
    Q8,
}

impl std::str::FromStr for KvDtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            "q8" => Ok(KvDtype::Q8),
            _ => Err(Error::Model(format!(
                "KV cache type '{s}' (f32, f16 or q8)"
            ))),
        }
    }
}

impl KvDtype {
    /// Bytes of one position's keys (or values) in one layer, scales included.
    pub fn row_bytes(self, shape: KvShape) -> usize {
        match self {
            KvDtype::F32 => 4 * shape.kv_dim(),
            KvDtype::F16 => 2 * shape.kv_dim(),
            KvDtype::Q8 => shape.kv_dim() + 4 * shape.kv_heads,
        }
    }
}

/// A storage element: rows convert from f32 on the way in.
trait KvElem: Element {
    /// Whether rows are codes with one scale per `d` values.
    const SCALED: bool = false;
    /// Stores `src`; a scaled type also writes one scale per `d` values into `scales`.
    fn store(dst: &mut [Self], src: &[f32], scales: &mut [f32], d: usize);
    /// `n` zeros from the allocator's zeroed pages (`calloc`): a large pool costs memory
    /// only where blocks are written, so a generous budget is free until used.
    fn zeroed(n: usize) -> Vec<Self>;
}

impl KvElem for f32 {
    fn store(dst: &mut [f32], src: &[f32], _: &mut [f32], _: usize) {
        dst.copy_from_slice(src);
    }
    fn zeroed(n: usize) -> Vec<f32> {
        vec![0.0; n] // the standard library allocates zeroed floats with alloc_zeroed
    }
}

impl KvElem for f16 {
    fn store(dst: &mut [f16], src: &[f32], _: &mut [f32], _: usize) {
        dst.convert_from_f32_slice(src);
    }
    fn zeroed(n: usize) -> Vec<f16> {
        let mut bits = std::mem::ManuallyDrop::new(vec![0u16; n]);
        let (ptr, len, cap) = (bits.as_mut_ptr(), bits.len(), bits.capacity());
        // SAFETY: f16 is a repr(transparent) u16 (same size and alignment), so the
        // allocation is valid as `cap` f16s and every bit pattern (here 0 = +0.0) is an
        // f16; ManuallyDrop hands ownership over without a double free.
        unsafe { Vec::from_raw_parts(ptr.cast::<f16>(), len, cap) }
    }
}

/// int8 codes of each `d`-wide row against its absolute maximum: scale = max|x|/127,
/// code = x/scale rounded to nearest (even), so every value is within scale/2 of
/// code·scale, give or take f32 rounding (under 3·10⁻⁵ of a step). An all-zero row
/// gets scale 0 (codes 0); a non-finite value makes the scale NaN, so attention over it
/// yields NaN as an f32 or f16 cache's would, never a silent number.
impl KvElem for i8 {
    const SCALED: bool = true;
    fn store(dst: &mut [i8], src: &[f32], scales: &mut [f32], d: usize) {
        const ROUND: f32 = 12_582_912.0; // 1.5·2²³: its ulp is 1
        for ((row, x), scale) in dst.chunks_exact_mut(d).zip(src.chunks_exact(d)).zip(scales) {
            // Written to vectorize on the crate's baseline ISA (SSE2 on x86, where
            // `round` and `round_ties_even` are libm calls per element): a max over |x|
            // as bits (NaN and inf, exponent all ones, compare above every finite
            // value), then codes rounded to nearest even by adding and removing 1.5·2²³
            // (exact for |y| ≤ 127), converted by truncation of a whole number. Host C,
            // `bench-serve --requests 4 --concurrency 4 --prompt-tokens 1024 --profile
            // F`: a prefill's q8 writes took 2.7 µs per position with `round`, 0.86 so,
            // f16's 0.65.
            let top = x
                .iter()
                .fold(0u32, |m, &v| m.max(v.to_bits() & 0x7FFF_FFFF));
            let max = if top < 0x7F80_0000 {
                f32::from_bits(top)
            } else {
                f32::NAN
            };
            *scale = max / 127.0;
            let inv = if max > 0.0 { 127.0 / max } else { 0.0 };
            row.iter_mut()
                .zip(x)
                .for_each(|(c, &v)| *c = ((v * inv + ROUND) - ROUND) as i32 as i8);
        }
    }
    fn zeroed(n: usize) -> Vec<i8> {
        vec![0; n] // vec! of zero bytes allocates zeroed
    }
}

/// Per layer, a pool of keys and one of values, `per` elements each (zeroed lazily by
/// the allocator, [`KvElem::zeroed`]), and for a scaled type their scales, one per
/// `d` elements.
#[derive(Debug)]
struct Pool<T: Element> {
    k: Vec<Vec<T>>,
    v: Vec<Vec<T>>,
    ks: Vec<Vec<f32>>,
    vs: Vec<Vec<f32>>,
    d: usize,
}

impl<T: KvElem> Pool<T> {
    fn new(layers: usize, per: usize, d: usize) -> Result<Self> {
        let zeroed = || -> Vec<Vec<T>> { (0..layers).map(|_| T::zeroed(per)).collect() };
        let rows = if T::SCALED { per / d.max(1) } else { 0 };
        let scales = || -> Vec<Vec<f32>> { (0..layers).map(|_| vec![0.0; rows]).collect() };
        Ok(Pool {
            k: zeroed(),
            v: zeroed(),
            ks: scales(),
            vs: scales(),
            d,
        })
    }
    /// Asks for the cache lines of `len` elements at `at` of `layer`'s keys and values
    /// (and their scales) ready for writing ([`prefetch_for_write`]).
    /// Elements outside the pool (a block id `write` would reject) are skipped.
    fn prefetch_for_write(&mut self, layer: usize, at: usize, len: usize) {
        for pool in [&mut self.k, &mut self.v] {
            if let Some(x) = pool.get_mut(layer).and_then(|l| l.get_mut(at..at + len)) {
                prefetch_for_write(x);
            }
        }
        let rows = at / self.d.max(1)..(at + len) / self.d.max(1);
        for pool in [&mut self.ks, &mut self.vs] {
            if let Some(x) = pool.get_mut(layer).and_then(|l| l.get_mut(rows.clone())) {
                prefetch_for_write(x);
            }
        }
    }
    /// Stores one position's K and V rows at element offset `at` of `layer`.
    fn write(&mut self, layer: usize, at: usize, kr: &[f32], vr: &[f32]) {
        let rows = |len: usize| {
            if T::SCALED {
                at / self.d..(at + len) / self.d
            } else {
                0..0
            }
        };
        let (kx, vx) = (rows(kr.len()), rows(vr.len()));
        T::store(
            &mut self.k[layer][at..at + kr.len()],
            kr,
            &mut self.ks[layer][kx],
            self.d,
        );
        T::store(
            &mut self.v[layer][at..at + vr.len()],
            vr,
            &mut self.vs[layer][vx],
            self.d,
        );
    }
    /// `layer`'s keys and values as the kernels take them.
    fn view(&self, layer: usize, num_blocks: usize, kv_heads: usize) -> PagedKvCache<'_, T> {
        PagedKvCache {
            k: &self.k[layer],
            v: &self.v[layer],
            k_scales: &self.ks[layer],
            v_scales: &self.vs[layer],
            num_blocks,
            block_size: BLOCK,
            kv_heads,
            d: self.d,
        }
    }
}

#[derive(Debug)]
enum Pools {
    F32(Pool<f32>),
    F16(Pool<f16>),
    Q8(Pool<i8>),
}

/// Runs `$e` with `$p` bound to the pool, whichever element type it stores.
macro_rules! with_pool {
    ($pools:expr, $p:ident => $e:expr) => {
        match $pools {
            Pools::F32($p) => $e,
            Pools::F16($p) => $e,
            Pools::Q8($p) => $e,
        }
    };
}

/// Longest run of positions whose KV lines [`KvStore::prefetch_for_write`] asks for.
const PREFETCH_RUN: usize = 4;

/// Largest store the constructor allocates (keys and values, every layer): beyond it a
/// request is an error instead of an allocation failure.
pub const MAX_BYTES: usize = 64 << 30;

/// The blocks of keys and values of every layer, shared by whoever holds block ids.
#[derive(Debug)]
pub struct KvStore {
    kv_dim: usize,
    kv_heads: usize,
    pools: Pools,
    num_blocks: usize,
}

/// The block tables and lengths of one step's sequences in the varlen kernel's flat
/// form, built once per step and shared by every layer.
#[derive(Debug)]
pub(crate) struct StepTables {
    tables: Vec<u32>,
    max_blocks: usize,
    /// Cached length of each sequence once the step's keys are in.
    pub lens: Vec<usize>,
    /// Query rows of each sequence in the step.
    pub q_lens: Vec<usize>,
}

impl StepTables {
    /// From each sequence's (block table, context after the step, rows in the step).
    pub fn new<'a>(seqs: impl ExactSizeIterator<Item = (&'a [u32], usize, usize)> + Clone) -> Self {
        let max_blocks = seqs.clone().map(|s| s.1.div_ceil(BLOCK)).max().unwrap_or(0);
        let n = seqs.len();
        let mut t = StepTables {
            tables: vec![0u32; n * max_blocks],
            max_blocks,
            lens: Vec::with_capacity(n),
            q_lens: Vec::with_capacity(n),
        };
        for (i, (table, context, queries)) in seqs.enumerate() {
            let b = context.div_ceil(BLOCK);
            t.tables[i * max_blocks..][..b].copy_from_slice(&table[..b]);
            t.lens.push(context);
            t.q_lens.push(queries);
        }
        t
    }

    fn seqs(&self) -> VarlenSeqs<'_> {
        VarlenSeqs {
            block_tables: &self.tables,
            max_blocks: self.max_blocks,
            context_lens: &self.lens,
            q_lens: &self.q_lens,
        }
    }
}

/// What a cache needs to know of a model: three numbers, not its whole configuration
/// (a model's `Config` converts into one, so the cache does not depend on the model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    /// Transformer layers, each with its own keys and values.
    pub layers: usize,
    /// Key/value heads per layer.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl KvShape {
    /// Width of one position's keys (or values) in one layer.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

impl KvStore {
    /// Bytes one block takes over every layer (keys and values).
    pub fn block_bytes(shape: impl Into<KvShape>, dtype: KvDtype) -> usize {
        let cfg = shape.into();
        2 * cfg.layers * BLOCK * dtype.row_bytes(cfg)
    }

    /// A store of `num_blocks` blocks for a model of this shape.
    pub fn new(shape: impl Into<KvShape>, num_blocks: usize, dtype: KvDtype) -> Result<Self> {
        let cfg = shape.into();
        if cfg.kv_heads == 0 || cfg.head_dim == 0 {
            return Err(Error::Model(format!(
                "KV cache for {} KV heads of width {}: both must be positive",
                cfg.kv_heads, cfg.head_dim
            )));
        }
        let per = (num_blocks * BLOCK).checked_mul(cfg.kv_dim());
        let total = num_blocks.checked_mul(Self::block_bytes(cfg, dtype));
        let per = per
            .filter(|_| total.is_some_and(|t| t <= MAX_BYTES))
            .ok_or_else(|| {
                Error::Model(format!(
                    "KV cache of {num_blocks} blocks of {BLOCK} positions is too large (over {} GiB)",
                    MAX_BYTES >> 30
                ))
            })?;
        let too_big = |e: Error| Error::Model(format!("KV cache of {num_blocks} blocks: {e}"));
        let d = cfg.head_dim;
        Ok(KvStore {
            kv_dim: cfg.kv_dim(),
            kv_heads: cfg.kv_heads,
            pools: match dtype {
                KvDtype::F32 => Pools::F32(Pool::new(cfg.layers, per, d).map_err(too_big)?),
                KvDtype::F16 => Pools::F16(Pool::new(cfg.layers, per, d).map_err(too_big)?),
                KvDtype::Q8 => Pools::Q8(Pool::new(cfg.layers, per, d).map_err(too_big)?),
            },
            num_blocks,
        })
    }

    /// Blocks in the store.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// How keys and values are stored.
    pub fn dtype(&self) -> KvDtype {
        match self.pools {
            Pools::F32(..) => KvDtype::F32,
            Pools::F16(..) => KvDtype::F16,
            Pools::Q8(..) => KvDtype::Q8,
        }
    }

    /// Checks that `table` has blocks for positions `0..len`, all inside the store.
    pub(crate) fn check_table(&self, table: &[u32], len: usize) -> Result<()> {
        let blocks = len.div_ceil(BLOCK);
        if blocks > table.len() {
            return Err(Error::Model(format!(
                "block table of {} blocks for {len} positions",
                table.len()
            )));
        }
        if let Some(b) = table[..blocks]
            .iter()
            .find(|&&b| b as usize >= self.num_blocks)
        {
            return Err(Error::Model(format!(
                "block id {b} ≥ {} blocks",
                self.num_blocks
            )));
        }
        Ok(())
    }

    /// Asks for the cache lines that [`KvStore::write`] of `n` positions from `pos0`
    /// will store into, ready for writing, where `n` ≤ [`PREFETCH_RUN`]. A decode step
    /// writes one position per sequence, each into its own block of a pool that left
    /// the caches since the last step; the plain stores waited on their lines a few at
    /// a time (perf of the 16-stream step: 91% of the store loop's samples on its
    /// stores). Asked for every sequence before the layer's q/k/v matmul, the lines
    /// arrive while it runs: host C (Zen 4), `bench-serve --requests 16 --concurrency
    /// 16 --prompt-tokens 128 --gen-tokens 128 --acts int8 --profile`, 3 alternated
    /// runs: the writes 637–721 µs a step without, 515–593 prefetched just before the
    /// stores, 373–478 before the matmul. Longer runs (prefill chunks) store whole
    /// blocks in order, which the hardware prefetchers follow.
    pub(crate) fn prefetch_for_write(
        &mut self,
        layer: usize,
        table: &[u32],
        pos0: usize,
        n: usize,
    ) {
        if n > PREFETCH_RUN {
            return;
        }
        let kd = self.kv_dim;
        for pos in pos0..pos0 + n {
            // A hint: a position past the table (which `write` would reject) asks for
            // nothing.
            let Some(&block) = table.get(pos / BLOCK) else {
                return;
            };
            let at = (block as usize * BLOCK + pos % BLOCK) * kd;
            with_pool!(&mut self.pools, p => p.prefetch_for_write(layer, at, kd));
        }
    }

    /// Stores rows of K and V (`[n, kv_dim]`) for positions `pos0..pos0+n` of `layer`,
    /// through `table` (checked by [`KvStore::check_table`]).
    pub(crate) fn write(&mut self, layer: usize, table: &[u32], pos0: usize, k: &[f32], v: &[f32]) {
        let kd = self.kv_dim;
        for (i, (kr, vr)) in k.chunks_exact(kd).zip(v.chunks_exact(kd)).enumerate() {
            let pos = pos0 + i;
            let at = (table[pos / BLOCK] as usize * BLOCK + pos % BLOCK) * kd;
            with_pool!(&mut self.pools, p => p.write(layer, at, kr, vr));
        }
    }

    /// Attention of every sequence's query rows (`q`, `[total, heads, d]`, sequences in
    /// order) over its cached positions in `layer`, causal.
    pub(crate) fn attend(
        &self,
        layer: usize,
        step: &StepTables,
        q: &TensorView<'_, f32>,
        out: &mut TensorViewMut<'_, f32>,
        params: VarlenParams,
    ) -> Result<()> {
        let vs = step.seqs();
        let isa = Isa::best();
        with_pool!(&self.pools, p => {
            let view = p.view(layer, self.num_blocks, self.kv_heads);
            varlen_attention(isa, q, &view, &vs, out, params)?
        });
        Ok(())
    }
}

/// The cache of one sequence: a store it owns whole, its free list and block table.
#[derive(Debug)]
pub struct KvCache {
    store: KvStore,
    free: Vec<u32>,
    table: Vec<u32>,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// An exact (f32) cache for one sequence of up to `capacity` positions.
    pub fn new(shape: impl Into<KvShape>, capacity: usize) -> Result<Self> {
        Self::with_dtype(shape, capacity, KvDtype::F32)
    }

    /// A cache storing keys and values as `dtype`.
    pub fn with_dtype(shape: impl Into<KvShape>, capacity: usize, dtype: KvDtype) -> Result<Self> {
        let num_blocks = capacity.div_ceil(BLOCK);
        let store = KvStore::new(shape, num_blocks, dtype).map_err(|_| {
            Error::Model(format!(
                "KV cache of {capacity} positions is too large (over {} GiB)",
                MAX_BYTES >> 30
            ))
        })?;
        Ok(KvCache {
            store,
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
    /// Whether no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Positions it can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// How keys and values are stored.
    pub fn dtype(&self) -> KvDtype {
        self.store.dtype()
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

    /// The store and the sequence's block table, borrowed together for a forward.
    pub(crate) fn parts(&mut self) -> (&mut KvStore, &[u32]) {
        (&mut self.store, &self.table)
    }

    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Write prefetches are hints: over written positions the pools read back as they
    /// were, and positions past the block table, block ids past the pool and layers
    /// past the store (which `write` would reject) ask for nothing instead of panicking.
    #[test]
    fn write_prefetches_change_nothing_and_never_panic() {
        let shape = KvShape {
            layers: 2,
            kv_heads: 2,
            head_dim: 8,
        };
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Q8] {
            let mut store = KvStore::new(shape, 3, dtype).unwrap();
            let kd = shape.kv_dim();
            let k: Vec<f32> = (0..2 * kd).map(|i| i as f32 * 0.25 - 3.0).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            let table = [2u32, 0];
            store.write(1, &table, 15, &k, &v);
            let before = format!("{:?}", store.pools);
            store.prefetch_for_write(1, &table, 15, 2);
            store.prefetch_for_write(0, &table, 30, 4);
            store.prefetch_for_write(1, &[7], 0, 1);
            store.prefetch_for_write(5, &table, 0, 1);
            assert_eq!(format!("{:?}", store.pools), before, "{dtype:?}");
        }
    }

    /// Steps by which f32 arithmetic may move a q8 code past half a step: 127/max, the
    /// product x·(127/max) and the stored scale max/127 are each rounded once, and each
    /// rounding moves a value of at most 127 steps by at most 127·2⁻²⁴ (a fourth for the
    /// second-order terms): 2.3·10⁻⁵ steps in all.
    const F32_SLACK: f64 = 4.0 * 127.0 / (1u64 << 24) as f64;

    /// A q8 store keeps every value within half a step (its row's absmax/254, plus
    /// [`F32_SLACK`]) of what was written, read through the kernels' view: codes times
    /// scale, computed here in f64 from the stored parts. Zero rows store zeros; a NaN
    /// poisons its row's scale.
    #[test]
    fn q8_rows_come_back_within_half_a_step() {
        let shape = KvShape {
            layers: 2,
            kv_heads: 3,
            head_dim: 64,
        };
        let (kd, d) = (shape.kv_dim(), shape.head_dim);
        let mut store = KvStore::new(shape, 4, KvDtype::Q8).unwrap();
        assert_eq!(store.dtype(), KvDtype::Q8);
        assert_eq!(
            KvStore::block_bytes(shape, KvDtype::Q8),
            2 * 2 * BLOCK * (kd + 12)
        );
        let seed: u64 = rand::random();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
        let n = 20;
        // Rows of very different magnitudes, so one scale per row matters.
        let rows: Vec<f32> = (0..2 * n * kd)
            .map(|i| {
                let mag = 10f32.powi((i / d % 5) as i32 - 2);
                rand::Rng::random_range(&mut rng, -mag..mag)
            })
            .collect();
        let (k, v) = rows.split_at(n * kd);
        let table = [3u32, 1];
        store.write(1, &table, 0, k, v);
        let Pools::Q8(pool) = &store.pools else {
            panic!("q8 pools")
        };
        let view = pool.view(1, 4, shape.kv_heads);
        for (want, codes, scales) in [(k, view.k, view.k_scales), (v, view.v, view.v_scales)] {
            for pos in 0..n {
                let at = (table[pos / BLOCK] as usize * BLOCK + pos % BLOCK) * kd;
                for h in 0..shape.kv_heads {
                    let row = &want[pos * kd + h * d..][..d];
                    let max = row.iter().fold(0f64, |m, &x| m.max((x as f64).abs()));
                    let scale = scales[(at + h * d) / d] as f64;
                    assert!((scale - max / 127.0).abs() <= 1e-6 * max, "seed {seed}");
                    for (x, &w) in row.iter().enumerate() {
                        let got = codes[at + h * d + x] as f64 * scale;
                        let err = (got - w as f64).abs();
                        assert!(
                            err <= scale * (0.5 + F32_SLACK),
                            "seed {seed}: {got} vs {w}"
                        );
                    }
                }
            }
        }
        let mut zero_nan = vec![0f32; 2 * kd];
        zero_nan[kd + 5] = f32::NAN;
        store.write(0, &table, 0, &zero_nan, &zero_nan);
        let Pools::Q8(pool) = &store.pools else {
            panic!("q8 pools")
        };
        let view = pool.view(0, 4, shape.kv_heads);
        let first = table[0] as usize * BLOCK * kd;
        assert!(view.k[first..first + kd].iter().all(|&c| c == 0));
        assert_eq!(view.k_scales[first / d], 0.0, "a zero row's scale");
        let nan_row = (first + kd + 5) / d;
        assert!(view.k_scales[nan_row].is_nan(), "a NaN must not vanish");
        assert_eq!(view.k_scales[nan_row + 1], 0.0, "only its own row");
        let empty = KvShape {
            head_dim: 0,
            ..shape
        };
        assert!(
            KvStore::new(empty, 4, KvDtype::Q8).is_err(),
            "zero-width heads"
        );
    }
}
