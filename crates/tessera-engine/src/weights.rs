//! Where a model's tensors come from. The model asks for tensors by their GGUF names
//! (`blk.3.attn_q.weight`); each file format answers through [`WeightSource`] (GGUF
//! directly, Hugging Face safetensors by translating names in [`crate::hf`]), so the
//! Llama code never knows which format it was loaded from.
//!
//! [`LoadOptions::quantize`] re-encodes float matrices into a block format at load, the
//! same way for every source ([`quantize_target`] says which format a matrix whose rows
//! a K-quant cannot hold gets instead).

use crate::gguf::Gguf;
use crate::linear::{self, Activations, Linear, MatrixLinear, QuantLinear};
use crate::{Error, Result};
use tessera_core::DType;
use tessera_kernels::quant::fp8::Fp8;
use tessera_kernels::quant::{
    BlockFormat, Fp8Matrix, Fp8Scaling, Int8Matrix, QuantMatrix, BLOCK_DTYPES,
};
use tessera_kernels::with_block_format;

/// A model file's tensors by canonical (GGUF) name.
pub trait WeightSource {
    /// Whether the source has a tensor of this canonical name.
    fn has(&self, name: &str) -> bool;
    /// A 2-D tensor `[out, in]` as a linear layer in its stored format.
    fn matrix(&self, name: &str) -> Result<Box<dyn Linear>>;
    /// A 1-D float tensor (norm weights, biases) widened to f32.
    fn vector(&self, name: &str) -> Result<Vec<f32>>;
}

impl WeightSource for Gguf {
    fn has(&self, name: &str) -> bool {
        self.tensors.iter().any(|t| t.name == name)
    }
    fn matrix(&self, name: &str) -> Result<Box<dyn Linear>> {
        let t = self.tensor(name)?;
        let l = linear::load(self, t)?;
        self.release(t);
        Ok(l)
    }
    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.tensor(name)?;
        if t.dims.len() != 1 {
            return Err(Error::Model(format!(
                "{name}: expected a vector, dims {:?}",
                t.dims
            )));
        }
        linear::floats(t, self.bytes(t))
    }
}

/// Choices made while loading.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoadOptions {
    /// Re-encode every float (f32/f16/bf16) matrix in this block format; matrices already
    /// quantized in the file are kept as they are (re-quantizing would only add error).
    pub quantize: Option<DType>,
    /// How decode- and batch-size matmuls over block-format weights take their
    /// activations ([`Activations`]; default 16 bits as two 8-bit planes). In the integer
    /// modes the weights are repacked at load and held once (prefill dequantizes the
    /// packed rows, which are the format's values bit for bit).
    pub activations: Activations,
    /// Pack the weights into 2 MiB pages (Linux transparent huge pages, asked for with
    /// `madvise`; [`tessera_core::huge`]): fewer TLB misses as decode streams them, a
    /// slower first load where a virtual machine backs fresh memory lazily. Applies to
    /// this load only (the choice is scoped to it, per thread).
    pub large_pages: bool,
}

/// Formats `--quantize` accepts: every block format but Q8_K (llama.cpp's activation
/// format), per-channel INT8, and FP8 with per-channel scales.
pub fn quantize_formats() -> impl Iterator<Item = DType> {
    BLOCK_DTYPES
        .into_iter()
        .filter(|&d| d != DType::Q8_K)
        .chain([DType::I8, DType::F8E4M3, DType::F8E5M2])
}

/// The format a matrix gets when `target` cannot hold it: a K-quant needs rows that are
/// whole 256-weight super-blocks, so narrower rows (SmolLM2's 576) take the 32-weight
/// format nearest in size, as llama.cpp's quantizer falls back (Q4_K → Q5_0, Q5_K → Q5_1,
/// Q6_K → Q8_0; Q2_K/Q3_K → Q4_0, llama.cpp's IQ4_NL not being a format here); a 4-bit
/// group of 64 or 128 falls back to groups of 32.
pub fn quantize_target(target: DType, cols: usize) -> DType {
    if cols.is_multiple_of(target.block_size()) {
        return target;
    }
    match target {
        DType::Q2_K | DType::Q3_K => DType::Q4_0,
        DType::Q4_K => DType::Q5_0,
        DType::Q5_K => DType::Q5_1,
        DType::Int4G64 | DType::Int4G128 => DType::Int4G32,
        _ => DType::Q8_0,
    }
}

/// Parses a `--quantize` name (`q8_0`, `q4_1`, …).
pub fn parse_quantize(name: &str) -> Result<DType> {
    quantize_formats()
        .find(|d| d.to_string().eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            let names: Vec<String> = quantize_formats().map(|d| d.to_string()).collect();
            Error::Model(format!(
                "unknown quantization '{name}' (one of: {})",
                names.join(", ")
            ))
        })
}

/// `source.matrix(name)`, re-encoded per `opts`.
pub fn load_matrix(
    source: &dyn WeightSource,
    name: &str,
    opts: &LoadOptions,
) -> Result<Box<dyn Linear>> {
    let mut l = load_matrix_unpacked(source, name, opts)?;
    l.set_activations(opts.activations);
    Ok(l)
}

/// As [`load_matrix`], but the activation mode not set yet (so not packed for the
/// integer kernels): for layers stacked before packing ([`crate::linear::stack`]), which
/// then pack once instead of packing each part and copying.
pub fn load_matrix_unpacked(
    source: &dyn WeightSource,
    name: &str,
    opts: &LoadOptions,
) -> Result<Box<dyn Linear>> {
    reencode(source.matrix(name)?, name, opts)
}

/// `l` quantized to `opts.quantize` when it holds float weights.
fn reencode(l: Box<dyn Linear>, name: &str, opts: &LoadOptions) -> Result<Box<dyn Linear>> {
    let (Some(target), Some(w)) = (opts.quantize, l.dense_weights()) else {
        return Ok(l);
    };
    let (rows, cols) = (l.out_features(), l.in_features());
    let target = quantize_target(target, cols);
    quantize_matrix(target, rows, cols, w)
        .map_err(|e| Error::Model(format!("{name}: quantizing to {target}: {e}")))
}

/// `w [rows, cols]` (row-major f32) quantized to exactly `target`: any block format
/// (Q8_K included), per-channel INT8 (`i8`) or FP8 with per-channel scales. Rows that are
/// not whole blocks of `target` are an error, not a fallback (that is
/// [`quantize_target`]'s job, for model loading).
pub fn quantize_matrix(
    target: DType,
    rows: usize,
    cols: usize,
    w: &[f32],
) -> Result<Box<dyn Linear>> {
    fn q<B: BlockFormat + 'static>(rows: usize, cols: usize, w: &[f32]) -> Result<Box<dyn Linear>> {
        Ok(Box::new(QuantLinear::new(QuantMatrix::<B>::quantize(
            rows, cols, w,
        )?)))
    }
    if target == DType::I8 {
        return Ok(Box::new(MatrixLinear::new(Int8Matrix::quantize(
            rows, cols, w,
        )?)));
    }
    if let Some(f) = Fp8::of(target) {
        let m = Fp8Matrix::quantize(f, Fp8Scaling::PerChannel, rows, cols, w)?;
        return Ok(Box::new(MatrixLinear::new(m)));
    }
    with_block_format!(target,
        B => q::<B>(rows, cols, w),
        _ => Err(Error::Model(format!("cannot quantize to {target}")))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_quant_targets_fall_back_on_rows_they_cannot_hold() {
        assert_eq!(quantize_target(DType::Q4_K, 512), DType::Q4_K);
        assert_eq!(quantize_target(DType::Q4_K, 576), DType::Q5_0);
        assert_eq!(quantize_target(DType::Q5_K, 576), DType::Q5_1);
        assert_eq!(quantize_target(DType::Q6_K, 576), DType::Q8_0);
        assert_eq!(quantize_target(DType::Q2_K, 64), DType::Q4_0);
        assert_eq!(quantize_target(DType::Q4_1, 64), DType::Q4_1);
        assert_eq!(quantize_target(DType::Int4G128, 576), DType::Int4G32);
        assert_eq!(quantize_target(DType::Int4G64, 576), DType::Int4G64);
        assert!(parse_quantize("Q4_K").is_ok() && parse_quantize("q8_k").is_err());
    }
}
