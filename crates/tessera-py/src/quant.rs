//! Quantized weights from Python: `quantize` to any format the engine reads, `dequantize`,
//! and `qmatmul` on them. A [`QuantizedMatrix`] is the engine's own linear layer
//! (`tessera_engine::linear::Linear`), so `qmatmul` runs exactly the kernels a model's
//! projections run, including the integer path with 8-bit activations.

use crate::array::{borrow, output, Elem};
use crate::{core_err, engine_err};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tessera_core::{DType, TensorView};
use tessera_engine::linear::{Linear, QuantLinear};
use tessera_engine::weights::quantize_matrix;
use tessera_kernels::quant::{blocks_from_bytes, BlockFormat, QuantMatrix, BLOCK_DTYPES};
use tessera_kernels::with_block_format;

/// A weight matrix W [rows, cols] held in a quantized format.
#[pyclass(module = "tessera._tessera", frozen)]
#[derive(Debug)]
pub struct QuantizedMatrix {
    w: Box<dyn Linear>,
}

/// The formats `quantize` accepts, by name.
pub fn formats() -> Vec<&'static str> {
    BLOCK_DTYPES
        .into_iter()
        .chain([DType::I8, DType::F8E4M3, DType::F8E5M2])
        .map(|d| d.name())
        .collect()
}

fn parse_format(name: &str) -> PyResult<DType> {
    let d: DType = name.parse().map_err(|_| {
        PyValueError::new_err(format!(
            "unknown format {name:?} (one of: {})",
            formats().join(", ")
        ))
    })?;
    if !formats().contains(&d.name()) {
        return Err(PyValueError::new_err(format!(
            "{name} is not a quantized format (one of: {})",
            formats().join(", ")
        )));
    }
    Ok(d)
}

#[pymethods]
impl QuantizedMatrix {
    /// The format's name (q4_0, q4_k, int4_g32, i8, f8e4m3, …).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.w.dtype().name()
    }

    /// (rows, cols): W is applied as y = x·Wᵀ.
    #[getter]
    fn shape(&self) -> (usize, usize) {
        (self.w.out_features(), self.w.in_features())
    }

    /// Bytes of the quantized weights (and their scales).
    #[getter]
    fn nbytes(&self) -> usize {
        self.w.weight_bytes()
    }

    /// A block-format matrix from its raw ggml blocks (as stored in a GGUF file):
    /// `rows·cols/block_size` blocks, row-major.
    #[staticmethod]
    fn from_bytes(
        dtype: &str,
        rows: usize,
        cols: usize,
        data: &Bound<'_, PyBytes>,
    ) -> PyResult<Self> {
        let d = parse_format(dtype)?;
        fn build<B: BlockFormat>(
            rows: usize,
            cols: usize,
            bytes: &[u8],
        ) -> PyResult<Box<dyn Linear>> {
            let blocks = blocks_from_bytes::<B>(bytes).map_err(core_err)?.to_vec();
            let m = QuantMatrix::from_blocks(rows, cols, blocks).map_err(core_err)?;
            Ok(Box::new(QuantLinear::new(m)))
        }
        let bytes = data.as_bytes();
        let w = with_block_format!(d, B => build::<B>(rows, cols, bytes), _ => Err(PyValueError::new_err(
            format!("from_bytes takes a ggml block format, not {d}")
        )))?;
        Ok(QuantizedMatrix { w })
    }

    fn __repr__(&self) -> String {
        let (r, c) = self.shape();
        format!(
            "QuantizedMatrix({}, shape=({r}, {c}), nbytes={})",
            self.dtype(),
            self.nbytes()
        )
    }
}

/// Quantizes w (float32 [rows, cols]) to `dtype`: a ggml block format (q4_0, q4_1, q5_0,
/// q5_1, q8_0), a K-quant (q2_k … q6_k, q8_k), 4-bit groups (int4_g32/64/128), per-channel
/// INT8 (i8) or FP8 (f8e4m3, f8e5m2; per-channel scales). Rows must be whole blocks.
///
/// acts: how qmatmul with up to 64 activation rows takes them over block formats: "f32"
/// (the default here: exact), "a16" (16 bits per 32 values as two 8-bit planes through
/// the integer kernels) or "int8" (8 bits, as llama.cpp); int8_acts=True is "int8".
#[pyfunction]
#[pyo3(signature = (w, dtype, *, int8_acts=false, acts=None))]
pub fn quantize(
    py: Python<'_>,
    w: &Bound<'_, PyAny>,
    dtype: &str,
    int8_acts: bool,
    acts: Option<&str>,
) -> PyResult<QuantizedMatrix> {
    let mode = match (acts, int8_acts) {
        (None, false) => tessera_engine::linear::Activations::F32,
        _ => crate::engine::activations(acts, int8_acts)?,
    };
    let d = parse_format(dtype)?;
    let a = borrow("w", w)?;
    a.raw.expect("w", Elem::F32)?;
    if a.raw.rank() != 2 {
        return Err(PyValueError::new_err(format!(
            "w: shape {:?}, expected [rows, cols]",
            a.raw.dims
        )));
    }
    let (rows, cols) = (a.raw.dims[0], a.raw.dims[1]);
    if cols % d.block_size() != 0 {
        return Err(PyValueError::new_err(format!(
            "{d} stores rows in blocks of {} values; {cols} columns is not a multiple",
            d.block_size()
        )));
    }
    let raw = &a.raw;
    let w = py.detach(|| {
        // SAFETY: `a` is alive and float32; only read here.
        let v = unsafe { raw.view::<f32>() }?;
        // A strided view is gathered once; a contiguous one is read where it is.
        let gathered: Vec<f32>;
        let data = match v.as_contiguous() {
            Some(s) => s,
            None => {
                // SAFETY: as above; the span covers every (r, c) at r·s0 + c·s1.
                let all = unsafe { raw.slice::<f32>() };
                let (s0, s1) = (raw.strides[0], raw.strides[1]);
                gathered = (0..rows)
                    .flat_map(|r| (0..cols).map(move |c| all[r * s0 + c * s1]))
                    .collect();
                &gathered
            }
        };
        let mut w = quantize_matrix(d, rows, cols, data).map_err(engine_err)?;
        w.set_activations(mode);
        Ok::<_, PyErr>(w)
    })?;
    Ok(QuantizedMatrix { w })
}

/// The matrix's values as float32 [rows, cols] (what the kernels multiply by).
#[pyfunction]
#[pyo3(signature = (q, out=None))]
pub fn dequantize<'py>(
    py: Python<'py>,
    q: &QuantizedMatrix,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (rows, cols) = q.shape();
    let (obj, o) = output(py, out, &[rows, cols], &[])?;
    if !o.raw.is_contiguous() {
        return Err(PyValueError::new_err("out: must be contiguous"));
    }
    let or = &o.raw;
    py.detach(|| {
        // SAFETY: `o` is alive, float32, writeable and checked to be [rows, cols]
        // contiguous; nothing else views it.
        let dst = unsafe { or.slice_mut::<f32>() };
        for (r, row) in dst.chunks_exact_mut(cols.max(1)).enumerate().take(rows) {
            q.w.row(r, row).map_err(engine_err)?;
        }
        Ok::<_, PyErr>(())
    })?;
    Ok(obj)
}

/// `out = x·Wᵀ` for x float32 [M, cols] and a QuantizedMatrix W [rows, cols]; out [M, rows].
#[pyfunction]
#[pyo3(signature = (x, q, out=None))]
pub fn qmatmul<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    q: &QuantizedMatrix,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let x = borrow("x", x)?;
    if x.raw.elem != Elem::F32 {
        return Err(PyTypeError::new_err(format!(
            "x: expected float32, got {}",
            x.raw.elem.name()
        )));
    }
    let (rows, cols) = q.shape();
    if x.raw.rank() != 2 || x.raw.dims[1] != cols {
        return Err(PyValueError::new_err(format!(
            "qmatmul: x {:?} must be [M, {cols}] for W [{rows}, {cols}]",
            x.raw.dims
        )));
    }
    let (obj, o) = output(py, out, &[x.raw.dims[0], rows], &[("x", &x.raw)])?;
    let (xr, or) = (&x.raw, &o.raw);
    py.detach(|| {
        // SAFETY: alive, typed and disjoint (checked above).
        let xv: TensorView<'_, f32> = unsafe { xr.view() }?;
        // SAFETY: as for x: out is alive, float32, writeable and disjoint from x.
        let mut ov = unsafe { or.view_mut::<f32>() }?;
        q.w.forward(&xv, &mut ov).map_err(engine_err)
    })?;
    Ok(obj)
}
