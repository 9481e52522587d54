//! [`CudaBackend`]: the CUDA device behind `tessera_core`'s [`Device`] interface, so its
//! kernels appear in the registry as `cuda` variants and are verified and benchmarked
//! by the same problems, float64 references and tolerances as the CPU and wgpu ones.
//!
//! Every call is checked on the host first, with the checks the wgpu backend uses
//! ([`tessera_core::device::checks`]): a bad call is an error, never a launch. Views
//! (offset and strides) reach the kernels as a pointer at the offset plus element
//! strides. Block-format weights are split on upload into code bytes and f16 scales
//! ([`tessera_core::device::blocks`]), the layout `kernels/qmatvec.cu` reads.
//!
//! GEMM takes the tensor-core kernel (`gemm_*_tn`) when the call fits it — 16-bit A and
//! B with K contiguous in both (B stored by output column), β = 0, 16-byte aligned rows
//! — and the strided CUDA-core kernel otherwise, so any view the registry draws runs.
//!
//! Paged attention keeps its device-side table and split workspace between calls
//! ([`PagedScratch`]): a forward pass makes the same call with the same tables in every
//! layer, and a fresh upload plus two zeroed allocations per layer cost more than the
//! decode kernel itself. Reuse is safe because the calls run in stream order and a
//! replaced buffer is freed in stream order too.

mod attention;

use crate::ops::{cfg, AttentionShape};
use crate::{CudaError, Device as Gpu};
use cudarc::driver::{CudaSlice, CudaView, PushKernelArg};
use half::{bf16, f16};
use tessera_core::device::{
    blocks, checks, Device, DeviceBuffer, DeviceCall, DeviceKind, DeviceMatrix, FlashCall,
    PagedCall, RowOp, FLASH_ATTENTION_OP,
};
use tessera_core::{DType, Error, Result};

/// Below this many weight rows the one-row quantized matmul gives each warp one row
/// instead of four: 8192 rows at four per warp and four warps per block are 512
/// blocks, about four per multiprocessor of an H100.
const SMALL_MATRIX_ROWS: usize = 8192;

/// The widest head `paged_varlen_f32` holds (8 elements per lane).
pub const MAX_HEAD_DIM: usize = 256;

impl From<CudaError> for Error {
    fn from(e: CudaError) -> Self {
        Error::Device(e.to_string())
    }
}

/// f32 storage: activations, outputs, KV caches.
struct F32(CudaSlice<f32>);
/// 16-bit floats kept at 16 bits (GEMM operands, attention caches, flash attention's
/// operands and output).
struct Half {
    dtype: DType,
    bits: CudaSlice<u16>,
}
/// `data` rounded to the 16-bit `dtype` (F16 or BF16), as bits.
fn half_bits(dtype: DType, data: &[f32]) -> Vec<u16> {
    match dtype {
        DType::F16 => data.iter().map(|&x| f16::from_f32(x).to_bits()).collect(),
        _ => data.iter().map(|&x| bf16::from_f32(x).to_bits()).collect(),
    }
}

/// 16-bit `dtype` bits widened exactly to f32.
fn widen_bits(dtype: DType, bits: &[u16]) -> Vec<f32> {
    match dtype {
        DType::F16 => bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect(),
        _ => bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect(),
    }
}

/// Block-format weights split for `qmatmul_*`: code bytes row-major, f16 scales (two
/// per block for Q4_1: scale, min).
struct Blocks {
    format: DType,
    rows: usize,
    cols: usize,
    scales: CudaSlice<u16>,
    codes: CudaSlice<u8>,
}

/// A quantized matmul's activations and outputs as its kernels take them: pointers at
/// the views' offsets, the row strides and y's column stride, and whether every x row
/// starts 16-byte aligned (the float4 load forms).
struct MatmulViews<'a> {
    x: CudaView<'a, f32>,
    y: CudaView<'a, f32>,
    /// x row, y row, y column.
    strides: [i64; 3],
    aligned: bool,
}

/// Checks a quantized matmul's views (`x [m, k]` with contiguous rows, `y [m, n]`) and
/// prepares them; None when there is nothing to compute.
fn matmul_views<'a>(
    op: &'static str,
    (x, y): (DeviceMatrix<'a>, DeviceMatrix<'a>),
    [m, n, k]: [usize; 3],
) -> Result<Option<MatmulViews<'a>>> {
    x.check(op, "x", [1, m, k])?;
    y.check(op, "y", [1, m, n])?;
    if x.strides[2] != 1 {
        return Err(Error::shape(
            op,
            "activation rows must be contiguous (column stride 1)",
        ));
    }
    if m == 0 || n == 0 {
        return Ok(None);
    }
    Ok(Some(MatmulViews {
        x: f32_view(x.buf, x.offset)?,
        y: f32_view(y.buf, y.offset)?,
        strides: [
            long(op, "x row stride", x.strides[1])?,
            long(op, "y row stride", y.strides[1])?,
            long(op, "y column stride", y.strides[2])?,
        ],
        aligned: x.offset.is_multiple_of(4) && (m == 1 || x.strides[1].is_multiple_of(4)),
    }))
}

/// Per-channel INT8 weights for `qmatmul_i8`: codes row-major, one f32 scale per row.
struct Int8W {
    rows: usize,
    cols: usize,
    codes: CudaSlice<i8>,
    scales: CudaSlice<f32>,
}

/// A paged call's K/V cache as its kernel reads it.
enum Cache<'a> {
    F32(CudaView<'a, f32>, CudaView<'a, f32>),
    /// bf16 or f16 bit patterns.
    Half(&'a CudaSlice<u16>, &'a CudaSlice<u16>),
}

/// What paged-attention calls reuse: the last table (host copy to compare, device copy
/// to read) and the split workspace, grown as needed.
#[derive(Default)]
struct PagedScratch {
    meta_host: Vec<u32>,
    meta: Option<CudaSlice<u32>>,
    part_ml: Option<CudaSlice<f32>>,
    part_acc: Option<CudaSlice<f32>>,
}

/// A buffer of at least `len` elements in `slot`, allocated only when the one there is
/// shorter. Its contents are whatever the last call left: every kernel that reads it
/// writes its part first.
fn at_least<'a>(
    gpu: &Gpu,
    slot: &'a mut Option<CudaSlice<f32>>,
    len: usize,
) -> Result<&'a CudaSlice<f32>> {
    if slot.as_ref().is_none_or(|s| s.len() < len) {
        *slot = None;
        *slot = Some(gpu.zeros::<f32>(len)?);
    }
    Ok(slot.as_ref().expect("allocated above"))
}

/// The CUDA device as a registry and engine backend.
pub struct CudaBackend {
    gpu: Gpu,
    paged: std::sync::Mutex<PagedScratch>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("gpu", &self.gpu)
            .finish()
    }
}

impl CudaBackend {
    /// Opens CUDA device `ordinal`, or says why it cannot (no driver, no NVRTC, no
    /// such device, too old an architecture).
    pub fn new(ordinal: usize) -> std::result::Result<Self, CudaError> {
        Ok(CudaBackend {
            gpu: Gpu::new(ordinal)?,
            paged: Default::default(),
        })
    }
    /// The underlying device (for the typed launchers in [`crate::ops`]).
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

fn int(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::shape(op, format!("{what} = {v} exceeds 2^31 − 1")))
}

fn long(op: &'static str, what: &str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::shape(op, format!("{what} = {v} exceeds 2^63 − 1")))
}

fn f32_view<'a>(buf: &'a DeviceBuffer, offset: usize) -> Result<CudaView<'a, f32>> {
    let s = &buf.get::<F32>()?.0;
    if offset > s.len() {
        return Err(Error::shape(
            "cuda",
            format!("offset {offset} past the buffer"),
        ));
    }
    Ok(s.slice(offset..))
}

/// Blocks of `per` threads covering `n`, capped for grid-stride kernels.
fn stride_grid(n: usize, per: usize) -> u32 {
    n.div_ceil(per).clamp(1, 1 << 16) as u32
}

fn launched(what: &str, r: std::result::Result<(), cudarc::driver::DriverError>) -> Result<()> {
    r.map_err(|e| CudaError::driver(format!("launch {what}"), e).into())
}

impl Device for CudaBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }
    fn name(&self) -> String {
        format!("{} ({})", self.gpu.name(), self.gpu.arch())
    }
    fn supports(&self, op: &str, dtype: DType) -> bool {
        match op {
            "rms_norm" | "softmax" | "swiglu" | "add" | "rope" | "rope_neox" | "embedding" => {
                dtype == DType::F32
            }
            "gemm" => matches!(dtype, DType::F32 | DType::F16 | DType::BF16),
            "qmatmul" => blocks::format_code(dtype).is_some(),
            "qmatmul_i8" => dtype == DType::I8,
            // K/V caches of f32, or kept at 16 bits (bf16, f16) as uploaded.
            "attention" | "paged_attention" | "varlen_attention" => {
                matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
            }
            FLASH_ATTENTION_OP => matches!(dtype, DType::BF16 | DType::F16),
            _ => false,
        }
    }
    fn upload(&self, data: &[f32]) -> Result<DeviceBuffer> {
        Ok(DeviceBuffer::new(data.len(), F32(self.gpu.upload(data)?)))
    }
    fn upload_half(&self, dtype: DType, bits: &[u16]) -> Result<DeviceBuffer> {
        checks::half_dtype("cuda upload_half", dtype)?;
        let bits = self.gpu.upload(bits)?;
        Ok(DeviceBuffer::new(bits.len(), Half { dtype, bits }))
    }
    fn upload_blocks(
        &self,
        format: DType,
        rows: usize,
        cols: usize,
        raw: &[u8],
    ) -> Result<DeviceBuffer> {
        const OP: &str = "cuda upload_blocks";
        if format == DType::I8 {
            let (q, scales) = blocks::split_int8(OP, rows, cols, raw)?;
            let codes: Vec<i8> = q.iter().map(|&b| b as i8).collect();
            let w = Int8W {
                rows,
                cols,
                codes: self.gpu.upload(&codes)?,
                scales: self.gpu.upload(&scales)?,
            };
            return Ok(DeviceBuffer::new(rows * cols, w));
        }
        let r = blocks::repack(OP, format, rows, cols, raw)?;
        let per_block = if format == DType::Q4_1 { 2 } else { 1 };
        let scales: Vec<u16> = r
            .scales
            .chunks_exact(2)
            .flat_map(|p| &p[..per_block])
            .map(|&s| f16::from_f32(s).to_bits())
            .collect();
        let b = Blocks {
            format,
            rows,
            cols,
            scales: self.gpu.upload(&scales)?,
            codes: self.gpu.upload(&r.codes)?,
        };
        Ok(DeviceBuffer::new(rows * cols, b))
    }
    fn write(&self, buf: &DeviceBuffer, data: &[f32]) -> Result<()> {
        // f32 first: the engine's per-step buffers; 16-bit outputs are the rare case.
        match buf.get::<F32>() {
            Ok(s) => self.copy_in("cuda write", &s.0, data),
            Err(_) => {
                let h = buf.get::<Half>()?;
                self.copy_in("cuda write", &h.bits, &half_bits(h.dtype, data))
            }
        }
    }
    fn download(&self, buf: &DeviceBuffer) -> Result<Vec<f32>> {
        match buf.get::<F32>() {
            Ok(s) => Ok(self.gpu.download(&s.0)?),
            Err(_) => {
                let h = buf.get::<Half>()?;
                Ok(widen_bits(h.dtype, &self.gpu.download(&h.bits)?))
            }
        }
    }
    fn run(&self, call: &DeviceCall<'_>) -> Result<()> {
        self.enqueue(call)?;
        Ok(self.gpu.synchronize()?)
    }
    fn enqueue(&self, call: &DeviceCall<'_>) -> Result<()> {
        CudaBackend::enqueue(self, call)
    }
}

impl CudaBackend {
    /// Checks `call` and queues its launch on the device's stream without waiting
    /// ([`Device::run`] is this plus a wait): calls queued back to back run in order,
    /// so a caller can time many, or overlap its own work, with one synchronisation.
    pub fn enqueue(&self, call: &DeviceCall<'_>) -> Result<()> {
        match *call {
            DeviceCall::Rows {
                op,
                inputs,
                gamma,
                out,
                out_offset,
                rows,
                n,
            } => self.rows(op, inputs, gamma, (out, out_offset), [rows, n]),
            DeviceCall::Gemm {
                a,
                b,
                c,
                dims,
                alpha,
                beta,
            } => self.gemm([a, b, c], dims, alpha, beta),
            DeviceCall::QMatmul { w, x, y, m } => self.qmatmul(w, x, y, m),
            DeviceCall::PagedAttention(ref p) => self.paged(p),
            DeviceCall::FlashAttention(ref f) => self.flash(f),
            DeviceCall::Embedding {
                table,
                vocab,
                dim,
                ids,
                out,
            } => self.embedding(table, [vocab, dim], ids, out),
        }
    }
}

impl CudaBackend {
    fn rows(
        &self,
        op: RowOp,
        inputs: &[&DeviceBuffer],
        gamma: Option<&DeviceBuffer>,
        (out, out_offset): (&DeviceBuffer, usize),
        [rows, n]: [usize; 2],
    ) -> Result<()> {
        let name = op.name();
        let plan = checks::rows(op, inputs, gamma, (out, out_offset), [rows, n])?;
        if plan.len == 0 {
            return Ok(());
        }
        let (x, second, o) = (
            f32_view(inputs[0], 0)?,
            f32_view(plan.second, 0)?,
            f32_view(out, out_offset)?,
        );
        let cols = int(name, "row length", n)?;
        let row_grid = (int(name, "rows", rows)? as u32, 1, 1);
        let s = self.gpu.stream();
        match op {
            RowOp::RmsNorm { eps } => {
                let f = self.gpu.function("rms_norm", "rms_norm_residual_f32")?;
                let null: u64 = 0;
                let mut l = s.launch_builder(&f);
                l.arg(&x)
                    .arg(&null)
                    .arg(&second)
                    .arg(&o)
                    .arg(&cols)
                    .arg(&eps);
                // SAFETY: matches rms_norm_residual_f32 (a 0 residual pointer: none, so x
                // is only read); rows × n checked against every buffer.
                launched(name, unsafe { l.launch(cfg(row_grid, 256)) }.map(|_| ()))
            }
            RowOp::Softmax => {
                let f = self.gpu.function("softmax", "softmax_f32")?;
                let mut l = s.launch_builder(&f);
                l.arg(&x).arg(&o).arg(&cols);
                // SAFETY: matches softmax_f32; one block per checked row.
                launched(name, unsafe { l.launch(cfg(row_grid, 256)) }.map(|_| ()))
            }
            RowOp::SwiGlu | RowOp::Add => {
                let f = match op {
                    RowOp::Add => self.gpu.function("add", "add_f32")?,
                    _ => self.gpu.function("swiglu", "swiglu_f32")?,
                };
                let len = long(name, "elements", plan.len)?;
                let mut l = s.launch_builder(&f);
                l.arg(&x).arg(&second).arg(&o).arg(&len);
                // SAFETY: matches swiglu_f32 and add_f32 (grid-stride over `len`, checked
                // for all three).
                launched(name, unsafe {
                    l.launch(cfg((stride_grid(plan.len, 256), 1, 1), 256))
                        .map(|_| ())
                })
            }
            RowOp::Rope { heads, half_split } => {
                let f = self.gpu.function("rope", "rope_f32")?;
                let tokens = rows / heads;
                let (cos, sin) = (
                    f32_view(plan.second, 0)?,
                    f32_view(plan.second, tokens * n / 2)?,
                );
                let (t, h, hs) = (
                    int(name, "tokens", tokens)?,
                    int(name, "heads", heads)?,
                    half_split as i32,
                );
                let pairs = plan.len / 2;
                let grid = u32::try_from(pairs.div_ceil(256))
                    .map_err(|_| Error::shape(name, format!("{pairs} pairs")))?;
                let mut l = s.launch_builder(&f);
                l.arg(&x).arg(&cos).arg(&sin).arg(&o);
                l.arg(&t).arg(&h).arg(&cols).arg(&hs);
                // SAFETY: matches rope_f32 (one thread per pair, guarded); the table was
                // checked to hold tokens × n/2 cosines then as many sines.
                launched(name, unsafe {
                    l.launch(cfg((grid, 1, 1), 256)).map(|_| ())
                })
            }
        }
    }

    /// A GEMM operand: its element kind (0 f32, 1 f16, 2 bf16) and the view at `offset`
    /// in 32-bit or 16-bit elements.
    fn operand<'a>(m: &DeviceMatrix<'a>) -> Result<(u32, GemmPtr<'a>)> {
        if let Ok(h) = m.buf.get::<Half>() {
            let kind = if h.dtype == DType::F16 { 1 } else { 2 };
            return Ok((kind, GemmPtr::Half(h.bits.slice(m.offset..))));
        }
        Ok((0, GemmPtr::F32(f32_view(m.buf, m.offset)?)))
    }

    fn gemm(
        &self,
        [a, b, c]: [DeviceMatrix<'_>; 3],
        [batch, m, n, k]: [usize; 4],
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        const OP: &str = "gemm";
        a.check(OP, "A", [batch, m, k])?;
        b.check(OP, "B", [batch, k, n])?;
        c.check(OP, "C", [batch, m, n])?;
        if batch == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        let ((ka, _), (kb, _)) = (Self::operand(&a)?, Self::operand(&b)?);
        if ka != kb {
            return Err(Error::invalid(OP, "A and B in different storage types"));
        }
        if ka != 0 && self.gemm_tensor_cores([a, b, c], [batch, m, n, k], alpha, beta)? {
            return Ok(());
        }
        if batch > 65535 || m.div_ceil(64) > 65535 {
            return Err(Error::shape(OP, format!("{batch}x{m}x{n} in one launch")));
        }
        let entry = ["gemm_strided_f32", "gemm_strided_f16", "gemm_strided_bf16"][ka as usize];
        let f = self.gpu.function("gemm", entry)?;
        let (_, pa) = Self::operand(&a)?;
        let (_, pb) = Self::operand(&b)?;
        let pc = f32_view(c.buf, c.offset)?;
        let (mi, ni, ki) = (int(OP, "m", m)?, int(OP, "n", n)?, int(OP, "k", k)?);
        let strides = |v: &DeviceMatrix<'_>| -> Result<[i64; 3]> {
            Ok([
                long(OP, "stride", v.strides[0])?,
                long(OP, "stride", v.strides[1])?,
                long(OP, "stride", v.strides[2])?,
            ])
        };
        let (sa, sb, sc) = (strides(&a)?, strides(&b)?, strides(&c)?);
        let mut l = self.gpu.stream().launch_builder(&f);
        pa.push(&mut l);
        pb.push(&mut l);
        l.arg(&pc).arg(&mi).arg(&ni).arg(&ki);
        for s in sa.iter().chain(&sb).chain(&sc) {
            l.arg(s);
        }
        l.arg(&alpha).arg(&beta);
        let grid = (n.div_ceil(64) as u32, m.div_ceil(64) as u32, batch as u32);
        // SAFETY: matches gemm_strided_* (operands of the entry's element type); every
        // view was checked to lie inside its buffer for these dims and strides.
        launched(OP, unsafe { l.launch(cfg(grid, 256)).map(|_| ()) })
    }

    /// The tensor-core path when the views fit it (see the module docs); false when
    /// they do not, and the caller runs the strided kernel.
    fn gemm_tensor_cores(
        &self,
        [a, b, c]: [DeviceMatrix<'_>; 3],
        [batch, m, n, k]: [usize; 4],
        alpha: f32,
        beta: f32,
    ) -> Result<bool> {
        let aligned = |v: usize| v.is_multiple_of(8);
        let fits = beta == 0.0
            && a.strides[2] == 1
            && b.strides[1] == 1
            && c.strides[2] == 1
            && k > 0
            && aligned(k)
            && aligned(a.strides[1])
            && aligned(b.strides[2])
            && (batch == 1 || (aligned(a.strides[0]) && aligned(b.strides[0])))
            && aligned(a.offset)
            && aligned(b.offset)
            && [m, n, k, a.strides[1], b.strides[2], c.strides[1]]
                .iter()
                .all(|&v| i32::try_from(v).is_ok());
        if !fits {
            return Ok(false);
        }
        let (ha, hb) = (a.buf.get::<Half>()?, b.buf.get::<Half>()?);
        let entry = if ha.dtype == DType::F16 {
            "gemm_f16_tn"
        } else {
            "gemm_bf16_tn"
        };
        let f = self.gpu.function("gemm", entry)?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let (lda, ldb, ldc) = (
            a.strides[1] as i32,
            b.strides[2] as i32,
            c.strides[1] as i32,
        );
        let grid = (n.div_ceil(128) as u32, m.div_ceil(128) as u32, 1);
        for i in 0..batch {
            let pa = ha.bits.slice(a.offset + i * a.strides[0]..);
            let pb = hb.bits.slice(b.offset + i * b.strides[0]..);
            let pc = f32_view(c.buf, c.offset + i * c.strides[0])?;
            let mut l = self.gpu.stream().launch_builder(&f);
            l.arg(&pa).arg(&pb).arg(&pc).arg(&mi).arg(&ni).arg(&ki);
            l.arg(&lda).arg(&ldb).arg(&ldc).arg(&alpha);
            // SAFETY: matches gemm_*_tn; the views were checked to lie in their buffers,
            // K, lda and ldb are multiples of 8 and the offsets 16-byte aligned.
            launched("gemm", unsafe { l.launch(cfg(grid, 256)).map(|_| ()) })?;
        }
        Ok(true)
    }

    fn qmatmul(
        &self,
        w: &DeviceBuffer,
        x: DeviceMatrix<'_>,
        y: DeviceMatrix<'_>,
        m: usize,
    ) -> Result<()> {
        const OP: &str = "qmatmul";
        if let Ok(iw) = w.get::<Int8W>() {
            return self.qmatmul_i8(iw, x, y, m);
        }
        let wb = w.get::<Blocks>()?;
        let (n, k) = (wb.rows, wb.cols);
        let Some(v) = matmul_views(OP, (x, y), [m, n, k])? else {
            return Ok(());
        };
        // Activation rows per warp: each group re-reads W (from L2 after the first), so
        // wider groups for more rows; 8 keeps the x registers (8 × 8) under the limit.
        let rows_per_group = match m {
            1 => 1,
            2..=4 => 4,
            _ => 8,
        };
        let fmt = match wb.format {
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            _ => "q8_0",
        };
        let groups = m.div_ceil(rows_per_group);
        if groups > 65535 {
            return Err(Error::shape(
                OP,
                format!("{m} activation rows in one launch"),
            ));
        }
        // One weight row per warp where four would leave the GPU short of blocks (see
        // qmatvec.cu); only the one-row kernel has that form.
        let weight_rows = if m == 1 && n < SMALL_MATRIX_ROWS {
            1
        } else {
            4
        };
        let entry = format!(
            "qmatmul_{fmt}_m{rows_per_group}{}{}",
            // float4 activation loads when every x row starts 16-byte aligned.
            if v.aligned { "_v4" } else { "" },
            if weight_rows == 1 { "_r1" } else { "" }
        );
        let f = self.gpu.function("qmatvec", &entry)?;
        let (mi, ni, ki) = (int(OP, "m", m)?, int(OP, "n", n)?, int(OP, "k", k)?);
        let [x_row, y_row, y_col] = v.strides;
        let mut l = self.gpu.stream().launch_builder(&f);
        l.arg(&wb.codes).arg(&wb.scales).arg(&v.x).arg(&v.y);
        l.arg(&mi)
            .arg(&ni)
            .arg(&ki)
            .arg(&x_row)
            .arg(&y_row)
            .arg(&y_col);
        // 4 warps × `weight_rows` weight rows per block.
        let grid = (n.div_ceil(4 * weight_rows) as u32, groups as u32, 1);
        // SAFETY: matches qmatmul_*; the codes and scales were split for exactly n × k
        // weights, and x/y were checked to hold m rows of k and n.
        launched(OP, unsafe { l.launch(cfg(grid, 128)).map(|_| ()) })
    }

    /// `y = x·Wᵀ` over per-channel INT8 weights: a warp per weight row, a grid row per
    /// activation row.
    fn qmatmul_i8(
        &self,
        w: &Int8W,
        x: DeviceMatrix<'_>,
        y: DeviceMatrix<'_>,
        m: usize,
    ) -> Result<()> {
        const OP: &str = "qmatmul_i8";
        let (n, k) = (w.rows, w.cols);
        let Some(v) = matmul_views(OP, (x, y), [m, n, k])? else {
            return Ok(());
        };
        if m > 65535 {
            return Err(Error::shape(
                OP,
                format!("{m} activation rows in one launch"),
            ));
        }
        let entry = if v.aligned {
            "qmatmul_i8_v4"
        } else {
            "qmatmul_i8"
        };
        let f = self.gpu.function("qmatvec", entry)?;
        let (ni, ki) = (int(OP, "n", n)?, int(OP, "k", k)?);
        let [x_row, y_row, y_col] = v.strides;
        let mut l = self.gpu.stream().launch_builder(&f);
        l.arg(&w.codes).arg(&w.scales).arg(&v.x).arg(&v.y);
        l.arg(&ni).arg(&ki).arg(&x_row).arg(&y_row).arg(&y_col);
        let grid = (n.div_ceil(8) as u32, m as u32, 1);
        // SAFETY: matches qmatmul_i8[_v4]; codes and scales were uploaded for exactly
        // n × k weights (k a multiple of 4, so each row's char4 reads stay in it), x and y
        // were checked to hold m rows of k and n through their strides, and the float4
        // form runs only when every x row starts 16-byte aligned.
        launched(OP, unsafe { l.launch(cfg(grid, 256)).map(|_| ()) })
    }

    /// Overwrites all of `dst` with `data` once the stream is idle.
    fn copy_in<T: cudarc::driver::DeviceRepr>(
        &self,
        op: &'static str,
        dst: &CudaSlice<T>,
        data: &[T],
    ) -> Result<()> {
        if data.len() != dst.len() {
            return Err(Error::shape(
                op,
                format!("{} values for a buffer of {}", data.len(), dst.len()),
            ));
        }
        if data.is_empty() {
            return Ok(());
        }
        let stream = self.gpu.stream();
        self.gpu.synchronize()?;
        let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(dst, stream);
        // SAFETY: `ptr` is `dst`'s allocation of exactly `data.len()` elements of T,
        // alive for the call (borrowed); the copy is synchronous and the stream idle.
        unsafe { cudarc::driver::result::memcpy_htod_sync(ptr, data) }
            .map_err(|e| CudaError::driver(op, e).into())
    }

    fn embedding(
        &self,
        table: DeviceMatrix<'_>,
        [vocab, dim]: [usize; 2],
        ids: &[u32],
        out: &DeviceBuffer,
    ) -> Result<()> {
        const OP: &str = "embedding";
        checks::token_ids(OP, ids, vocab)?;
        table.check(OP, "table", [1, vocab, dim])?;
        if dim > 1 && table.strides[2] != 1 {
            return Err(Error::shape(OP, "table rows must be contiguous"));
        }
        let len = ids
            .len()
            .checked_mul(dim)
            .ok_or_else(|| Error::Overflow(format!("{}x{dim}", ids.len())))?;
        checks::need(OP, "out", out, len)?;
        if len == 0 {
            return Ok(());
        }
        let d_ids = self.gpu.upload(ids)?;
        let f = self.gpu.function("embedding", "embedding_f32")?;
        let (tv, o) = (f32_view(table.buf, table.offset)?, f32_view(out, 0)?);
        let (tokens, d) = (int(OP, "tokens", ids.len())?, int(OP, "dim", dim)?);
        let vocab32 = u32::try_from(vocab).unwrap_or(u32::MAX);
        let row = long(OP, "row stride", table.strides[1])?;
        let mut l = self.gpu.stream().launch_builder(&f);
        l.arg(&tv)
            .arg(&d_ids)
            .arg(&o)
            .arg(&tokens)
            .arg(&d)
            .arg(&vocab32)
            .arg(&row);
        // SAFETY: matches embedding_f32 (grid-stride over tokens × dim); ids were checked
        // below vocab and the table view to hold vocab rows of dim.
        launched(OP, unsafe {
            l.launch(cfg((stride_grid(len, 256), 1, 1), 256))
                .map(|_| ())
        })
    }
}

/// A GEMM operand view in its storage type.
enum GemmPtr<'a> {
    F32(CudaView<'a, f32>),
    Half(CudaView<'a, u16>),
}

impl GemmPtr<'_> {
    fn push<'b>(&'b self, l: &mut cudarc::driver::LaunchArgs<'b>) {
        match self {
            GemmPtr::F32(v) => l.arg(v),
            GemmPtr::Half(v) => l.arg(v),
        };
    }
}
