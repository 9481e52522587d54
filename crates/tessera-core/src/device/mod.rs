//! The interface every accelerator backend implements, and the table of installed ones.
//!
//! Why it lives in the core crate: the registry (in `tessera-kernels`) must run an op's
//! device variants, and the backends (`tessera-wgpu`, `tessera-cuda`) must not depend on
//! the CPU kernels. Both depend on this module instead; the top of the stack (the CLI,
//! the Python package) installs whichever backends it was built with and found a device
//! for. A backend keeps its buffers opaque ([`DeviceBuffer`]); the registry uploads the
//! same inputs the CPU variants see, runs a [`DeviceCall`] (timed) and downloads the
//! output (untimed), so every backend is verified against the same float64 references.

pub mod blocks;
pub mod checks;

use crate::{DType, Error, Result};
use std::any::Any;
use std::fmt;
use std::sync::{Arc, RwLock};

/// Which accelerator API a device is driven through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// Vulkan, Metal or DX12 through the `wgpu` crate (WGSL kernels).
    Wgpu,
    /// NVIDIA GPUs through the CUDA driver API (kernels compiled by NVRTC).
    Cuda,
}

impl DeviceKind {
    /// The lower-case name used on the command line and in variant labels.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Wgpu => "wgpu",
            DeviceKind::Cuda => "cuda",
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Memory on a device, owned by the backend that made it (downcast with [`Self::get`]).
pub struct DeviceBuffer {
    len: usize,
    inner: Box<dyn Any + Send + Sync>,
}

impl DeviceBuffer {
    /// Wraps a backend's buffer holding `len` elements (f32 elements, or whatever unit
    /// the backend documents for packed weights).
    pub fn new(len: usize, inner: impl Any + Send + Sync) -> Self {
        DeviceBuffer {
            len,
            inner: Box::new(inner),
        }
    }
    /// Elements the buffer holds.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The backend's own buffer type, or an error naming the mismatch (a buffer from
    /// another backend).
    pub fn get<T: Any>(&self) -> Result<&T> {
        self.inner.downcast_ref().ok_or_else(|| {
            Error::Device(format!(
                "buffer is not a {} (another backend's, or another element type)",
                std::any::type_name::<T>()
            ))
        })
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer({} elements)", self.len)
    }
}

/// A row-wise op a device runs over `rows` contiguous rows of `n` f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowOp {
    /// `x/√(mean(x²)+eps)·γ` (γ passed as the call's parameter buffer).
    RmsNorm {
        /// Added to the mean square.
        eps: f32,
    },
    /// Stable softmax.
    Softmax,
    /// `silu(gate)·up` (two inputs).
    SwiGlu,
    /// `a + b` (two inputs): the residual stream's add.
    Add,
    /// Rotary position embedding of rows `[tokens·heads, d]` (row r is head r % heads of
    /// token r / heads). The parameter buffer holds the table: every token's `d/2`
    /// cosines, then every token's `d/2` sines (angles computed in f64 by the host).
    Rope {
        /// Heads per token.
        heads: usize,
        /// Pairs `(xᵢ, xᵢ₊d/2)` (HF/NeoX) instead of `(x₂ᵢ, x₂ᵢ₊₁)` (GGUF Llama).
        half_split: bool,
    },
}

impl RowOp {
    /// The registry name of the op.
    pub fn name(self) -> &'static str {
        match self {
            RowOp::RmsNorm { .. } => "rms_norm",
            RowOp::Softmax => "softmax",
            RowOp::SwiGlu => "swiglu",
            RowOp::Add => "add",
            RowOp::Rope {
                half_split: false, ..
            } => "rope",
            RowOp::Rope {
                half_split: true, ..
            } => "rope_neox",
        }
    }
    /// Input streams the op reads.
    pub fn inputs(self) -> usize {
        match self {
            RowOp::SwiGlu | RowOp::Add => 2,
            _ => 1,
        }
    }
}

/// A rank-3 f32 view into a device buffer: `[batch, rows, cols]` with element strides,
/// so transposed, padded and batched operands are expressed as on the CPU.
#[derive(Clone, Copy, Debug)]
pub struct DeviceMatrix<'a> {
    /// The buffer.
    pub buf: &'a DeviceBuffer,
    /// Element offset of `[0, 0, 0]`.
    pub offset: usize,
    /// Element strides of batch, row and column.
    pub strides: [usize; 3],
}

impl DeviceMatrix<'_> {
    /// The largest element index the view reaches for dims `[batch, rows, cols]`, plus
    /// one: what the buffer must hold.
    pub fn span(&self, dims: [usize; 3]) -> usize {
        if dims.contains(&0) {
            return 0;
        }
        self.offset
            + (0..3)
                .map(|i| (dims[i] - 1) * self.strides[i])
                .sum::<usize>()
            + 1
    }

    /// An error unless the buffer holds every element of the view.
    pub fn check(&self, op: &'static str, name: &str, dims: [usize; 3]) -> Result<()> {
        let need = self.span(dims);
        if need > self.buf.len() {
            return Err(Error::shape(
                op,
                format!(
                    "{name} view {dims:?} reaches element {need} of a {}-element buffer",
                    self.buf.len()
                ),
            ));
        }
        Ok(())
    }
}

/// One kernel launch on a device. Shapes are checked by the backend against its buffers.
#[derive(Debug)]
pub enum DeviceCall<'a> {
    /// A row-wise op over `rows × n` contiguous rows.
    Rows {
        /// Which op.
        op: RowOp,
        /// Its input streams, each `rows·n` f32.
        inputs: &'a [&'a DeviceBuffer],
        /// The op's parameter buffer: γ of `n` for RMSNorm, the cos/sin table for RoPE.
        gamma: Option<&'a DeviceBuffer>,
        /// `rows·n` f32 out, from element `out_offset` on.
        out: &'a DeviceBuffer,
        /// Where in `out` the rows start (0 but for an engine writing rotated keys
        /// straight into its cache at their positions).
        out_offset: usize,
        /// Rows.
        rows: usize,
        /// Row length.
        n: usize,
    },
    /// `C = α·A·B + β·C` over `batch` f32 matrices (A `[m,k]`, B `[k,n]`, C `[m,n]`).
    Gemm {
        /// A.
        a: DeviceMatrix<'a>,
        /// B.
        b: DeviceMatrix<'a>,
        /// C (read when β ≠ 0).
        c: DeviceMatrix<'a>,
        /// `[batch, m, n, k]`.
        dims: [usize; 4],
        /// Scale of A·B.
        alpha: f32,
        /// Scale of the old C (0: C is not read).
        beta: f32,
    },
    /// `y[m, n] = x[m, k]·Wᵀ`, W uploaded by [`Device::upload_blocks`].
    QMatmul {
        /// The quantized weights.
        w: &'a DeviceBuffer,
        /// Activations `[1, m, k]`.
        x: DeviceMatrix<'a>,
        /// Output `[1, m, n]`.
        y: DeviceMatrix<'a>,
        /// Activation rows.
        m: usize,
    },
    /// Attention over a paged KV cache: decode rows and prefill chunks of many sequences.
    PagedAttention(PagedCall<'a>),
    /// Dense attention with every operand at 16 bits: the tensor-core prefill form.
    FlashAttention(FlashCall<'a>),
    /// `out[i, :] = table[ids[i], :]`: rows of a `[vocab, dim]` table gathered by token
    /// id. The ids stay on the host (they change every step); every one must be < vocab.
    Embedding {
        /// The table, viewed as `[1, vocab, dim]`.
        table: DeviceMatrix<'a>,
        /// Rows of the table.
        vocab: usize,
        /// Width of a row.
        dim: usize,
        /// Token ids.
        ids: &'a [u32],
        /// `ids.len()·dim` f32 out, contiguous rows.
        out: &'a DeviceBuffer,
    },
}

/// One attention launch over a paged KV cache. Sequence `s` has `q_lens[s]` query rows
/// (1 for a decode, a chunk for a prefill), its last positions: with `causal`, row i
/// attends to the cached positions `0 ..= context_lens[s] − q_lens[s] + i`, else to all
/// of them; a `window` keeps only the most recent that many. Positions are read through
/// the sequence's block table (a dense `[len, kv_heads, d]` K/V is one block of `len`);
/// GQA when `heads` is a multiple of `kv_heads`. The tables and lengths stay on the host
/// (a step changes them every call); the backend ships them with the launch.
#[derive(Debug)]
pub struct PagedCall<'a> {
    /// Queries `[Σ q_lens, heads, d]`, sequences in order.
    pub q: &'a DeviceBuffer,
    /// Keys `[num_blocks, block_size, kv_heads, d]`.
    pub k: &'a DeviceBuffer,
    /// Values, laid out as the keys.
    pub v: &'a DeviceBuffer,
    /// Output, laid out as the queries.
    pub out: &'a DeviceBuffer,
    /// The sequences and the call's shape.
    pub shape: PagedShape<'a>,
}

/// What a [`PagedCall`] runs besides its buffers: the sequences, their block tables and
/// the attention's shape. Backends check all of it against the buffers.
#[derive(Clone, Copy, Debug)]
pub struct PagedShape<'a> {
    /// Sequence s's block ids are `block_tables[s·max_blocks..][..max_blocks]`.
    pub block_tables: &'a [u32],
    /// Width of a block-table row.
    pub max_blocks: usize,
    /// Each sequence's cached length (≥ 1), its new rows included.
    pub context_lens: &'a [usize],
    /// Each sequence's query rows (1 ≤ q_len ≤ its context).
    pub q_lens: &'a [usize],
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub d: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Multiplies the scores (usually 1/√d).
    pub scale: f32,
    /// Each row sees positions up to its own (bottom-right aligned), not the whole context.
    pub causal: bool,
    /// Each row sees at most this many of its most recent visible positions.
    pub window: Option<usize>,
}

/// Dense attention over one sequence whose queries, keys, values and output are all
/// 16-bit floats of one type (buffers from [`Device::upload_half`]): Q and O
/// `[q_len, heads, d]`, K and V `[kv_len, kv_heads, d]`, contiguous. A separate call
/// from [`PagedCall`] (f32 queries and output) because its kernels round differently:
/// the probabilities are rounded to the input type before P·V and the output is stored
/// at 16 bits, so its results carry that type's precision, not f32's.
#[derive(Debug)]
pub struct FlashCall<'a> {
    /// Queries.
    pub q: &'a DeviceBuffer,
    /// Keys.
    pub k: &'a DeviceBuffer,
    /// Values.
    pub v: &'a DeviceBuffer,
    /// Output.
    pub out: &'a DeviceBuffer,
    /// The call's shape.
    pub shape: FlashShape,
}

/// The shape of a [`FlashCall`]; GQA when `heads` is a multiple of `kv_heads`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlashShape {
    /// Query rows.
    pub q_len: usize,
    /// Key/value rows.
    pub kv_len: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub d: usize,
    /// Multiplies the scores (usually 1/√d).
    pub scale: f32,
    /// Row i sees keys `0 ..= i + kv_len − q_len` (bottom-right aligned; then
    /// `q_len ≤ kv_len`, so every row sees one), else all.
    pub causal: bool,
}

/// The op name [`Device::supports`] answers for [`DeviceCall::FlashAttention`].
pub const FLASH_ATTENTION_OP: &str = "flash_attention";

/// An accelerator: memory management and kernel launches.
pub trait Device: Send + Sync {
    /// The API it is driven through.
    fn kind(&self) -> DeviceKind;
    /// The adapter or GPU name, for reports.
    fn name(&self) -> String;
    /// Whether the backend has a kernel for registry op `op` on `dtype` inputs.
    fn supports(&self, op: &str, dtype: DType) -> bool;
    /// Copies f32 data to a new device buffer.
    fn upload(&self, data: &[f32]) -> Result<DeviceBuffer>;
    /// Copies 16-bit floats (`dtype` F16 or BF16, as raw bits) to a new device buffer,
    /// kept at 16 bits: operands of the calls that read half-precision storage (GEMM).
    fn upload_half(&self, dtype: DType, bits: &[u16]) -> Result<DeviceBuffer>;
    /// Uploads a `[rows, cols]` matrix stored in the ggml block format `format` (its
    /// raw blocks, row-major), in whatever layout the backend's matmul reads. `format`
    /// I8 is per-channel INT8 in the layout [`blocks::split_int8`] reads.
    fn upload_blocks(
        &self,
        format: DType,
        rows: usize,
        cols: usize,
        blocks: &[u8],
    ) -> Result<DeviceBuffer>;
    /// Overwrites a buffer made by [`Device::upload`] with `data` (same length); a
    /// backend whose calls write 16-bit outputs also takes buffers from
    /// [`Device::upload_half`], rounding `data` to their type.
    fn write(&self, buf: &DeviceBuffer, data: &[f32]) -> Result<()>;
    /// Copies an f32 buffer back (a 16-bit one widened, where [`Device::write`] takes it).
    fn download(&self, buf: &DeviceBuffer) -> Result<Vec<f32>>;
    /// Launches one call and waits until it has finished.
    fn run(&self, call: &DeviceCall<'_>) -> Result<()>;
    /// Checks and launches one call without waiting for it where the backend can queue
    /// (calls run in order; [`Device::download`] waits for those before it): what a
    /// forward pass of many calls uses. By default, [`Device::run`].
    fn enqueue(&self, call: &DeviceCall<'_>) -> Result<()> {
        self.run(call)
    }
}

static INSTALLED: RwLock<Vec<Arc<dyn Device>>> = RwLock::new(Vec::new());

/// Makes a device available to the registry and the engine (replacing an installed
/// device of the same kind).
pub fn install(device: Arc<dyn Device>) {
    let mut all = INSTALLED.write().unwrap_or_else(|e| e.into_inner());
    all.retain(|d| d.kind() != device.kind());
    all.push(device);
}

/// Every installed device.
pub fn installed() -> Vec<Arc<dyn Device>> {
    INSTALLED.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The installed device of one kind.
pub fn get(kind: DeviceKind) -> Option<Arc<dyn Device>> {
    installed().into_iter().find(|d| d.kind() == kind)
}
