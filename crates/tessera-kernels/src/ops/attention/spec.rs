//! Attention's registry entry.

use super::{attention_with, reference, AttentionParams};
use crate::ops::common::{bytes, poison, random};
use crate::ops::paged_attention::run_attention_on_device;
use crate::registry::on_device::OnDevice;
use crate::registry::standard_variants;
use crate::registry::{
    BenchProblem, ComputeUnit, Cost, Instance, OpSpec, ProblemCase, Rng, Tolerance, TuneConfig,
    TuneParam, TuneSpace, Variant,
};
use half::bf16;
use rand::Rng as _;
use std::fmt;
use tessera_core::device::{
    self, DeviceCall, FlashCall, FlashShape, PagedShape, FLASH_ATTENTION_OP,
};
use tessera_core::{AlignedVec, DType, Element, Error, Layout, Result, TensorView, TensorViewMut};

/// f32: the polynomial exp (≤ 3e-7 relative) and f32 sums over ≤ a few thousand keys.
pub const TOL_F32: Tolerance = Tolerance {
    rel: 2e-5,
    reason: "f32 exp polynomial + f32 sums over kv_len",
};
/// bf16 inputs are widened exactly; the reference uses the same rounded values.
pub const TOL_BF16: Tolerance = Tolerance {
    rel: 2e-5,
    reason: "exact widening, then as f32",
};

/// The device kernels that take 16-bit queries and write 16-bit outputs
/// ([`DeviceCall::FlashAttention`]): P is rounded to bf16 before P·V and O stored as
/// bf16, ~2⁻⁹ relative each, on top of f32 scores and sums.
pub const TOL_FLASH_BF16: Tolerance = Tolerance {
    rel: 1e-2,
    reason: "P rounded to bf16 before P·V, output stored as bf16",
};

/// The label suffix of a device's 16-bit flash variant (`cuda-flash`).
const FLASH: &str = "-flash";

/// Head widths the CUDA flash kernel is instantiated for (`flash_fwd_*_d64/_d128`).
const FLASH_HEAD_DIMS: [usize; 2] = [64, 128];

fn is_flash(v: &Variant) -> bool {
    v.backend.device_kind().is_some() && v.label.ends_with(FLASH)
}

/// One attention call.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionProblem {
    /// Query rows.
    pub q_len: usize,
    /// Key/value rows.
    pub kv_len: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (dividing `heads`: grouped-query attention).
    pub kv_heads: usize,
    /// Head width.
    pub d: usize,
    /// Causal mask.
    pub causal: bool,
    /// Sliding window: each query sees at most this many keys.
    pub window: Option<usize>,
    /// Q stored head-major and viewed token-major (non-contiguous strides).
    pub strided: bool,
}

impl fmt::Display for AttentionProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "q{} kv{} h{}/{} d{}",
            self.q_len, self.kv_len, self.heads, self.kv_heads, self.d
        )?;
        if self.causal {
            f.write_str(" causal")?;
        }
        if let Some(w) = self.window {
            write!(f, " win{w}")?;
        }
        if self.strided {
            f.write_str(" strided")?;
        }
        Ok(())
    }
}

impl AttentionProblem {
    fn visible_pairs(&self) -> f64 {
        (0..self.q_len)
            .map(|i| {
                let (a, b) =
                    reference::key_range(i, self.q_len, self.kv_len, self.causal, self.window);
                (b - a) as f64
            })
            .sum()
    }
}

/// The registry entry.
#[derive(Debug)]
pub struct AttentionOp;

impl OpSpec for AttentionOp {
    fn name(&self) -> &'static str {
        "attention"
    }
    fn summary(&self) -> &'static str {
        "flash attention (prefill): online softmax, causal/window, GQA"
    }
    fn dtypes(&self) -> &'static [DType] {
        &[DType::F32, DType::BF16]
    }
    /// Every CPU ISA and device, plus each device's 16-bit flash kernel where it has
    /// one (bf16 queries and outputs: a variant of its own, with its own tolerance).
    fn variants(&self, dtype: DType) -> Vec<Variant> {
        let mut v = standard_variants(self.name(), dtype);
        v.extend(
            device::installed()
                .into_iter()
                .filter(|d| dtype == DType::BF16 && d.supports(FLASH_ATTENTION_OP, dtype))
                .map(|d| Variant::device_labelled(d.kind(), &format!("{}{FLASH}", d.kind()))),
        );
        v
    }
    fn tolerance(&self, dtype: DType) -> Tolerance {
        if dtype == DType::BF16 {
            TOL_BF16
        } else {
            TOL_F32
        }
    }
    fn variant_tolerance(&self, dtype: DType, v: &Variant) -> Tolerance {
        if is_flash(v) {
            TOL_FLASH_BF16
        } else {
            self.tolerance(dtype)
        }
    }
    /// The flash kernels issue 16-bit matrix instructions (`mma.sync` on CUDA): they are
    /// bounded by the device's bf16 rate, not its f32 FMA.
    fn compute_unit(&self, _dtype: DType, v: &Variant) -> ComputeUnit {
        if is_flash(v) {
            ComputeUnit::Bf16Dot
        } else {
            ComputeUnit::Fma
        }
    }
    fn test_problems(&self, rng: &mut Rng) -> Vec<Box<dyn ProblemCase>> {
        let base = AttentionProblem {
            q_len: 1,
            kv_len: 1,
            heads: 1,
            kv_heads: 1,
            d: 8,
            causal: false,
            window: None,
            strided: false,
        };
        let mut v = vec![
            base.clone(),
            AttentionProblem {
                q_len: 7,
                kv_len: 7,
                heads: 2,
                kv_heads: 1,
                d: 16,
                causal: true,
                ..base.clone()
            },
            AttentionProblem {
                q_len: 33,
                kv_len: 127,
                heads: 3,
                kv_heads: 3,
                d: 33,
                causal: true,
                strided: true,
                ..base.clone()
            },
            AttentionProblem {
                q_len: 127,
                kv_len: 127,
                heads: 6,
                kv_heads: 2,
                d: 64,
                causal: true,
                ..base.clone()
            },
            AttentionProblem {
                q_len: 131,
                kv_len: 131,
                heads: 4,
                kv_heads: 1,
                d: 64,
                causal: true,
                window: Some(37),
                ..base.clone()
            },
            AttentionProblem {
                q_len: 65,
                kv_len: 200,
                heads: 2,
                kv_heads: 2,
                d: 7,
                window: Some(64),
                ..base.clone()
            },
            AttentionProblem {
                q_len: 1,
                kv_len: 300,
                heads: 9,
                kv_heads: 3,
                d: 64,
                causal: true,
                ..base.clone()
            },
            AttentionProblem {
                q_len: 70,
                kv_len: 150,
                heads: 4,
                kv_heads: 2,
                d: 128,
                causal: true,
                strided: true,
                ..base.clone()
            },
            AttentionProblem {
                q_len: 129,
                kv_len: 129,
                heads: 2,
                kv_heads: 1,
                d: 128,
                ..base.clone()
            },
        ];
        v.push(AttentionProblem {
            q_len: rng.random_range(1..100),
            kv_len: rng.random_range(100..260),
            heads: 4,
            kv_heads: 2,
            d: rng.random_range(1..80),
            causal: true,
            strided: true,
            ..base
        });
        v.into_iter()
            .map(|p| Box::new(p) as Box<dyn ProblemCase>)
            .collect()
    }
    fn bench_problems(&self) -> Vec<BenchProblem> {
        let p = |n, causal| AttentionProblem {
            q_len: n,
            kv_len: n,
            heads: 9,
            kv_heads: 3,
            d: 64,
            causal,
            window: None,
            strided: false,
        };
        vec![
            ("prefill-512-causal", Box::new(p(512, true))),
            ("prefill-2048-causal", Box::new(p(2048, true))),
        ]
    }
    fn parse_problem(&self, s: &str) -> Result<Box<dyn ProblemCase>> {
        let d = crate::registry::parse_dims("attention", s, 4, "SEQxHEADSxKV_HEADSxD (causal)")?;
        Ok(Box::new(AttentionProblem {
            q_len: d[0],
            kv_len: d[0],
            heads: d[1],
            kv_heads: d[2],
            d: d[3],
            causal: true,
            window: None,
            strided: false,
        }))
    }
}

impl ProblemCase for AttentionProblem {
    fn cost(&self, dtype: DType) -> Cost {
        let io = (self.q_len * self.heads + 2 * self.kv_len * self.kv_heads) * self.d;
        Cost {
            flops: 4.0 * self.d as f64 * self.heads as f64 * self.visible_pairs(),
            bytes: (io * dtype.size_bytes() + self.q_len * self.heads * self.d * 4) as f64,
        }
    }
    fn tune_space(&self) -> TuneSpace {
        let t = crate::pool::global().threads();
        TuneSpace(vec![TuneParam {
            name: "threads",
            default: t,
            choices: (1..=t).collect(),
        }])
    }
    /// The flash kernel has no window and only some head widths.
    fn supports(&self, _: DType, v: &Variant) -> bool {
        !is_flash(v) || (self.window.is_none() && FLASH_HEAD_DIMS.contains(&self.d))
    }
    fn instantiate(&self, dtype: DType, rng: &mut Rng) -> Result<Box<dyn Instance>> {
        match dtype {
            DType::F32 => Ok(Box::new(AttnInstance::<f32>::new(self.clone(), rng)?)),
            DType::BF16 => Ok(Box::new(AttnInstance::<bf16>::new(self.clone(), rng)?)),
            d => Err(Error::DType {
                op: "attention",
                dtype: d.to_string(),
            }),
        }
    }
}

/// Q (viewed through `lq`) packed into contiguous `[q_len, heads, d]` rows, widened.
fn packed_q<T: Element>(p: &AttentionProblem, q: &[T], lq: Layout) -> Vec<f32> {
    (0..p.q_len * p.heads * p.d)
        .map(|j| {
            let at = [j / (p.heads * p.d), j / p.d % p.heads, j % p.d];
            q[lq.index_of(&at)].to_f32()
        })
        .collect()
}

struct AttnInstance<T: Element> {
    p: AttentionProblem,
    q: AlignedVec<T>,
    k: AlignedVec<T>,
    v: AlignedVec<T>,
    o: AlignedVec<f32>,
    lq: Layout,
    dev: Option<OnDevice>,
}

impl<T: Element> AttnInstance<T> {
    fn new(p: AttentionProblem, rng: &mut Rng) -> Result<Self> {
        let lq = if p.strided {
            Layout::contiguous(&[p.heads, p.q_len, p.d])?.transposed(0, 1)?
        } else {
            Layout::contiguous(&[p.q_len, p.heads, p.d])?
        };
        let kv = p.kv_len * p.kv_heads * p.d;
        Ok(AttnInstance {
            q: random(rng, p.q_len * p.heads * p.d)?,
            k: random(rng, kv)?,
            v: random(rng, kv)?,
            o: AlignedVec::zeroed(p.q_len * p.heads * p.d)?,
            lq,
            p,
            dev: None,
        })
    }
    fn scale(&self) -> f32 {
        1.0 / (self.p.d as f32).sqrt()
    }

    /// The same call on a device ([`run_attention_on_device`]), as a paged call with one
    /// sequence whose K/V are one block of `kv_len` positions; Q packed into contiguous
    /// rows on the first run. A flash variant runs [`Self::run_flash_on_device`].
    fn run_on_device(&mut self, v: &Variant) -> Result<()> {
        if is_flash(v) {
            return self.run_flash_on_device(v);
        }
        let p = &self.p;
        let shape = PagedShape {
            block_tables: &[0],
            max_blocks: 1,
            context_lens: &[p.kv_len],
            q_lens: &[p.q_len],
            heads: p.heads,
            kv_heads: p.kv_heads,
            d: p.d,
            block_size: p.kv_len,
            scale: self.scale(),
            causal: p.causal,
            window: p.window,
        };
        let (q, lq) = (&self.q, self.lq);
        let pack = || packed_q(p, q, lq);
        run_attention_on_device(&mut self.dev, v, pack, (&self.k, &self.v), shape)
    }

    /// A [`DeviceCall::FlashAttention`]: Q, K, V and the output uploaded at 16 bits
    /// (the instance's bf16 values, exactly), the output widened when read back.
    fn run_flash_on_device(&mut self, v: &Variant) -> Result<()> {
        if T::DTYPE != DType::BF16 {
            return Err(Error::Unsupported(format!("{} on {}", v.label, T::DTYPE)));
        }
        let p = &self.p;
        let shape = FlashShape {
            q_len: p.q_len,
            kv_len: p.kv_len,
            heads: p.heads,
            kv_heads: p.kv_heads,
            d: p.d,
            scale: self.scale(),
            causal: p.causal,
        };
        let bits =
            |x: &[f32]| -> Vec<u16> { x.iter().map(|&x| bf16::from_f32(x).to_bits()).collect() };
        let widen = |b: &[T]| -> Vec<f32> { b.iter().map(|x| x.to_f32()).collect() };
        let (q, lq) = (&self.q, self.lq);
        // Packed once, with the upload: a timed run only launches.
        let state = OnDevice::ensure(&mut self.dev, v, |dev| {
            let half = |x: &[f32]| dev.upload_half(DType::BF16, &bits(x));
            let q = packed_q(p, q, lq);
            let bufs = vec![
                half(&q)?,
                half(&widen(&self.k))?,
                half(&widen(&self.v))?,
                half(&vec![f32::NAN; q.len()])?,
            ];
            Ok((bufs, 3))
        })?;
        let b = &state.bufs;
        state.device.run(&DeviceCall::FlashAttention(FlashCall {
            q: &b[0],
            k: &b[1],
            v: &b[2],
            out: &b[3],
            shape,
        }))?;
        state.ran = true;
        Ok(())
    }
}

impl<T: Element> Instance for AttnInstance<T> {
    fn reference(&self) -> Vec<f64> {
        let p = &self.p;
        let (d, group) = (p.d, p.heads / p.kv_heads);
        let row = |buf: &[T], j: usize, h: usize| -> Vec<f64> {
            buf[(j * p.kv_heads + h) * d..][..d]
                .iter()
                .map(|x| x.to_f64())
                .collect()
        };
        let mut out = vec![0.0; p.q_len * p.heads * d];
        for i in 0..p.q_len {
            for h in 0..p.heads {
                let q: Vec<f64> = (0..d)
                    .map(|c| self.q[self.lq.index_of(&[i, h, c])].to_f64())
                    .collect();
                let range = reference::key_range(i, p.q_len, p.kv_len, p.causal, p.window);
                let o = reference::attend(
                    &q,
                    range,
                    |j| row(&self.k, j, h / group),
                    |j| row(&self.v, j, h / group),
                    self.scale() as f64,
                );
                out[(i * p.heads + h) * d..][..d].copy_from_slice(&o);
            }
        }
        out
    }
    fn poison(&mut self) {
        poison(&mut self.o);
        OnDevice::reset_output(&mut self.dev, |n| vec![f32::NAN; n]);
    }
    fn run(&mut self, v: &Variant, cfg: &TuneConfig) -> Result<()> {
        if v.backend.device_kind().is_some() {
            return self.run_on_device(v);
        }
        OnDevice::host_ran(&mut self.dev);
        let p = &self.p;
        let kd = [p.kv_len, p.kv_heads, p.d];
        let params = AttentionParams {
            causal: p.causal,
            scale: self.scale(),
            window: p.window,
        };
        let threads = cfg
            .get("threads")
            .unwrap_or(crate::pool::global().threads());
        attention_with(
            v.isa()?,
            threads,
            &TensorView::new(&self.q, self.lq)?,
            &TensorView::contiguous(&self.k, &kd)?,
            &TensorView::contiguous(&self.v, &kd)?,
            &mut TensorViewMut::contiguous(&mut self.o, &[p.q_len, p.heads, p.d])?,
            params,
        )
    }
    fn output(&self) -> Vec<f64> {
        if let Some(out) = OnDevice::output(&self.dev) {
            return out.into_iter().map(f64::from).collect();
        }
        self.o.iter().map(|&x| x as f64).collect()
    }
    fn inject_nonfinite(&mut self, rng: &mut Rng) -> Option<Vec<usize>> {
        self.dev = None; // the device copy of q must be uploaded afresh
        let (i, h) = (
            rng.random_range(0..self.p.q_len),
            rng.random_range(0..self.p.heads),
        );
        let idx = self.lq.index_of(&[i, h, 0]);
        self.q[idx] = T::from_f32(f32::NAN);
        Some(((i * self.p.heads + h) * self.p.d..(i * self.p.heads + h + 1) * self.p.d).collect())
    }
    fn footprint(&self) -> usize {
        bytes(&self.q) + bytes(&self.k) + bytes(&self.v) + bytes(&self.o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::device::DeviceKind;
    use tessera_core::Isa;

    /// A flash variant is offered only the problems its kernel is built for and is held
    /// to its own tolerance; the op's other variants keep every problem and the dtype's.
    #[test]
    fn flash_variants_take_their_own_problems_and_tolerance() {
        let flash = Variant::device_labelled(DeviceKind::Cuda, "cuda-flash");
        let plain = Variant::device(DeviceKind::Cuda);
        let cpu = Variant::cpu(Isa::Scalar);
        let p = |d, window| AttentionProblem {
            q_len: 5,
            kv_len: 9,
            heads: 4,
            kv_heads: 2,
            d,
            causal: true,
            window,
            strided: true,
        };
        for (problem, on_flash) in [
            (p(64, None), true),
            (p(128, None), true),
            (p(64, Some(4)), false),
            (p(33, None), false),
            (p(256, None), false),
        ] {
            assert_eq!(problem.supports(DType::BF16, &flash), on_flash, "{problem}");
            assert!(problem.supports(DType::BF16, &plain), "{problem}");
            assert!(problem.supports(DType::F32, &cpu), "{problem}");
        }
        let op = AttentionOp;
        assert_eq!(op.variant_tolerance(DType::BF16, &flash), TOL_FLASH_BF16);
        assert_eq!(op.variant_tolerance(DType::BF16, &plain), TOL_BF16);
        assert_eq!(op.variant_tolerance(DType::F32, &cpu), TOL_F32);
        // Bench reports the flash kernel against the device's bf16 matrix rate.
        assert_eq!(op.compute_unit(DType::BF16, &flash), ComputeUnit::Bf16Dot);
        assert_eq!(op.compute_unit(DType::BF16, &plain), ComputeUnit::Fma);
        // A CPU label that happens to end alike is not a device flash kernel.
        let odd = Variant::labelled(Isa::Scalar, "scalar-flash");
        assert!(p(33, None).supports(DType::BF16, &odd));
    }
}
