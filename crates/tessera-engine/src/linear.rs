//! Linear layers `y = x·Wᵀ`, one trait for every weight format, so the model code is
//! written once ([`crate::llama`] holds `Box<dyn Linear>`s, never a per-format copy).

use crate::gguf::{Gguf, TensorInfo};
use crate::{Error, Result};
use tessera_core::{DType, Isa, TensorView, TensorViewMut};
use tessera_kernels::ops::gemm::{gemm_with, tuned_blocking, GemmParams};
use tessera_kernels::ops::qmatmul::{
    packed_compute_unit, qmatmul, qmatmul_fp8, qmatmul_i8, qmatmul_packed, qmatmul_packed_a16,
    PackedWeights,
};
use tessera_kernels::quant::{blocks_from_bytes, BlockFormat, Fp8Matrix, Int8Matrix, QuantMatrix};
use tessera_kernels::registry::ComputeUnit;
use tessera_kernels::with_block_format;

/// A weight matrix `W [out, in]` applied as `y [m, out] = x [m, in]·Wᵀ`. (`Any`, so
/// that [`stack`] can recognise layers of one format.)
pub trait Linear: std::any::Any + Send + Sync + std::fmt::Debug {
    /// Width of the input rows.
    fn in_features(&self) -> usize;
    /// Width of the output rows.
    fn out_features(&self) -> usize;
    /// `y = x·Wᵀ` for `x [n, in]`, `y [n, out]`.
    fn forward(&self, x: &TensorView<'_, f32>, y: &mut TensorViewMut<'_, f32>) -> Result<()>;
    /// The arithmetic [`Linear::forward`] over `n` rows is bounded by (what a profile
    /// measures the call against): f32 FMAs unless the layer runs integer dots.
    fn compute_unit(&self, _n: usize) -> ComputeUnit {
        ComputeUnit::Fma
    }
    /// Row `r` of W as f32 (embedding lookups through a tied output matrix).
    fn row(&self, r: usize, out: &mut [f32]) -> Result<()>;
    /// The weights' storage format.
    fn dtype(&self) -> DType;
    /// Bytes of the weights as stored (a matmul must read them all).
    fn weight_bytes(&self) -> usize;
    /// The f32 weights `[out, in]` of a dense layer (None for quantized ones), for
    /// re-encoding at load.
    fn dense_weights(&self) -> Option<&[f32]> {
        None
    }
    /// Sets how decode- and batch-size matmuls take their activations where the weight
    /// format has integer paths (the block formats); a no-op otherwise.
    fn set_activations(&mut self, _: Activations) {}
    /// The weights as ggml blocks, row-major in their GGUF bytes, with their format:
    /// what a device's block-format matmul uploads. None for other formats and for
    /// layers repacked for integer activations (which no longer hold the blocks).
    fn ggml_blocks(&self) -> Option<(DType, &[u8])> {
        None
    }
    /// The vector added to every output row, if the layer has one.
    fn bias(&self) -> Option<&[f32]> {
        None
    }
    /// Whether the weights lie in 2 MiB-page chunks (packed while loading with
    /// `LoadOptions::large_pages`).
    fn in_large_pages(&self) -> bool {
        false
    }
}

/// How matmuls of up to `INT8_BATCH_M` rows over block-format weights take their
/// activations (`--acts`). Prefill (more rows) runs f32 activations through dequantize
/// + GEMM in every mode but `Int8`, where the integer path is faster for some formats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// f32: each weight expanded to f32 in registers. Exact; on an Intel AVX-512 host
    /// it decoded the default model at 131–148 tok/s against `A16`'s 312–326
    /// (docs/performance.md).
    F32,
    /// 16 bits per value per 32-block, as two 8-bit planes through the integer kernels
    /// (`qmatmul_a16`): a rounding step of 1/64 770 of each block's largest value, finer
    /// than the default f16 KV cache's, at close to the integer kernels' speed.
    #[default]
    A16,
    /// 8 bits per 32-block, as llama.cpp: the fastest, about 1% perplexity.
    Int8,
}

impl Activations {
    /// The names `--acts` takes.
    pub const NAMES: [&'static str; 3] = ["f32", "a16", "int8"];

    /// This mode's name in [`Activations::NAMES`].
    pub fn name(self) -> &'static str {
        match self {
            Activations::F32 => "f32",
            Activations::A16 => "a16",
            Activations::Int8 => "int8",
        }
    }

    /// Parses one of [`Activations::NAMES`].
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "f32" => Ok(Activations::F32),
            "a16" => Ok(Activations::A16),
            "int8" => Ok(Activations::Int8),
            _ => Err(Error::Model(format!(
                "unknown activation precision '{name}' (one of: {})",
                Activations::NAMES.join(", ")
            ))),
        }
    }
}

/// Errors unless row `r` of a `rows × cols` matrix fits `out`.
fn check_row(r: usize, out: &[f32], rows: usize, cols: usize) -> Result<()> {
    if r >= rows || out.len() != cols {
        return Err(Error::Model(format!(
            "row {r} of a {rows}×{cols} matrix into {} values",
            out.len()
        )));
    }
    Ok(())
}

/// Block-quantized weights, kept quantized; matmuls dequantize in registers.
#[derive(Debug)]
pub struct QuantLinear<B> {
    w: Stored<B>,
}

/// One copy of the weights, in the form the enabled path reads.
#[derive(Debug)]
enum Stored<B> {
    /// As loaded: f32-activation kernels.
    Blocks(QuantMatrix<B>),
    /// Repacked for integer activations (16-bit as two planes, or 8-bit) on decode and
    /// batch-size matmuls (≤ 64 rows, `INT8_BATCH_M`); its
    /// rows are the format's values bit for bit, so prefill (f32 activations through
    /// dequantize + GEMM, except where the integer path is faster: `qmatmul_packed`) and
    /// embedding rows read it too, and the blocks are dropped.
    Packed(PackedWeights, Activations),
}

impl<B> QuantLinear<B> {
    /// A layer over block-format weights.
    pub fn new(w: QuantMatrix<B>) -> Self {
        QuantLinear {
            w: Stored::Blocks(w),
        }
    }
}

impl<B: BlockFormat> QuantLinear<B> {
    fn matrix(&self) -> &dyn RowMatrix {
        match &self.w {
            Stored::Blocks(w) => w,
            Stored::Packed(w, _) => w,
        }
    }
}

impl<B: BlockFormat> Linear for QuantLinear<B> {
    fn in_features(&self) -> usize {
        self.matrix().cols()
    }
    fn out_features(&self) -> usize {
        self.matrix().rows()
    }
    fn forward(&self, x: &TensorView<'_, f32>, y: &mut TensorViewMut<'_, f32>) -> Result<()> {
        let threads = tessera_kernels::pool::global().threads();
        Ok(match &self.w {
            Stored::Packed(w, Activations::A16) => {
                qmatmul_packed_a16(Isa::best(), threads, w, x, y)
            }
            _ => self.matrix().matmul(threads, x, y),
        }?)
    }
    fn compute_unit(&self, n: usize) -> ComputeUnit {
        match &self.w {
            Stored::Blocks(_) => ComputeUnit::Fma,
            Stored::Packed(w, acts) => {
                packed_compute_unit(Isa::best(), w, n, *acts == Activations::A16)
            }
        }
    }
    /// Packs the weights for an integer mode. Packing drops the blocks, so a packed layer
    /// switches only between the integer modes (the loader sets the mode once).
    fn set_activations(&mut self, a: Activations) {
        match (&mut self.w, a) {
            (_, Activations::F32) => {}
            (Stored::Blocks(w), a) => self.w = Stored::Packed(PackedWeights::new(w), a),
            (Stored::Packed(_, mode), a) => *mode = a,
        }
    }
    fn row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        let m = self.matrix();
        check_row(r, out, m.rows(), m.cols())?;
        m.dequantize_row(r, out);
        Ok(())
    }
    fn dtype(&self) -> DType {
        B::DTYPE
    }
    fn ggml_blocks(&self) -> Option<(DType, &[u8])> {
        match &self.w {
            Stored::Blocks(w) => Some((B::DTYPE, w.as_bytes())),
            Stored::Packed(..) => None,
        }
    }
    fn weight_bytes(&self) -> usize {
        self.matrix().size_bytes()
    }
    fn in_large_pages(&self) -> bool {
        matches!(&self.w, Stored::Packed(w, _) if w.in_large_pages())
    }
}

/// Layers that read the same input (an attention block's q, k, v; an MLP's gate and
/// up) as one `[Σ out, in]` layer, whose outputs are the parts' side by side: one matmul
/// then does the work of several, with one pool dispatch, one activation quantization
/// and one long weight stream (short ones are dominated by fixed costs at decode,
/// docs/performance.md). Row r of a part is row `Σ earlier outs + r` with the same
/// values. None unless every part is an unbiased block-format layer of one format and
/// K, stored the same way.
pub fn stack(parts: &[&dyn Linear]) -> Option<Box<dyn Linear>> {
    let dtype = parts.first()?.dtype();
    with_block_format!(dtype, B => QuantLinear::<B>::stack(parts), _ => None)
}

impl<B: BlockFormat> QuantLinear<B> {
    fn stack(parts: &[&dyn Linear]) -> Option<Box<dyn Linear>> {
        let stored: Vec<&Stored<B>> = parts
            .iter()
            .map(|&p| {
                (p as &dyn std::any::Any)
                    .downcast_ref::<Self>()
                    .map(|q| &q.w)
            })
            .collect::<Option<_>>()?;
        let w = match stored[0] {
            Stored::Blocks(first) => {
                let mats = all_as(&stored, |w| match w {
                    Stored::Blocks(m) if m.cols() == first.cols() => Some(m),
                    _ => None,
                })?;
                let rows = mats.iter().map(|m| m.rows()).sum();
                let blocks = mats.iter().flat_map(|m| m.blocks().iter().cloned());
                let stacked = QuantMatrix::from_blocks(rows, first.cols(), blocks.collect());
                Stored::Blocks(stacked.ok()?)
            }
            &Stored::Packed(_, acts) => {
                let packed = all_as(&stored, |w| match w {
                    Stored::Packed(p, a) if *a == acts => Some(p),
                    _ => None,
                })?;
                Stored::Packed(PackedWeights::stack(&packed).ok()?, acts)
            }
        };
        Some(Box::new(QuantLinear { w }))
    }
}

/// Every item's `pick`, or None if one has none.
fn all_as<'a, S, T>(items: &[&'a S], pick: impl Fn(&'a S) -> Option<&'a T>) -> Option<Vec<&'a T>> {
    items.iter().map(|&s| pick(s)).collect()
}

/// Row-scaled weight matrices with their own f32-activation matmul: per-channel INT8
/// and FP8. One [`MatrixLinear`] serves them all.
pub trait RowMatrix: Send + Sync + std::fmt::Debug {
    /// Output features.
    fn rows(&self) -> usize;
    /// Input features.
    fn cols(&self) -> usize;
    /// Bytes of weights and scales.
    fn size_bytes(&self) -> usize;
    /// The storage format.
    fn dtype(&self) -> DType;
    /// Row r's f32 values (r < rows, `out.len() == cols`: checked by the caller).
    fn dequantize_row(&self, r: usize, out: &mut [f32]);
    /// `y = x·Wᵀ` with f32 activations on up to `threads` threads.
    fn matmul(
        &self,
        threads: usize,
        x: &TensorView<'_, f32>,
        y: &mut TensorViewMut<'_, f32>,
    ) -> tessera_core::Result<()>;
}

/// [`RowMatrix`] for a matrix type with the same inherent methods and its matmul
/// (optionally generic over one bounded parameter).
macro_rules! row_matrix {
    ($t:ty, $matmul:path $(, $g:ident: $bound:path)?) => {
        impl$(<$g: $bound>)? RowMatrix for $t {
            fn rows(&self) -> usize {
                <$t>::rows(self)
            }
            fn cols(&self) -> usize {
                <$t>::cols(self)
            }
            fn size_bytes(&self) -> usize {
                <$t>::size_bytes(self)
            }
            fn dtype(&self) -> DType {
                <$t>::dtype(self)
            }
            fn dequantize_row(&self, r: usize, out: &mut [f32]) {
                <$t>::dequantize_row(self, r, out)
            }
            fn matmul(
                &self,
                threads: usize,
                x: &TensorView<'_, f32>,
                y: &mut TensorViewMut<'_, f32>,
            ) -> tessera_core::Result<()> {
                $matmul(Isa::best(), threads, self, x, y)
            }
        }
    };
}
row_matrix!(Int8Matrix, qmatmul_i8);
row_matrix!(Fp8Matrix, qmatmul_fp8);
row_matrix!(PackedWeights, qmatmul_packed);
row_matrix!(QuantMatrix<B>, qmatmul, B: BlockFormat);

/// A linear layer over a [`RowMatrix`] (`--quantize i8`, `f8e4m3`, `f8e5m2`).
#[derive(Debug)]
pub struct MatrixLinear<M> {
    w: M,
}

impl<M> MatrixLinear<M> {
    /// A layer over `w`.
    pub fn new(w: M) -> Self {
        MatrixLinear { w }
    }
}

impl<M: RowMatrix + 'static> Linear for MatrixLinear<M> {
    fn in_features(&self) -> usize {
        self.w.cols()
    }
    fn out_features(&self) -> usize {
        self.w.rows()
    }
    fn forward(&self, x: &TensorView<'_, f32>, y: &mut TensorViewMut<'_, f32>) -> Result<()> {
        let pool = tessera_kernels::pool::global();
        Ok(self.w.matmul(pool.threads(), x, y)?)
    }
    fn row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        check_row(r, out, self.w.rows(), self.w.cols())?;
        self.w.dequantize_row(r, out);
        Ok(())
    }
    fn dtype(&self) -> DType {
        self.w.dtype()
    }
    fn weight_bytes(&self) -> usize {
        self.w.size_bytes()
    }
}

/// f32 weights through the GEMM.
#[derive(Debug)]
pub struct DenseLinear {
    w: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl Linear for DenseLinear {
    fn in_features(&self) -> usize {
        self.cols
    }
    fn out_features(&self) -> usize {
        self.rows
    }
    fn forward(&self, x: &TensorView<'_, f32>, y: &mut TensorViewMut<'_, f32>) -> Result<()> {
        let wt = TensorView::contiguous(&self.w, &[self.rows, self.cols])?.transposed(0, 1)?;
        let isa = Isa::best();
        let m = x.dims().first().copied().unwrap_or(0);
        Ok(gemm_with(
            isa,
            tuned_blocking(isa, DType::F32, m, self.rows, self.cols),
            x,
            &wt,
            y,
            GemmParams::default(),
        )?)
    }
    fn row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        check_row(r, out, self.rows, self.cols)?;
        out.copy_from_slice(&self.w[r * self.cols..(r + 1) * self.cols]);
        Ok(())
    }
    fn dtype(&self) -> DType {
        DType::F32
    }
    fn weight_bytes(&self) -> usize {
        4 * self.w.len()
    }
    fn dense_weights(&self) -> Option<&[f32]> {
        Some(&self.w)
    }
}

impl DenseLinear {
    /// An f32 matrix `[rows, cols]`, row-major.
    pub fn new(w: Vec<f32>, rows: usize, cols: usize) -> Result<Self> {
        if rows.checked_mul(cols) != Some(w.len()) {
            return Err(Error::Model(format!(
                "{} values for a {rows}×{cols} matrix",
                w.len()
            )));
        }
        Ok(DenseLinear { w, rows, cols })
    }
}

/// A layer plus a bias vector (`y = x·Wᵀ + b`), as in Qwen2's q/k/v projections.
#[derive(Debug)]
pub struct Biased {
    /// The layer without its bias.
    pub inner: Box<dyn Linear>,
    /// Added to every output row.
    pub bias: Vec<f32>,
}

impl Linear for Biased {
    fn in_features(&self) -> usize {
        self.inner.in_features()
    }
    fn out_features(&self) -> usize {
        self.inner.out_features()
    }
    fn forward(&self, x: &TensorView<'_, f32>, y: &mut TensorViewMut<'_, f32>) -> Result<()> {
        self.inner.forward(x, y)?;
        let layout = *y.layout();
        let data = y.data_mut();
        for i in 0..layout.dims()[0] {
            for (j, b) in self.bias.iter().enumerate() {
                data[layout.index_of(&[i, j])] += b;
            }
        }
        Ok(())
    }
    fn row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        self.inner.row(r, out)
    }
    fn dtype(&self) -> DType {
        self.inner.dtype()
    }
    fn weight_bytes(&self) -> usize {
        self.inner.weight_bytes() + 4 * self.bias.len()
    }
    fn set_activations(&mut self, a: Activations) {
        self.inner.set_activations(a)
    }
    fn compute_unit(&self, n: usize) -> ComputeUnit {
        self.inner.compute_unit(n)
    }
    fn ggml_blocks(&self) -> Option<(DType, &[u8])> {
        self.inner.ggml_blocks()
    }
    fn bias(&self) -> Option<&[f32]> {
        Some(&self.bias)
    }
    fn in_large_pages(&self) -> bool {
        self.inner.in_large_pages()
    }
}

/// Loads a 2-D GGUF tensor as a linear layer, keeping its format (f16/bf16 widen to f32).
pub fn load(g: &Gguf, t: &TensorInfo) -> Result<Box<dyn Linear>> {
    if t.dims.len() != 2 {
        return Err(Error::Model(format!(
            "{}: expected a matrix, dims {:?}",
            t.name, t.dims
        )));
    }
    let (rows, cols) = t.rows_cols();
    let bytes = g.bytes(t);
    fn quant<B: BlockFormat>(rows: usize, cols: usize, bytes: &[u8]) -> Result<Box<dyn Linear>> {
        let blocks = blocks_from_bytes::<B>(bytes)?.to_vec();
        Ok(Box::new(QuantLinear::new(QuantMatrix::from_blocks(
            rows, cols, blocks,
        )?)))
    }
    if let Some(l) =
        with_block_format!(t.dtype, B => Some(quant::<B>(rows, cols, bytes)), _ => None)
    {
        return l;
    }
    match t.dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(Box::new(DenseLinear {
            w: floats(t, bytes)?,
            rows,
            cols,
        })),
        d => Err(Error::Model(format!(
            "{}: {d} weights are not supported",
            t.name
        ))),
    }
}

/// A float tensor's values widened to f32.
pub fn floats(t: &TensorInfo, bytes: &[u8]) -> Result<Vec<f32>> {
    widen(t.dtype, bytes).map_err(|e| Error::Model(format!("{}: {e}", t.name)))
}

/// Little-endian f32/f16/bf16 bytes widened to f32 (GGUF and safetensors alike).
pub fn widen(dtype: DType, bytes: &[u8]) -> Result<Vec<f32>> {
    let conv: fn(&[u8]) -> f32 = match dtype {
        DType::F32 => |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::F16 => |b| half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
        DType::BF16 => |b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        d => return Err(Error::Model(format!("expected a float tensor, got {d}"))),
    };
    Ok(bytes.chunks_exact(dtype.size_bytes()).map(conv).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_kernels::ops::qmatmul::INT8_BATCH_M;
    use tessera_kernels::quant::BlockQ4_1;

    /// What a profile judges a layer's matmul against: f32 FMAs for f32 activations,
    /// 8-bit dots wherever the integer kernels run (a batching step's rows, in both
    /// integer modes), through a bias wrapper too; and each answer is the path that
    /// `forward` takes.
    #[test]
    fn compute_unit_follows_the_activation_mode() {
        let (rows, cols) = (16, 64);
        let data: Vec<f32> = (0..rows * cols).map(|i| (i % 13) as f32 - 6.0).collect();
        let layer = |acts| {
            let mut l =
                QuantLinear::new(QuantMatrix::<BlockQ4_1>::quantize(rows, cols, &data).unwrap());
            l.set_activations(acts);
            Biased {
                inner: Box::new(l),
                bias: vec![0.5; rows],
            }
        };
        for m in [1, 16, INT8_BATCH_M] {
            assert_eq!(layer(Activations::F32).compute_unit(m), ComputeUnit::Fma);
            for acts in [Activations::A16, Activations::Int8] {
                assert_eq!(
                    layer(acts).compute_unit(m),
                    ComputeUnit::Int8Dot,
                    "{acts:?} m {m}"
                );
            }
        }
        // Past a batching step's rows, whichever path the kernels pick, the unit names it.
        let big = INT8_BATCH_M + 1;
        for acts in [Activations::A16, Activations::Int8] {
            let l = layer(acts);
            let Some(inner) =
                (l.inner.as_ref() as &dyn std::any::Any).downcast_ref::<QuantLinear<BlockQ4_1>>()
            else {
                panic!("a quantized layer");
            };
            let Stored::Packed(w, _) = &inner.w else {
                panic!("packed for {acts:?}");
            };
            let a16 = acts == Activations::A16;
            assert_eq!(
                l.compute_unit(big),
                packed_compute_unit(Isa::best(), w, big, a16)
            );
        }
    }
}
