//! Varlen paged attention's registry entry: ragged query runs (decode rows and prefill
//! chunks) over ragged contexts, block tables pointing anywhere in a pool with unused
//! blocks (holes), and prefix blocks shared between sequences, as prefix caching makes.

use super::{varlen_attention, VarlenParams, VarlenSeqs};
use crate::ops::attention::reference::attend;
use crate::ops::common::{bytes, poison, random};
use crate::ops::paged_attention::spec::{cache_bytes, random_cache, widen_row};
use crate::ops::paged_attention::{run_attention_on_device, PagedKvCache};
use crate::registry::on_device::OnDevice;
use crate::registry::{
    BenchProblem, Cost, Instance, OpSpec, ProblemCase, Rng, Tolerance, TuneConfig, TuneParam,
    TuneSpace, Variant,
};
use half::f16;
use rand::seq::SliceRandom;
use rand::Rng as _;
use std::fmt;
use tessera_core::device::PagedShape;
use tessera_core::{AlignedVec, DType, Element, Error, Layout, Result, TensorView, TensorViewMut};

/// f32 cache: the paged kernel's polynomial exp and f32 sums (decode rows) and the flash
/// kernel's online softmax (prefill rows), both within this over contexts of thousands.
pub const TOL_F32: Tolerance = Tolerance {
    rel: 2e-5,
    reason: "f32 exp polynomial + f32 sums over the context (paged and flash kernels)",
};
/// f16 cache values widen exactly; the reference reads the same values.
pub const TOL_HALF: Tolerance = Tolerance {
    rel: 2e-5,
    reason: "exact widening, then as f32",
};

/// One call: per sequence (query rows, context length), over one shared pool.
#[derive(Clone, Debug, PartialEq)]
pub struct VarlenProblem {
    /// (q_len, context_len) per sequence, q_len ≤ context_len.
    pub runs: Vec<(usize, usize)>,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub d: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Leading blocks every sequence shares with the first (where both have them).
    pub shared_blocks: usize,
}

impl fmt::Display for VarlenProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q: usize = self.runs.iter().map(|r| r.0).sum();
        let kv: usize = self.runs.iter().map(|r| r.1).sum();
        write!(
            f,
            "{} seqs ({q} q, {kv} kv) h{}/{} d{} blk{}",
            self.runs.len(),
            self.heads,
            self.kv_heads,
            self.d,
            self.block_size
        )?;
        if self.shared_blocks > 0 {
            write!(f, " shared{}", self.shared_blocks)?;
        }
        Ok(())
    }
}

/// The registry entry.
#[derive(Debug)]
pub struct VarlenAttentionOp;

impl OpSpec for VarlenAttentionOp {
    fn name(&self) -> &'static str {
        "varlen_attention"
    }
    fn summary(&self) -> &'static str {
        "causal attention of a batching step: decode rows and prefill chunks over a paged cache"
    }
    fn dtypes(&self) -> &'static [DType] {
        &[DType::F32, DType::F16, DType::I8]
    }
    fn tolerance(&self, dtype: DType) -> Tolerance {
        match dtype {
            DType::F16 => TOL_HALF,
            DType::I8 => crate::ops::paged_attention::TOL_I8,
            _ => TOL_F32,
        }
    }
    fn test_problems(&self, rng: &mut Rng) -> Vec<Box<dyn ProblemCase>> {
        let p = |runs: Vec<(usize, usize)>, heads, kv_heads, d, block_size, shared_blocks| {
            VarlenProblem {
                runs,
                heads,
                kv_heads,
                d,
                block_size,
                shared_blocks,
            }
        };
        let mut v = vec![
            p(vec![(1, 1)], 1, 1, 8, 16, 0),
            p(vec![(5, 5)], 2, 1, 16, 4, 0),
            p(
                vec![(1, 40), (17, 17), (1, 3), (9, 70), (12, 90), (13, 40)],
                9,
                3,
                64,
                16,
                0,
            ),
            p(vec![(3, 50), (1, 33), (20, 64), (1, 64)], 4, 2, 33, 16, 2),
            p(vec![(64, 300), (1, 300), (2, 2)], 6, 2, 24, 7, 0),
        ];
        let n = rng.random_range(2..7);
        let block_size = rng.random_range(1..24);
        let runs = (0..n)
            .map(|_| {
                let ctx = rng.random_range(1..200);
                let q = if rng.random_bool(0.5) {
                    1
                } else {
                    rng.random_range(1..=ctx)
                };
                (q, ctx)
            })
            .collect();
        v.push(p(runs, 4, 2, rng.random_range(1..80), block_size, 1));
        v.into_iter()
            .map(|p| Box::new(p) as Box<dyn ProblemCase>)
            .collect()
    }
    fn bench_problems(&self) -> Vec<BenchProblem> {
        // SmolLM2-135M's heads; 16 decodes at 512, and the same with a 256-token chunk.
        let p = |runs| VarlenProblem {
            runs,
            heads: 9,
            kv_heads: 3,
            d: 64,
            block_size: 16,
            shared_blocks: 0,
        };
        let mut mixed = vec![(1, 512); 15];
        mixed.push((256, 512));
        vec![
            ("decode-16x512", Box::new(p(vec![(1, 512); 16]))),
            ("mixed-15x512+256", Box::new(p(mixed))),
        ]
    }
    fn parse_problem(&self, s: &str) -> Result<Box<dyn ProblemCase>> {
        let d = crate::registry::parse_dims(
            "varlen_attention",
            s,
            6,
            "SEQSxQ_LENxCONTEXTxHEADSxKV_HEADSxD",
        )?;
        if d[1] > d[2] {
            return Err(Error::invalid(
                "varlen_attention",
                format!("{} queries over a context of {}", d[1], d[2]),
            ));
        }
        Ok(Box::new(VarlenProblem {
            runs: vec![(d[1], d[2]); d[0]],
            heads: d[3],
            kv_heads: d[4],
            d: d[5],
            block_size: 16,
            shared_blocks: 0,
        }))
    }
}

impl ProblemCase for VarlenProblem {
    fn cost(&self, dtype: DType) -> Cost {
        let (h, d) = (self.heads, self.d);
        // Query i of a run of q over ctx sees ctx − q + i + 1 keys.
        let visible: usize = self
            .runs
            .iter()
            .map(|&(q, ctx)| q * (ctx - q) + q * (q + 1) / 2)
            .sum();
        let kv: usize = self.runs.iter().map(|r| r.1).sum();
        let q: usize = self.runs.iter().map(|r| r.0).sum();
        Cost {
            flops: 4.0 * (visible * h * d) as f64,
            bytes: (cache_bytes(dtype, kv, self.kv_heads, d) + 2 * q * h * d * 4) as f64,
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
    fn instantiate(&self, dtype: DType, rng: &mut Rng) -> Result<Box<dyn Instance>> {
        match dtype {
            DType::F32 => Ok(Box::new(VarlenInstance::<f32>::new(self.clone(), rng)?)),
            DType::F16 => Ok(Box::new(VarlenInstance::<f16>::new(self.clone(), rng)?)),
            DType::I8 => Ok(Box::new(VarlenInstance::<i8>::new(self.clone(), rng)?)),
            d => Err(Error::DType {
                op: "varlen_attention",
                dtype: d.to_string(),
            }),
        }
    }
}

/// Extra floats between query rows, so the kernel must honour Q's row stride.
const Q_ROW_PAD: usize = 3;

struct VarlenInstance<T: Element> {
    p: VarlenProblem,
    /// `[total_q, heads, d]` with rows `heads·d + Q_ROW_PAD` apart.
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

impl<T: Element> VarlenInstance<T> {
    fn new(p: VarlenProblem, rng: &mut Rng) -> Result<Self> {
        let bs = p.block_size;
        let blocks = |ctx: usize| ctx.div_ceil(bs);
        let max_blocks = p.runs.iter().map(|r| blocks(r.1)).max().unwrap_or(0);
        let num_blocks = max_blocks * p.runs.len() + 5; // holes: blocks no table uses
        let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
        ids.shuffle(rng);
        let mut tables = ids[..p.runs.len() * max_blocks].to_vec();
        // Shared prefix: every sequence's leading blocks are the first sequence's.
        let shared = p.shared_blocks.min(blocks(p.runs[0].1));
        for s in 1..p.runs.len() {
            for b in 0..shared.min(blocks(p.runs[s].1)) {
                tables[s * max_blocks + b] = tables[b];
            }
        }
        let total_q: usize = p.runs.iter().map(|r| r.0).sum();
        let row = p.heads * p.d;
        let cache_len = num_blocks * bs * p.kv_heads * p.d;
        let (k, ks) = random_cache(rng, cache_len, p.d)?;
        let (v, vs) = random_cache(rng, cache_len, p.d)?;
        Ok(VarlenInstance {
            q: random(rng, total_q * (row + Q_ROW_PAD))?,
            k,
            v,
            ks,
            vs,
            o: AlignedVec::zeroed(total_q * row)?,
            tables,
            max_blocks,
            num_blocks,
            p,
            dev: None,
        })
    }
    fn scale(&self) -> f32 {
        1.0 / (self.p.d as f32).sqrt()
    }
    fn q_layout(&self) -> Result<Layout> {
        let (h, d) = (self.p.heads, self.p.d);
        let total_q = self.q.len() / (h * d + Q_ROW_PAD);
        Layout::strided(&[total_q, h, d], &[h * d + Q_ROW_PAD, d, 1], 0)
    }

    /// The same call on a device ([`run_attention_on_device`]): the queries packed
    /// into contiguous rows on the first run.
    fn run_on_device(&mut self, v: &Variant) -> Result<()> {
        let ql = self.q_layout()?;
        let (p, q) = (&self.p, &self.q);
        let (row, rows) = (p.heads * p.d, self.o.len());
        let pack = || {
            (0..rows)
                .map(|j| q[ql.index_of(&[j / row, j % row / p.d, j % p.d])])
                .collect()
        };
        let (q_lens, context_lens): (Vec<usize>, Vec<usize>) = p.runs.iter().copied().unzip();
        let shape = PagedShape {
            block_tables: &self.tables,
            max_blocks: self.max_blocks,
            context_lens: &context_lens,
            q_lens: &q_lens,
            heads: p.heads,
            kv_heads: p.kv_heads,
            d: p.d,
            block_size: p.block_size,
            scale: self.scale(),
            causal: true,
            window: None,
        };
        run_attention_on_device(&mut self.dev, v, pack, (&self.k, &self.v), shape)
    }
}

impl<T: Element> Instance for VarlenInstance<T> {
    fn reference(&self) -> Vec<f64> {
        let p = &self.p;
        let (d, g, bs) = (p.d, p.heads / p.kv_heads, p.block_size);
        let ql = self.q_layout().expect("valid layout");
        let mut out = Vec::new();
        let mut row = 0;
        for (s, &(q_len, ctx)) in p.runs.iter().enumerate() {
            for i in 0..q_len {
                let pos = ctx - q_len + i;
                for h in 0..p.heads {
                    let at = |buf: &[T], scales: &[f32], t: usize| -> Vec<f64> {
                        let b = self.tables[s * self.max_blocks + t / bs] as usize;
                        let off = ((b * bs + t % bs) * p.kv_heads + h / g) * d;
                        widen_row(buf, scales, off, d)
                    };
                    let q: Vec<f64> = (0..d)
                        .map(|x| self.q[ql.index_of(&[row, h, x])] as f64)
                        .collect();
                    out.extend(attend(
                        &q,
                        (0, pos + 1),
                        |t| at(&self.k, &self.ks, t),
                        |t| at(&self.v, &self.vs, t),
                        self.scale() as f64,
                    ));
                }
                row += 1;
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
        let total_q: usize = p.runs.iter().map(|r| r.0).sum();
        let (q_lens, context_lens): (Vec<usize>, Vec<usize>) = p.runs.iter().copied().unzip();
        let seqs = VarlenSeqs {
            block_tables: &self.tables,
            max_blocks: self.max_blocks,
            context_lens: &context_lens,
            q_lens: &q_lens,
        };
        let cache = PagedKvCache {
            k: &self.k,
            v: &self.v,
            k_scales: &self.ks,
            v_scales: &self.vs,
            num_blocks: self.num_blocks,
            block_size: p.block_size,
            kv_heads: p.kv_heads,
            d: p.d,
        };
        let params = VarlenParams {
            scale: self.scale(),
            threads: cfg
                .get("threads")
                .unwrap_or(crate::pool::global().threads()),
        };
        let dims = [total_q, p.heads, p.d];
        varlen_attention(
            v.isa()?,
            &TensorView::new(&self.q, self.q_layout()?)?,
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
        let total_q: usize = self.p.runs.iter().map(|r| r.0).sum();
        let (r, h) = (
            rng.random_range(0..total_q),
            rng.random_range(0..self.p.heads),
        );
        let at = self.q_layout().ok()?.index_of(&[r, h, 0]);
        self.q[at] = f32::NAN;
        let o = (r * self.p.heads + h) * self.p.d;
        Some((o..o + self.p.d).collect())
    }
    fn footprint(&self) -> usize {
        bytes(&self.q) + bytes(&self.k) + bytes(&self.v) + bytes(&self.o)
    }
}
