//! Paged decode attention's registry entry.

use super::{paged_attention, PagedKvCache, PagedParams, PagedSeqs};
use crate::ops::attention::reference::attend;
use crate::ops::common::{bytes, poison, random};
use crate::registry::on_device::OnDevice;
use crate::registry::{
    BenchProblem, Cost, Instance, OpSpec, ProblemCase, Rng, Tolerance, TuneConfig, TuneSpace,
    Variant,
};
use half::{bf16, f16};
use rand::seq::SliceRandom;
use rand::Rng as _;
use std::fmt;
use tessera_core::device::{DeviceCall, PagedCall, PagedShape};
use tessera_core::{AlignedVec, DType, Element, Error, Result, TensorView, TensorViewMut};

/// f32 cache: polynomial exp and f32 sums over the context.
pub const TOL_F32: Tolerance = Tolerance {
    rel: 2e-5,
    reason: "f32 exp polynomial + f32 sums over the context",
};
/// bf16/f16 cache values are widened exactly; the reference reads the same values.
pub const TOL_BF16: Tolerance = Tolerance {
    rel: 2e-5,
    reason: "exact widening, then as f32",
};

/// i8 cache: codes widen exactly; a row's scale multiplies its f32 dot (K) or joins its
/// probability (V): one more f32 rounding per term than the reference's f64 products.
pub const TOL_I8: Tolerance = Tolerance {
    rel: 2e-5,
    reason: "exact widening, one f32 product by each row's scale",
};

/// A random K or V pool of `len` elements and its scales: uniform in [−1, 1) for a
/// float cache (no scales); for i8, codes over ±127 with one scale per `d`-wide row
/// drawn from 0.5/127 to 2/127 (rows of differing magnitude, as a model's keys have).
pub(crate) fn random_cache<T: Element>(
    rng: &mut Rng,
    len: usize,
    d: usize,
) -> Result<(AlignedVec<T>, Vec<f32>)> {
    if T::DTYPE != DType::I8 {
        return Ok((random(rng, len)?, Vec::new()));
    }
    let codes = crate::ops::common::random_in(rng, len, -127.49, 127.49)?;
    let scales = (0..len / d.max(1))
        .map(|_| rng.random_range(0.5f32..2.0) / 127.0)
        .collect();
    Ok((codes, scales))
}

/// The `d` values of the pool row at element `off` in f64, times its scale if scaled.
pub(crate) fn widen_row<T: Element>(vals: &[T], scales: &[f32], off: usize, d: usize) -> Vec<f64> {
    let s = scales.get(off / d.max(1)).map_or(1.0, |&s| s as f64);
    vals[off..off + d].iter().map(|x| x.to_f64() * s).collect()
}

/// Bytes of `positions` cached rows of `kv_heads·d` elements, keys and values, scales
/// included for i8.
pub(crate) fn cache_bytes(dtype: DType, positions: usize, kv_heads: usize, d: usize) -> usize {
    let scales = if dtype == DType::I8 { 4 * kv_heads } else { 0 };
    2 * positions * (kv_heads * d * dtype.size_bytes() + scales)
}

/// Sequences of given context lengths over a shared paged cache.
#[derive(Clone, Debug, PartialEq)]
pub struct PagedProblem {
    /// Each sequence's cached length (one query row each).
    pub context_lens: Vec<usize>,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub d: usize,
    /// Positions per block.
    pub block_size: usize,
}

impl fmt::Display for PagedProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: usize = self.context_lens.iter().sum();
        write!(
            f,
            "{} seqs ({} tok) h{}/{} d{} blk{}",
            self.context_lens.len(),
            total,
            self.heads,
            self.kv_heads,
            self.d,
            self.block_size
        )
    }
}

/// The registry entry.
#[derive(Debug)]
pub struct PagedAttentionOp;

impl OpSpec for PagedAttentionOp {
    fn name(&self) -> &'static str {
        "paged_attention"
    }
    fn summary(&self) -> &'static str {
        "decode attention over a paged KV cache, many sequences, GQA, split-K"
    }
    fn dtypes(&self) -> &'static [DType] {
        &[DType::F32, DType::BF16, DType::F16, DType::I8]
    }
    fn tolerance(&self, dtype: DType) -> Tolerance {
        match dtype {
            DType::BF16 | DType::F16 => TOL_BF16,
            DType::I8 => TOL_I8,
            _ => TOL_F32,
        }
    }
    fn test_problems(&self, rng: &mut Rng) -> Vec<Box<dyn ProblemCase>> {
        let mut v = vec![
            PagedProblem {
                context_lens: vec![1],
                heads: 1,
                kv_heads: 1,
                d: 8,
                block_size: 16,
            },
            PagedProblem {
                context_lens: vec![7, 33, 127],
                heads: 9,
                kv_heads: 3,
                d: 64,
                block_size: 16,
            },
            PagedProblem {
                context_lens: vec![600],
                heads: 4,
                kv_heads: 1,
                d: 33,
                block_size: 7,
            },
            PagedProblem {
                context_lens: vec![257, 1, 1000],
                heads: 2,
                kv_heads: 2,
                d: 128,
                block_size: 32,
            },
        ];
        v.push(PagedProblem {
            context_lens: (0..rng.random_range(1..6))
                .map(|_| rng.random_range(1..700))
                .collect(),
            heads: 6,
            kv_heads: 2,
            d: rng.random_range(1..100),
            block_size: rng.random_range(1..40),
        });
        v.into_iter()
            .map(|p| Box::new(p) as Box<dyn ProblemCase>)
            .collect()
    }
    fn bench_problems(&self) -> Vec<BenchProblem> {
        let p = |n, len| PagedProblem {
            context_lens: vec![len; n],
            heads: 9,
            kv_heads: 3,
            d: 64,
            block_size: 16,
        };
        vec![
            ("decode-1x512", Box::new(p(1, 512))),
            ("decode-16x2048", Box::new(p(16, 2048))),
        ]
    }
    fn parse_problem(&self, s: &str) -> Result<Box<dyn ProblemCase>> {
        let d =
            crate::registry::parse_dims("paged_attention", s, 5, "SEQSxCONTEXTxHEADSxKV_HEADSxD")?;
        Ok(Box::new(PagedProblem {
            context_lens: vec![d[1]; d[0]],
            heads: d[2],
            kv_heads: d[3],
            d: d[4],
            block_size: 16,
        }))
    }
}

impl ProblemCase for PagedProblem {
    fn cost(&self, dtype: DType) -> Cost {
        let tokens: usize = self.context_lens.iter().sum();
        let n = self.context_lens.len();
        Cost {
            flops: 4.0 * (tokens * self.heads * self.d) as f64,
            bytes: (cache_bytes(dtype, tokens, self.kv_heads, self.d)
                + 2 * n * self.heads * self.d * 4) as f64,
        }
    }
    fn tune_space(&self) -> TuneSpace {
        super::tune_space()
    }
    fn tune_dims(&self) -> Option<Vec<usize>> {
        let total = self.context_lens.iter().sum();
        Some(super::tune_dims(
            self.context_lens.len(),
            total,
            self.kv_heads,
            self.d,
        ))
    }
    fn instantiate(&self, dtype: DType, rng: &mut Rng) -> Result<Box<dyn Instance>> {
        match dtype {
            DType::F32 => Ok(Box::new(PagedInstance::<f32>::new(self.clone(), rng)?)),
            DType::BF16 => Ok(Box::new(PagedInstance::<bf16>::new(self.clone(), rng)?)),
            DType::F16 => Ok(Box::new(PagedInstance::<f16>::new(self.clone(), rng)?)),
            DType::I8 => Ok(Box::new(PagedInstance::<i8>::new(self.clone(), rng)?)),
            d => Err(Error::DType {
                op: "paged_attention",
                dtype: d.to_string(),
            }),
        }
    }
}

struct PagedInstance<T: Element> {
    p: PagedProblem,
    q: AlignedVec<f32>,
    k: AlignedVec<T>,
    v: AlignedVec<T>,
    /// Per-row scales of an i8 cache (empty for floats).
    ks: Vec<f32>,
    vs: Vec<f32>,
    o: AlignedVec<f32>,
    tables: Vec<u32>,
    max_blocks: usize,
    num_blocks: usize,
    dev: Option<OnDevice>,
}

impl<T: Element> PagedInstance<T> {
    fn new(p: PagedProblem, rng: &mut Rng) -> Result<Self> {
        let max_blocks = p
            .context_lens
            .iter()
            .map(|l| l.div_ceil(p.block_size))
            .max()
            .unwrap_or(0);
        let num_blocks = max_blocks * p.context_lens.len() + 3; // spare blocks never referenced
        let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
        ids.shuffle(rng); // tables point anywhere in the pool, out of order
        let cache_len = num_blocks * p.block_size * p.kv_heads * p.d;
        let n = p.context_lens.len();
        let (k, ks) = random_cache(rng, cache_len, p.d)?;
        let (v, vs) = random_cache(rng, cache_len, p.d)?;
        Ok(PagedInstance {
            q: random(rng, n * p.heads * p.d)?,
            k,
            v,
            ks,
            vs,
            o: AlignedVec::zeroed(n * p.heads * p.d)?,
            tables: ids[..n * max_blocks].to_vec(),
            max_blocks,
            num_blocks,
            p,
            dev: None,
        })
    }
    fn scale(&self) -> f32 {
        1.0 / (self.p.d as f32).sqrt()
    }

    /// The same call on a device ([`run_attention_on_device`]), one query row each.
    fn run_on_device(&mut self, v: &Variant) -> Result<()> {
        let p = &self.p;
        let shape = PagedShape {
            block_tables: &self.tables,
            max_blocks: self.max_blocks,
            context_lens: &p.context_lens,
            q_lens: &vec![1; p.context_lens.len()],
            heads: p.heads,
            kv_heads: p.kv_heads,
            d: p.d,
            block_size: p.block_size,
            scale: self.scale(),
            causal: true,
            window: None,
        };
        let q = &self.q;
        run_attention_on_device(&mut self.dev, v, || q.to_vec(), (&self.k, &self.v), shape)
    }
}

/// The 16-bit patterns of `b` (whose values `encode` holds exactly).
fn bits<T: Element>(b: &[T], encode: impl Fn(f32) -> u16) -> Vec<u16> {
    b.iter().map(|x| encode(x.to_f32())).collect()
}

/// Runs an attention instance (paged, varlen or dense) on device variant `v`: on the
/// first run the queries (`q()`, contiguous `[rows, heads, d]`), K and V (kept at 16
/// bits for a bf16/f16 cache, the form a device reads such a cache in; else f32) and a
/// NaN output are uploaded into `slot`; every run then only launches.
pub(crate) fn run_attention_on_device<T: Element>(
    slot: &mut Option<OnDevice>,
    v: &Variant,
    q: impl FnOnce() -> Vec<f32>,
    (k, vv): (&[T], &[T]),
    a: PagedShape<'_>,
) -> Result<()> {
    let out_len = a.q_lens.iter().sum::<usize>() * a.heads * a.d;
    let widen = |b: &[T]| b.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
    let state = OnDevice::ensure(slot, v, |dev| {
        let cache = |b: &[T]| match T::DTYPE {
            DType::BF16 => dev.upload_half(DType::BF16, &bits(b, |x| bf16::from_f32(x).to_bits())),
            DType::F16 => dev.upload_half(DType::F16, &bits(b, |x| f16::from_f32(x).to_bits())),
            _ => dev.upload(&widen(b)),
        };
        let bufs = vec![
            dev.upload(&q())?,
            cache(k)?,
            cache(vv)?,
            dev.upload(&vec![f32::NAN; out_len])?,
        ];
        Ok((bufs, 3))
    })?;
    let b = &state.bufs;
    state.device.run(&DeviceCall::PagedAttention(PagedCall {
        q: &b[0],
        k: &b[1],
        v: &b[2],
        out: &b[3],
        shape: a,
    }))?;
    state.ran = true;
    Ok(())
}

impl<T: Element> Instance for PagedInstance<T> {
    fn reference(&self) -> Vec<f64> {
        let p = &self.p;
        let (d, g) = (p.d, p.heads / p.kv_heads);
        let mut out = Vec::new();
        for (s, &len) in p.context_lens.iter().enumerate() {
            for h in 0..p.heads {
                let at = |buf: &[T], scales: &[f32], t: usize| -> Vec<f64> {
                    let b = self.tables[s * self.max_blocks + t / p.block_size] as usize;
                    let off = ((b * p.block_size + t % p.block_size) * p.kv_heads + h / g) * d;
                    widen_row(buf, scales, off, d)
                };
                let q: Vec<f64> = self.q[(s * p.heads + h) * d..][..d]
                    .iter()
                    .map(|&x| x as f64)
                    .collect();
                out.extend(attend(
                    &q,
                    (0, len),
                    |t| at(&self.k, &self.ks, t),
                    |t| at(&self.v, &self.vs, t),
                    self.scale() as f64,
                ));
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
        let dims = [self.p.context_lens.len(), self.p.heads, self.p.d];
        let params = PagedParams {
            scale: self.scale(),
            chunk: cfg.get("chunk").unwrap_or(0),
            threads: cfg
                .get("threads")
                .unwrap_or(crate::pool::global().threads()),
        };
        let seqs = PagedSeqs {
            block_tables: &self.tables,
            max_blocks: self.max_blocks,
            context_lens: &self.p.context_lens,
        };
        let cache = PagedKvCache {
            k: &self.k,
            v: &self.v,
            k_scales: &self.ks,
            v_scales: &self.vs,
            num_blocks: self.num_blocks,
            block_size: self.p.block_size,
            kv_heads: self.p.kv_heads,
            d: self.p.d,
        };
        paged_attention(
            v.isa()?,
            &TensorView::contiguous(&self.q, &dims)?,
            &cache,
            &seqs,
            &mut TensorViewMut::contiguous(&mut self.o, &dims)?,
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
        let (s, h) = (
            rng.random_range(0..self.p.context_lens.len()),
            rng.random_range(0..self.p.heads),
        );
        let at = (s * self.p.heads + h) * self.p.d;
        self.q[at] = f32::NAN;
        Some((at..at + self.p.d).collect())
    }
    fn footprint(&self) -> usize {
        bytes(&self.q) + bytes(&self.k) + bytes(&self.v) + bytes(&self.o)
    }
}
