//! Each [`DeviceCall`] as a WGSL pipeline: its checks, uniform parameters and grid.
//!
//! Shaders index with u32, so every view must span fewer than 2³² elements; grids
//! beyond 65535 workgroups per dimension fold into the next dimension.

use crate::context::{BlockBuf, Buf, HalfBuf, WgpuDevice};
use tessera_core::device::{blocks, checks, DeviceBuffer, DeviceCall, DeviceMatrix, RowOp};
use tessera_core::{DType, Error, Result};

const ROWS: &str = include_str!("shaders/rows.wgsl");
const GEMM: &str = include_str!("shaders/gemm.wgsl");
const QMATMUL: &str = include_str!("shaders/qmatmul.wgsl");
const EMBEDDING: &str = include_str!("shaders/embedding.wgsl");
const MAX_GRID: usize = 65535;

pub(crate) fn u32_of(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::shape(op, format!("{what} = {v} exceeds u32 indexing")))
}

pub(crate) use tessera_core::device::checks::need;

/// A grid of `count` workgroups along x, folded into y past 65535.
pub(crate) fn folded(op: &'static str, count: usize) -> Result<[u32; 3]> {
    let y = count.div_ceil(MAX_GRID);
    if y > MAX_GRID {
        return Err(Error::shape(op, format!("{count} workgroups")));
    }
    Ok([count.min(MAX_GRID) as u32, y as u32, 1])
}

fn matrix_params(op: &'static str, m: &DeviceMatrix<'_>, dims: [usize; 3]) -> Result<Vec<u32>> {
    m.check(op, "operand", dims)?;
    u32_of(op, "span", m.span(dims))?;
    let mut v = vec![u32_of(op, "offset", m.offset)?];
    for s in m.strides {
        v.push(u32_of(op, "stride", s)?);
    }
    Ok(v)
}

pub(crate) fn run(dev: &WgpuDevice, call: &DeviceCall<'_>) -> Result<()> {
    match *call {
        DeviceCall::Rows {
            op,
            inputs,
            gamma,
            out,
            out_offset,
            rows,
            n,
        } => rows_call(dev, op, inputs, gamma, (out, out_offset), [rows, n]),
        DeviceCall::Gemm {
            a,
            b,
            c,
            dims,
            alpha,
            beta,
        } => gemm(dev, [a, b, c], dims, alpha, beta),
        DeviceCall::QMatmul { w, x, y, m } => qmatmul(dev, w, x, y, m),
        DeviceCall::PagedAttention(ref call) => crate::paged::paged_attention(dev, call),
        // Its `supports` never names the op, so the registry offers no such variant.
        DeviceCall::FlashAttention(_) => Err(Error::Unsupported(
            "wgpu has no 16-bit flash attention kernel (attention runs as a paged call)".into(),
        )),
        DeviceCall::Embedding {
            table,
            vocab,
            dim,
            ids,
            out,
        } => embedding(dev, table, [vocab, dim], ids, out),
    }
}

fn rows_call(
    dev: &WgpuDevice,
    op: RowOp,
    inputs: &[&DeviceBuffer],
    gamma: Option<&DeviceBuffer>,
    (out, out_offset): (&DeviceBuffer, usize),
    [rows, n]: [usize; 2],
) -> Result<()> {
    let name = op.name();
    let plan = checks::rows(op, inputs, gamma, (out, out_offset), [rows, n])?;
    let (len, second, eps) = (plan.len, plan.second, plan.eps);
    u32_of(name, "rows·n", len)?;
    u32_of(name, "output end", out_offset + len)?;
    let heads = u32_of(name, "heads", plan.heads)?;
    if len == 0 {
        return Ok(());
    }
    let pipeline = dev.pipeline(name, ROWS)?;
    let grid = match op {
        // Elementwise: 256 elements (RoPE: pairs) per workgroup.
        RowOp::SwiGlu | RowOp::Add => folded(name, len.div_ceil(256))?,
        RowOp::Rope { .. } => folded(name, (len / 2).div_ceil(256))?,
        _ => folded(name, rows)?,
    };
    let params = [
        rows as u32,
        n as u32,
        eps.to_bits(),
        heads,
        out_offset as u32,
    ];
    let bufs = [
        Some(&inputs[0].get::<Buf>()?.buffer),
        // Softmax reads one input: its entry point has no binding 2.
        (op != RowOp::Softmax)
            .then(|| second.get::<Buf>().map(|b| &b.buffer))
            .transpose()?,
        Some(&out.get::<Buf>()?.buffer),
    ];
    dev.launch(&pipeline, &params, &bufs, grid)
}

/// A GEMM input's storage kind as the shader's loads name it (0 f32, 1 f16, 2 bf16)
/// and its buffer.
fn operand(buf: &DeviceBuffer) -> Result<(u32, &wgpu::Buffer)> {
    if let Ok(h) = buf.get::<HalfBuf>() {
        return Ok((if h.dtype == DType::F16 { 1 } else { 2 }, &h.buffer));
    }
    Ok((0, &buf.get::<Buf>()?.buffer))
}

fn gemm(
    dev: &WgpuDevice,
    [a, b, c]: [DeviceMatrix<'_>; 3],
    [batch, m, n, k]: [usize; 4],
    alpha: f32,
    beta: f32,
) -> Result<()> {
    let op = "gemm";
    if batch > MAX_GRID || m.div_ceil(64) > MAX_GRID || n.div_ceil(64) > MAX_GRID {
        return Err(Error::shape(
            op,
            format!("{batch}x{m}x{n} too large for one dispatch"),
        ));
    }
    let mut params = vec![
        u32_of(op, "m", m)?,
        u32_of(op, "n", n)?,
        u32_of(op, "k", k)?,
        batch as u32,
    ];
    params.extend(matrix_params(op, &a, [batch, m, k])?);
    params.extend(matrix_params(op, &b, [batch, k, n])?);
    params.extend(matrix_params(op, &c, [batch, m, n])?);
    let ((a_kind, a_buf), (b_kind, b_buf)) = (operand(a.buf)?, operand(b.buf)?);
    params.extend([alpha.to_bits(), beta.to_bits(), a_kind, b_kind]);
    let pipeline = dev.pipeline("gemm", GEMM)?;
    let bufs = [Some(a_buf), Some(b_buf), Some(&c.buf.get::<Buf>()?.buffer)];
    let grid = [n.div_ceil(64) as u32, m.div_ceil(64) as u32, batch as u32];
    dev.launch(&pipeline, &params, &bufs, grid)
}

fn qmatmul(
    dev: &WgpuDevice,
    w: &DeviceBuffer,
    x: DeviceMatrix<'_>,
    y: DeviceMatrix<'_>,
    m: usize,
) -> Result<()> {
    let op = "qmatmul";
    let wb = w.get::<BlockBuf>()?;
    let (n, k) = (wb.rows, wb.cols);
    let format = blocks::format_code(wb.format).ok_or_else(|| Error::DType {
        op,
        dtype: wb.format.to_string(),
    })?;
    if m.div_ceil(4) > MAX_GRID {
        return Err(Error::shape(
            op,
            format!("{m} activation rows in one dispatch"),
        ));
    }
    let xp = matrix_params(op, &x, [1, m, k])?;
    let yp = matrix_params(op, &y, [1, m, n])?;
    if xp[3] != 1 {
        return Err(Error::shape(
            op,
            "activation rows must be contiguous (column stride 1)",
        ));
    }
    let params = [
        u32_of(op, "m", m)?,
        u32_of(op, "n", n)?,
        u32_of(op, "k", k)?,
        format,
        xp[0],
        xp[2],
        yp[0],
        yp[2],
        yp[3],
        0,
        0,
        0,
    ];
    let pipeline = dev.pipeline("qmatmul", QMATMUL)?;
    let bufs = [
        Some(&wb.scales),
        Some(&wb.codes),
        Some(&x.buf.get::<Buf>()?.buffer),
        Some(&y.buf.get::<Buf>()?.buffer),
    ];
    // Groups of 64 weight rows along x (folded into z past 65535), groups of 4
    // activation rows along y.
    let groups = n.div_ceil(64);
    let grid = [
        groups.min(MAX_GRID) as u32,
        m.div_ceil(4) as u32,
        groups.div_ceil(MAX_GRID) as u32,
    ];
    dev.launch(&pipeline, &params, &bufs, grid)
}

/// The table rows of `ids`, one invocation per output element; the ids travel with the
/// launch and are checked against the vocabulary first.
fn embedding(
    dev: &WgpuDevice,
    table: DeviceMatrix<'_>,
    [vocab, dim]: [usize; 2],
    ids: &[u32],
    out: &DeviceBuffer,
) -> Result<()> {
    let op = "embedding";
    checks::token_ids(op, ids, vocab)?;
    let tp = matrix_params(op, &table, [1, vocab, dim])?;
    let len = ids
        .len()
        .checked_mul(dim)
        .ok_or_else(|| Error::Overflow(format!("{}x{dim}", ids.len())))?;
    need(op, "out", out, len)?;
    if len == 0 {
        return Ok(());
    }
    let bytes: Vec<u8> = ids.iter().flat_map(|w| w.to_le_bytes()).collect();
    let ids_buf = dev.words(&bytes, "token ids")?;
    let params = [
        u32_of(op, "elements", len)?,
        dim as u32,
        tp[0],
        tp[2],
        tp[3],
        0,
        0,
        0,
    ];
    let pipeline = dev.pipeline(op, EMBEDDING)?;
    let bufs = [
        Some(&table.buf.get::<Buf>()?.buffer),
        Some(&ids_buf),
        Some(&out.get::<Buf>()?.buffer),
    ];
    dev.launch(&pipeline, &params, &bufs, folded(op, len.div_ceil(256))?)
}
