//! GEMM's registry entry: problems, instances, tolerances.

use super::{gemm_with, GemmInput, GemmParams};
use crate::ops::common::{bytes, poison, random};
use crate::registry::on_device::OnDevice;
use crate::registry::{
    device_variants, parse_dims, Backend, BenchProblem, ComputeUnit, Cost, Instance, OpSpec,
    ProblemCase, Rng, Tolerance, TuneConfig, TuneSpace, Variant,
};
use half::{bf16, f16};
use rand::Rng as _;
use std::fmt;
use tessera_core::device::{DeviceCall, DeviceMatrix};
use tessera_core::{
    AlignedVec, CpuFeatures, DType, Element, Error, Isa, Layout, Result, TensorView, TensorViewMut,
};

/// f32: the only error is f32 accumulation over K terms, which grows like √K·2⁻²⁴ on
/// random data (≈ 4e-6 at K = 4096 with margin); blocking reorders the sum, no more.
pub const TOL_F32: Tolerance = Tolerance {
    rel: 1e-5,
    reason: "f32 accumulation over K terms (~√K·2⁻²⁴)",
};
/// f16 inputs widen exactly to f32, so the f32 bound holds; the reference uses the same
/// rounded inputs.
pub const TOL_F16: Tolerance = Tolerance {
    rel: 1e-5,
    reason: "exact widening, then f32 accumulation",
};
/// bf16: products of two bf16 are exact in f32 and `vdpbf16ps` accumulates in f32, so
/// again only accumulation error (x2 margin for the pairwise sums' extra rounding).
pub const TOL_BF16: Tolerance = Tolerance {
    rel: 2e-5,
    reason: "exact bf16 products, f32 accumulation",
};

/// One GEMM call's shape and flags.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmProblem {
    /// Independent GEMMs in the batch.
    pub batch: usize,
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// A stored as [k, m] and viewed transposed.
    pub trans_a: bool,
    /// B stored as [n, k] and viewed transposed (the `x·Wᵀ` of linear layers).
    pub trans_b: bool,
    /// C stored as [n, m] and viewed transposed (non-unit column stride).
    pub trans_c: bool,
    /// Rows of A and C padded (row stride > width).
    pub padded: bool,
    /// Scale of A·B.
    pub alpha: f32,
    /// Scale of the existing C.
    pub beta: f32,
}

impl GemmProblem {
    /// A plain m×n×k problem: one GEMM, contiguous, α = 1, β = 0.
    pub fn square(m: usize, n: usize, k: usize) -> Self {
        GemmProblem {
            batch: 1,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            trans_c: false,
            padded: false,
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

impl fmt::Display for GemmProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = |b: bool| if b { "T" } else { "N" };
        write!(f, "{}x{}x{}", self.m, self.n, self.k)?;
        if self.batch > 1 {
            write!(f, " b{}", self.batch)?;
        }
        write!(
            f,
            " {}{}{}",
            t(self.trans_a),
            t(self.trans_b),
            t(self.trans_c)
        )?;
        if self.padded {
            f.write_str(" pad")?;
        }
        if self.alpha != 1.0 || self.beta != 0.0 {
            write!(f, " a={} b={}", self.alpha, self.beta)?;
        }
        Ok(())
    }
}

/// The registry entry.
#[derive(Debug)]
pub struct GemmOp;

impl OpSpec for GemmOp {
    fn name(&self) -> &'static str {
        "gemm"
    }
    fn summary(&self) -> &'static str {
        "C = αAB + βC, strided/transposed/batched, f32 accumulate"
    }
    fn dtypes(&self) -> &'static [DType] {
        &[DType::F32, DType::BF16, DType::F16]
    }
    fn variants(&self, dtype: DType) -> Vec<Variant> {
        Isa::available()
            .into_iter()
            .map(|isa| {
                let mut v = Variant::cpu(isa);
                if dtype == DType::BF16 && isa == Isa::Avx512 && CpuFeatures::get().avx512_bf16 {
                    v.label = "avx512-dpbf16".into();
                }
                v
            })
            .chain(device_variants("gemm", dtype))
            .collect()
    }
    /// CPU `dpbf16` variants and CUDA's 16-bit gemm are bounded by the bf16 rate: CUDA
    /// takes its tensor cores (`mma.sync`) for 16-bit operands whose layout they fit, so
    /// a layout that falls back to CUDA cores shows as a low share of that ceiling.
    fn compute_unit(&self, dtype: DType, v: &Variant) -> ComputeUnit {
        let tensor_cores = v.backend == Backend::Cuda && dtype != DType::F32;
        if tensor_cores || v.label.contains("dpbf16") {
            ComputeUnit::Bf16Dot
        } else {
            ComputeUnit::Fma
        }
    }
    fn tolerance(&self, dtype: DType) -> Tolerance {
        match dtype {
            DType::BF16 => TOL_BF16,
            DType::F16 => TOL_F16,
            _ => TOL_F32,
        }
    }
    fn test_problems(&self, rng: &mut Rng) -> Vec<Box<dyn ProblemCase>> {
        let mut shapes = vec![
            (1, 1, 1),
            (7, 33, 127),
            (127, 7, 33),
            (33, 127, 7),
            (1, 576, 64),
            (64, 1, 300),
            (13, 67, 1),
            (1000, 3, 2),
            (2, 1000, 5),
            (97, 131, 257),
            (5, 200, 600),
        ];
        shapes.extend((0..4).map(|_| {
            (
                rng.random_range(1..150),
                rng.random_range(1..200),
                rng.random_range(1..300),
            )
        }));
        let mut out: Vec<Box<dyn ProblemCase>> = Vec::new();
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            out.push(Box::new(GemmProblem {
                batch: if i % 4 == 3 { 3 } else { 1 },
                trans_a: i % 2 == 1,
                trans_b: i % 3 == 1,
                trans_c: i % 5 == 2,
                padded: i % 3 == 2,
                alpha: if i % 4 == 1 { 0.5 } else { 1.0 },
                beta: if i % 3 == 0 { 0.0 } else { -0.75 },
                ..GemmProblem::square(m, n, k)
            }));
        }
        // A linear layer's form, x·Wᵀ with β = 0 and K a multiple of 8: the views the
        // CUDA backend's tensor-core kernel takes, at ragged M and N and batched.
        for (batch, m, n, k) in [(1, 1, 7, 8), (1, 33, 127, 40), (2, 130, 257, 72)] {
            out.push(Box::new(GemmProblem {
                batch,
                trans_b: true,
                alpha: 0.5,
                ..GemmProblem::square(m, n, k)
            }));
        }
        out
    }
    fn bench_problems(&self) -> Vec<BenchProblem> {
        vec![
            ("square-512", Box::new(GemmProblem::square(512, 512, 512))),
            (
                "square-2048",
                Box::new(GemmProblem::square(2048, 2048, 2048)),
            ),
            (
                "prefill-512x1536x576",
                Box::new(GemmProblem {
                    trans_b: true,
                    ..GemmProblem::square(512, 1536, 576)
                }),
            ),
            (
                "decode-1x576x576",
                Box::new(GemmProblem {
                    trans_b: true,
                    ..GemmProblem::square(1, 576, 576)
                }),
            ),
        ]
    }
    fn parse_problem(&self, s: &str) -> Result<Box<dyn ProblemCase>> {
        let d = parse_dims("gemm", s, 3, "MxNxK")?;
        Ok(Box::new(GemmProblem::square(d[0], d[1], d[2])))
    }
}

impl ProblemCase for GemmProblem {
    fn cost(&self, dtype: DType) -> Cost {
        let (b, m, n, k) = (
            self.batch as f64,
            self.m as f64,
            self.n as f64,
            self.k as f64,
        );
        let c_traffic = if self.beta == 0.0 { 1.0 } else { 2.0 };
        Cost {
            flops: 2.0 * b * m * n * k,
            bytes: b * ((m * k + k * n) * dtype.size_bytes() as f64 + c_traffic * m * n * 4.0),
        }
    }
    fn tune_space(&self) -> TuneSpace {
        super::tune_space()
    }
    fn tune_dims(&self) -> Option<Vec<usize>> {
        Some(vec![self.m, self.n, self.k])
    }
    fn instantiate(&self, dtype: DType, rng: &mut Rng) -> Result<Box<dyn Instance>> {
        Ok(match dtype {
            DType::F32 => Box::new(GemmInstance::<f32>::new(self.clone(), rng)?),
            DType::F16 => Box::new(GemmInstance::<f16>::new(self.clone(), rng)?),
            DType::BF16 => Box::new(GemmInstance::<bf16>::new(self.clone(), rng)?),
            d => {
                return Err(Error::DType {
                    op: "gemm",
                    dtype: d.to_string(),
                })
            }
        })
    }
}

/// Buffers of one GEMM problem.
struct GemmInstance<T: Element> {
    p: GemmProblem,
    a: AlignedVec<T>,
    b: AlignedVec<T>,
    c: AlignedVec<f32>,
    c_init: AlignedVec<f32>,
    la: Layout,
    lb: Layout,
    lc: Layout,
    dev: Option<OnDevice>,
}

/// A [batch, rows, cols] layout, stored transposed and/or with padded rows when asked.
fn layout(batch: usize, rows: usize, cols: usize, trans: bool, pad: usize) -> Result<Layout> {
    let (r, c) = if trans { (cols, rows) } else { (rows, cols) };
    let ld = c + pad;
    let l = Layout::strided(&[batch, r, c], &[r * ld, ld, 1], 0)?;
    if trans {
        l.transposed(1, 2)
    } else {
        Ok(l)
    }
}

impl<T: GemmInput> GemmInstance<T> {
    fn new(p: GemmProblem, rng: &mut Rng) -> Result<Self> {
        let pad = if p.padded { 3 } else { 0 };
        let la = layout(p.batch, p.m, p.k, p.trans_a, pad)?;
        let lb = layout(p.batch, p.k, p.n, p.trans_b, 0)?;
        let lc = layout(p.batch, p.m, p.n, p.trans_c, pad)?;
        let c_init = random::<f32>(rng, lc.span()?)?;
        Ok(GemmInstance {
            a: random(rng, la.span()?)?,
            b: random(rng, lb.span()?)?,
            c: c_init.clone(),
            c_init,
            la,
            lb,
            lc,
            p,
            dev: None,
        })
    }
}

impl<T: GemmInput> GemmInstance<T> {
    /// The same buffers and strided views on the device: A and B in their own storage
    /// type (f32, or 16-bit f16/bf16 the device widens on load), C starts as the host C
    /// (poisoned, or β's input).
    fn run_on_device(&mut self, v: &Variant) -> Result<()> {
        let (a, b, c) = (&self.a, &self.b, &self.c);
        let state = OnDevice::ensure(&mut self.dev, v, |dev| {
            // Half-precision values round-trip exactly through f32.
            let put = |x: &AlignedVec<T>| {
                let wide = x.iter().map(|e| e.to_f32());
                match T::DTYPE {
                    DType::F16 => {
                        let bits: Vec<u16> = wide.map(|f| f16::from_f32(f).to_bits()).collect();
                        dev.upload_half(DType::F16, &bits)
                    }
                    DType::BF16 => {
                        let bits: Vec<u16> = wide.map(|f| bf16::from_f32(f).to_bits()).collect();
                        dev.upload_half(DType::BF16, &bits)
                    }
                    _ => dev.upload(&wide.collect::<Vec<f32>>()),
                }
            };
            Ok((vec![put(a)?, put(b)?, dev.upload(c)?], 2))
        })?;
        let view = |i: usize, l: &Layout| DeviceMatrix {
            buf: &state.bufs[i],
            offset: l.offset(),
            strides: [l.stride(0), l.stride(1), l.stride(2)],
        };
        let p = &self.p;
        state.device.run(&DeviceCall::Gemm {
            a: view(0, &self.la),
            b: view(1, &self.lb),
            c: view(2, &self.lc),
            dims: [p.batch, p.m, p.n, p.k],
            alpha: p.alpha,
            beta: p.beta,
        })?;
        state.ran = true;
        Ok(())
    }
}

impl<T: GemmInput> Instance for GemmInstance<T> {
    fn reference(&self) -> Vec<f64> {
        let at = |l: &Layout, v: &[T], b, i, j| v[l.index_of(&[b, i, j])].to_f64();
        let c0 = |b, i, j| self.c_init[self.lc.index_of(&[b, i, j])] as f64;
        super::reference::gemm_f64(
            (self.p.batch, self.p.m, self.p.n, self.p.k),
            |b, i, p| at(&self.la, &self.a, b, i, p),
            |b, p, j| at(&self.lb, &self.b, b, p, j),
            c0,
            self.p.alpha as f64,
            self.p.beta as f64,
        )
    }
    fn poison(&mut self) {
        if self.p.beta == 0.0 {
            poison(&mut self.c); // β = 0 must neither read C nor leave an element unwritten
        } else {
            self.c.copy_from_slice(&self.c_init);
        }
        let c = &self.c;
        OnDevice::reset_output(&mut self.dev, |_| c.to_vec());
    }
    fn run(&mut self, v: &Variant, cfg: &TuneConfig) -> Result<()> {
        if v.backend.device_kind().is_some() {
            return self.run_on_device(v);
        }
        OnDevice::host_ran(&mut self.dev);
        let blocking = super::blocking_from(v.isa()?, cfg);
        let a = TensorView::new(&self.a, self.la)?;
        let b = TensorView::new(&self.b, self.lb)?;
        let mut c = TensorViewMut::new(&mut self.c, self.lc)?;
        gemm_with(
            v.isa()?,
            blocking,
            &a,
            &b,
            &mut c,
            GemmParams {
                alpha: self.p.alpha,
                beta: self.p.beta,
            },
        )
    }
    fn output(&self) -> Vec<f64> {
        let device_c = OnDevice::output(&self.dev);
        let c: &[f32] = device_c.as_deref().unwrap_or(&self.c);
        let mut out = Vec::with_capacity(self.p.batch * self.p.m * self.p.n);
        for b in 0..self.p.batch {
            for i in 0..self.p.m {
                for j in 0..self.p.n {
                    out.push(c[self.lc.index_of(&[b, i, j])] as f64);
                }
            }
        }
        out
    }
    fn inject_nonfinite(&mut self, rng: &mut Rng) -> Option<Vec<usize>> {
        let (bt, i, p) = (
            rng.random_range(0..self.p.batch),
            rng.random_range(0..self.p.m),
            rng.random_range(0..self.p.k),
        );
        self.a[self.la.index_of(&[bt, i, p])] = T::from_f32(f32::NAN);
        Some(
            (0..self.p.n)
                .map(|j| (bt * self.p.m + i) * self.p.n + j)
                .collect(),
        )
    }
    fn footprint(&self) -> usize {
        bytes(&self.a) + bytes(&self.b) + bytes(&self.c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::device::DeviceKind;

    /// Bench's percentages: CUDA's 16-bit gemm against the tensor cores' bf16 rate, its
    /// f32 gemm and the plain CPU variants against f32 FMA.
    #[test]
    fn compute_unit_follows_the_instructions_a_variant_issues() {
        let (op, cuda) = (GemmOp, Variant::device(DeviceKind::Cuda));
        assert_eq!(op.compute_unit(DType::BF16, &cuda), ComputeUnit::Bf16Dot);
        assert_eq!(op.compute_unit(DType::F16, &cuda), ComputeUnit::Bf16Dot);
        assert_eq!(op.compute_unit(DType::F32, &cuda), ComputeUnit::Fma);
        let wgpu = Variant::device(DeviceKind::Wgpu);
        assert_eq!(op.compute_unit(DType::BF16, &wgpu), ComputeUnit::Fma);
        let dpbf16 = Variant::labelled(Isa::Avx512, "avx512-dpbf16");
        assert_eq!(op.compute_unit(DType::BF16, &dpbf16), ComputeUnit::Bf16Dot);
        assert_eq!(
            op.compute_unit(DType::BF16, &Variant::cpu(Isa::Scalar)),
            ComputeUnit::Fma
        );
    }
}
