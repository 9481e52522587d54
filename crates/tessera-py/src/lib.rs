//! `tessera._tessera`, the extension module of the `tessera` Python package
//! (crates/tessera-py/python/tessera wraps it): Tessera's kernels on caller-owned numpy
//! arrays and DLPack tensors without copies (`array`, `kernels`, `quant`), and the
//! engine (`engine`). Errors are Python exceptions (ValueError for shapes and values,
//! TypeError for types), never a crash: every pointer a kernel reads is checked in
//! `array` first.

mod array;
mod engine;
mod kernels;
mod quant;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A kernel's error as a ValueError (they are all about the arguments: shapes,
/// parameters).
pub(crate) fn core_err(e: tessera_core::Error) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// An engine error as a ValueError.
pub(crate) fn engine_err(e: tessera_engine::Error) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// The instruction set the kernels run on this CPU (avx512, avx2, neon, scalar).
#[pyfunction]
fn isa() -> &'static str {
    tessera_core::Isa::best().name()
}

/// Threads the kernels use (TESSERA_THREADS, default: the CPUs available).
#[pyfunction]
fn threads() -> usize {
    tessera_kernels::pool::global().threads()
}

#[pymodule]
fn _tessera(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(kernels::gemm_py, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::attention_py, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::paged_attention_py, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::rms_norm, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::layer_norm, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::rope, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::swiglu, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::softmax, m)?)?;
    m.add_function(wrap_pyfunction!(quant::quantize, m)?)?;
    m.add_function(wrap_pyfunction!(quant::dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(quant::qmatmul, m)?)?;
    m.add_function(wrap_pyfunction!(isa, m)?)?;
    m.add_function(wrap_pyfunction!(threads, m)?)?;
    m.add_class::<quant::QuantizedMatrix>()?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<engine::TextIter>()?;
    m.add("FORMATS", quant::formats())?;
    Ok(())
}
