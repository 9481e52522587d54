//! One launcher per kernel: checks every shape and buffer length against the typed
//! parameters (a clear [`CudaError::Shape`], never an out-of-bounds launch), picks the
//! grid, launches on the device's stream. Inputs that index memory (block tables,
//! token ids, context lengths) are taken on the host and validated before upload.

use crate::checks::{self, int};
use crate::{CudaError, Device};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use half::{bf16, f16};

/// The 16-bit float types the tensor-core kernels take.
pub trait Half16: DeviceRepr + Copy {
    /// Suffix of the kernel entry points (`bf16` / `f16`).
    const NAME: &'static str;
}
impl Half16 for bf16 {
    const NAME: &'static str = "bf16";
}
impl Half16 for f16 {
    const NAME: &'static str = "f16";
}

type Res = Result<(), CudaError>;

fn launch(what: &str, r: Result<Option<impl Sized>, cudarc::driver::DriverError>) -> Res {
    r.map(|_| ())
        .map_err(|e| CudaError::driver(format!("launch {what}"), e))
}

/// A 1-D block of `block` threads over `grid`, no dynamic shared memory.
pub(crate) fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per).min(u32::MAX as usize) as u32
}

/// `C[M, N] = alpha · A[M, K] · B[N, K]ᵀ`, all row-major and packed.
#[derive(Clone, Copy, Debug)]
pub struct GemmShape {
    /// Rows of A and C.
    pub m: usize,
    /// Rows of B, columns of C.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// Scale of the product.
    pub alpha: f32,
}

/// Tensor-core GEMM (`kernels/gemm.cu`); K must be a multiple of 8.
pub fn gemm<T: Half16>(
    dev: &Device,
    a: &CudaSlice<T>,
    b: &CudaSlice<T>,
    c: &mut CudaSlice<f32>,
    s: GemmShape,
) -> Res {
    const OP: &str = "cuda gemm";
    checks::gemm(&s, a.len(), b.len(), c.len())?;
    let (m, n, k) = (s.m as i32, s.n as i32, s.k as i32);
    let f = dev.function("gemm", &format!("gemm_{}_tn", T::NAME))?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(a).arg(b).arg(c).arg(&m).arg(&n).arg(&k);
    l.arg(&k).arg(&k).arg(&n).arg(&s.alpha);
    // SAFETY: argument types and order match gemm_*_tn; buffer lengths were checked
    // against the shape, which bounds every index the kernel forms.
    launch(OP, unsafe {
        l.launch(cfg((blocks(s.n, 128), blocks(s.m, 128), 1), 256))
    })
}

/// Attention problem: Q, O `[batch, sq, heads, d]`; K, V `[batch, sk, kv_heads, d]`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// Independent sequences.
    pub batch: usize,
    /// Query positions per sequence.
    pub sq: usize,
    /// Key/value positions per sequence.
    pub sk: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (dividing `heads`).
    pub kv_heads: usize,
    /// Head width.
    pub d: usize,
    /// Causal mask.
    pub causal: bool,
    /// Multiplies the scores (usually 1/√d).
    pub scale: f32,
}

/// FlashAttention-style forward (`kernels/flash_attention.cu`); d ∈ {64, 128}.
pub fn flash_attention<T: Half16>(
    dev: &Device,
    q: &CudaSlice<T>,
    k: &CudaSlice<T>,
    v: &CudaSlice<T>,
    o: &mut CudaSlice<T>,
    s: AttentionShape,
) -> Res {
    flash_launch(dev, T::NAME, [q, k, v, o], s)
}

/// [`flash_attention`] over buffers of any 2-byte element (the backend keeps 16-bit
/// data as raw bits), `name` the type's entry suffix (`bf16` / `f16`).
pub(crate) fn flash_launch<X: DeviceRepr>(
    dev: &Device,
    name: &str,
    [q, k, v, o]: [&CudaSlice<X>; 4],
    s: AttentionShape,
) -> Res {
    const OP: &str = "cuda attention";
    debug_assert_eq!(std::mem::size_of::<X>(), 2);
    checks::attention(&s, q.len(), k.len(), v.len(), o.len())?;
    let (sq, sk) = (s.sq as i32, s.sk as i32);
    let (heads, kvh) = (s.heads as i32, s.kv_heads as i32);
    let causal = s.causal as i32;
    let f = dev.function("flash_attention", &format!("flash_fwd_{name}_d{}", s.d))?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(q).arg(k).arg(v).arg(o).arg(&sq).arg(&sk);
    l.arg(&heads).arg(&kvh).arg(&s.scale).arg(&causal);
    let grid = (blocks(s.sq, 64), s.heads as u32, s.batch as u32);
    // SAFETY: types and order match flash_fwd_* (2-byte elements); lengths checked
    // against the shape.
    launch(OP, unsafe { l.launch(cfg(grid, 128)) })
}

/// Paged decode attention problem (cache layout as the CPU op's).
#[derive(Clone, Copy, Debug)]
pub struct PagedShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub d: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Multiplies the scores (usually 1/√d).
    pub scale: f32,
    /// Tokens per split; 0 chooses enough splits to fill the GPU.
    pub chunk: usize,
}

/// Decode attention over a paged bf16 KV cache (`kernels/paged_attention.cu`). One query
/// token per sequence: `q`, `out` `[seqs, heads, d]` f32; `tables` `[seqs, max_blocks]`
/// and `lens` on the host, validated, then uploaded.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    dev: &Device,
    q: &CudaSlice<f32>,
    k_cache: &CudaSlice<bf16>,
    v_cache: &CudaSlice<bf16>,
    tables: &[u32],
    lens: &[usize],
    out: &mut CudaSlice<f32>,
    s: PagedShape,
) -> Res {
    const OP: &str = "cuda paged attention";
    let lengths = (q.len(), k_cache.len(), v_cache.len(), out.len());
    let plan = checks::paged(&s, tables, lens, lengths)?;
    let (seqs, splits) = (plan.seqs, plan.splits);
    // The kernel's row table: each sequence's one query row sees its whole context
    // (every length was checked to fit the table and an int), then the block tables.
    let meta: Vec<u32> = (0..seqs)
        .flat_map(|r| [r as u32, 0, lens[r] as u32])
        .chain(tables.iter().copied())
        .collect();
    let d_meta = dev.upload(&meta)?;
    let parts = if splits > 1 {
        seqs * s.heads * splits
    } else {
        1
    };
    let mut part_ml = dev.zeros::<f32>(2 * parts)?;
    let mut part_acc = dev.zeros::<f32>(parts * s.d)?;
    let (rows, heads, kvh, d) = (
        int(OP, "sequences", seqs)?,
        int(OP, "heads", s.heads)?,
        int(OP, "kv heads", s.kv_heads)?,
        int(OP, "d", s.d)?,
    );
    let (bs, mb, ch) = (
        int(OP, "block size", s.block_size)?,
        int(OP, "blocks", plan.max_blocks)?,
        int(OP, "chunk", plan.chunk)?,
    );
    let f = dev.function("paged_attention", "paged_varlen_bf16")?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(q)
        .arg(k_cache)
        .arg(v_cache)
        .arg(&d_meta)
        .arg(&mut *out);
    l.arg(&mut part_ml)
        .arg(&mut part_acc)
        .arg(&rows)
        .arg(&heads);
    l.arg(&kvh).arg(&d).arg(&bs).arg(&mb).arg(&ch).arg(&s.scale);
    let grid = (seqs as u32, s.heads as u32, splits as u32);
    // SAFETY: types and order match paged_varlen_bf16; the cache, q, out and the
    // workspace hold what the shape implies; every table entry a length reaches was
    // checked to be a valid block id.
    launch(OP, unsafe { l.launch(cfg(grid, 128)) })?;
    if splits == 1 {
        return Ok(());
    }
    let f = dev.function("paged_attention", "paged_attention_combine")?;
    let mut l = dev.stream().launch_builder(&f);
    let splits32 = int(OP, "splits", splits)?;
    l.arg(&part_ml)
        .arg(&part_acc)
        .arg(out)
        .arg(&heads)
        .arg(&d)
        .arg(&splits32);
    let block = (s.d.div_ceil(32) * 32) as u32;
    // SAFETY: as above; the combine reads the workspace the first launch wrote.
    launch(OP, unsafe {
        l.launch(cfg((s.heads as u32, seqs as u32, 1), block))
    })
}

/// `y[N] = scale ⊙ (W[N, K] · x[K])` with per-channel INT8 weights; K a multiple of 4.
pub fn qmatvec_i8(
    dev: &Device,
    w: &CudaSlice<i8>,
    scales: &CudaSlice<f32>,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    (n, k): (usize, usize),
) -> Res {
    const OP: &str = "cuda qmatvec_i8";
    checks::qmatvec_i8((n, k), w.len(), scales.len(), x.len(), y.len())?;
    let (n32, k32) = (n as i32, k as i32);
    let (x_sr, y_sr, y_sc) = (k as i64, n as i64, 1i64);
    let f = dev.function("qmatvec", "qmatmul_i8_v4")?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(w).arg(scales).arg(x).arg(y).arg(&n32).arg(&k32);
    l.arg(&x_sr).arg(&y_sr).arg(&y_sc);
    // SAFETY: types and order match qmatmul_i8_v4 (one activation row: grid y = 1, x a
    // whole allocation, so 16-byte aligned); lengths checked.
    launch(OP, unsafe { l.launch(cfg((blocks(n, 8), 1, 1), 256)) })
}
