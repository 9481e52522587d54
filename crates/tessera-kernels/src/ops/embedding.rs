//! Embedding lookup: rows of a `[vocab, dim]` table gathered by token id, widened to f32.

use crate::ops::common::{bytes, poison, random};
use crate::pool::{self, SharedMut};
use crate::registry::on_device::OnDevice;
use crate::registry::{
    parse_dims, BenchProblem, Cost, Instance, OpSpec, ProblemCase, Rng, Tolerance, TuneConfig,
    TuneParam, TuneSpace, Variant,
};
use half::{bf16, f16};
use rand::Rng as _;
use std::fmt;
use tessera_core::device::{DeviceCall, DeviceMatrix};
use tessera_core::{
    AlignedVec, DType, Element, Error, Isa, Layout, Result, TensorView, TensorViewMut,
};

/// A copy (f32) or an exact widening (f16, bf16).
pub const TOL: Tolerance = Tolerance {
    rel: 0.0,
    reason: "a copy or exact widening",
};

/// `out[i, :] = table[ids[i], :]`. Ids out of range are an error naming the first one.
pub fn embedding<T: Element>(
    isa: Isa,
    table: &TensorView<'_, T>,
    ids: &[u32],
    out: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    const OP: &str = "embedding";
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    if table.rank() != 2 || out.rank() != 2 || out.dims() != [ids.len(), table.dims()[1]] {
        return Err(Error::shape(
            OP,
            format!(
                "table {:?}, {} ids, out {:?} (want [{}, dim])",
                table.dims(),
                ids.len(),
                out.dims(),
                ids.len()
            ),
        ));
    }
    let (vocab, dim) = (table.dims()[0], table.dims()[1]);
    if let Some((pos, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
        return Err(Error::invalid(
            OP,
            format!("token id {id} at position {pos} ≥ vocabulary size {vocab}"),
        ));
    }
    let (tl, ol) = (*table.layout(), *out.layout());
    if tl.stride(1) != 1 || ol.stride(1) != 1 {
        return Err(Error::invalid(
            OP,
            "table and output rows must be contiguous",
        ));
    }
    let optr = SharedMut(out.data_mut().as_mut_ptr());
    let per_task = (16 * 1024 / dim.max(1)).max(1);
    pool::global().run(
        ids.len().div_ceil(per_task),
        pool::global().threads(),
        |t| {
            let row =
                |i: usize| &table.data()[tl.offset() + ids[i] as usize * tl.stride(0)..][..dim];
            let end = ((t + 1) * per_task).min(ids.len());
            for i in t * per_task..end {
                // Rows are scattered over the table: fetch the next one while copying this.
                if i + 1 < end {
                    crate::simd::prefetch(row(i + 1));
                }
                let src = row(i);
                // SAFETY: row i of the validated output view (contiguous row, checked above);
                // each task writes distinct rows.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(
                        optr.get().add(ol.offset() + i * ol.stride(0)),
                        dim,
                    )
                };
                crate::simd::widen(isa, src, dst);
            }
        },
    );
    Ok(())
}

/// `n_ids` random ids into a `[vocab, dim]` table (rows padded when `padded`).
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingProblem {
    /// Rows of the table.
    pub vocab: usize,
    /// Width of a row.
    pub dim: usize,
    /// Token ids gathered per call.
    pub n_ids: usize,
    /// Output rows padded (row stride > width).
    pub padded: bool,
}

impl fmt::Display for EmbeddingProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "vocab{} dim{} ids{}{}",
            self.vocab,
            self.dim,
            self.n_ids,
            if self.padded { " padded" } else { "" }
        )
    }
}

/// The registry entry.
#[derive(Debug)]
pub struct EmbeddingOp;

impl OpSpec for EmbeddingOp {
    fn name(&self) -> &'static str {
        "embedding"
    }
    fn summary(&self) -> &'static str {
        "token embedding gather, widened to f32"
    }
    fn dtypes(&self) -> &'static [DType] {
        &[DType::F32, DType::BF16, DType::F16]
    }
    fn tolerance(&self, _: DType) -> Tolerance {
        TOL
    }
    fn test_problems(&self, _: &mut Rng) -> Vec<Box<dyn ProblemCase>> {
        [
            (1, 1, 1, false),
            (7, 33, 5, true),
            (127, 64, 300, false),
            (1000, 7, 33, true),
        ]
        .into_iter()
        .map(|(vocab, dim, n_ids, padded)| {
            Box::new(EmbeddingProblem {
                vocab,
                dim,
                n_ids,
                padded,
            }) as Box<dyn ProblemCase>
        })
        .collect()
    }
    fn bench_problems(&self) -> Vec<BenchProblem> {
        vec![(
            "smollm2-512",
            Box::new(EmbeddingProblem {
                vocab: 49152,
                dim: 576,
                n_ids: 512,
                padded: false,
            }),
        )]
    }
    fn parse_problem(&self, s: &str) -> Result<Box<dyn ProblemCase>> {
        let d = parse_dims("embedding", s, 3, "VOCABxDIMxIDS")?;
        Ok(Box::new(EmbeddingProblem {
            vocab: d[0],
            dim: d[1],
            n_ids: d[2],
            padded: false,
        }))
    }
}

impl ProblemCase for EmbeddingProblem {
    fn cost(&self, dtype: DType) -> Cost {
        Cost {
            flops: 0.0,
            bytes: (self.n_ids * (self.dim * (dtype.size_bytes() + 4) + 4)) as f64,
        }
    }
    fn tune_space(&self) -> TuneSpace {
        let t = pool::global().threads();
        TuneSpace(vec![TuneParam {
            name: "threads",
            default: t,
            choices: (1..=t).collect(),
        }])
    }
    fn instantiate(&self, dtype: DType, rng: &mut Rng) -> Result<Box<dyn Instance>> {
        match dtype {
            DType::F32 => Ok(Box::new(EmbInstance::<f32>::new(self.clone(), rng)?)),
            DType::BF16 => Ok(Box::new(EmbInstance::<bf16>::new(self.clone(), rng)?)),
            DType::F16 => Ok(Box::new(EmbInstance::<f16>::new(self.clone(), rng)?)),
            d => Err(Error::DType {
                op: "embedding",
                dtype: d.to_string(),
            }),
        }
    }
}

struct EmbInstance<T: Element> {
    p: EmbeddingProblem,
    table: AlignedVec<T>,
    lt: Layout,
    ids: Vec<u32>,
    out: AlignedVec<f32>,
    dev: Option<OnDevice>,
}

impl<T: Element> EmbInstance<T> {
    fn new(p: EmbeddingProblem, rng: &mut Rng) -> Result<Self> {
        let ld = p.dim + if p.padded { 3 } else { 0 };
        let lt = Layout::strided(&[p.vocab, p.dim], &[ld, 1], 0)?;
        let ids = (0..p.n_ids)
            .map(|_| rng.random_range(0..p.vocab as u32))
            .collect();
        Ok(EmbInstance {
            table: random(rng, lt.span()?)?,
            lt,
            ids,
            out: AlignedVec::zeroed(p.n_ids * p.dim)?,
            p,
            dev: None,
        })
    }

    /// The same gather on a device: the (padded) table uploaded once as f32, the ids
    /// passed with each launch.
    fn run_on_device(&mut self, v: &Variant) -> Result<()> {
        let (table, out_len) = (&self.table, self.out.len());
        let state = OnDevice::ensure(&mut self.dev, v, |dev| {
            let wide: Vec<f32> = table.iter().map(|x| x.to_f32()).collect();
            Ok((
                vec![dev.upload(&wide)?, dev.upload(&vec![f32::NAN; out_len])?],
                1,
            ))
        })?;
        state.device.run(&DeviceCall::Embedding {
            table: DeviceMatrix {
                buf: &state.bufs[0],
                offset: self.lt.offset(),
                strides: [0, self.lt.stride(0), self.lt.stride(1)],
            },
            vocab: self.p.vocab,
            dim: self.p.dim,
            ids: &self.ids,
            out: &state.bufs[1],
        })?;
        state.ran = true;
        Ok(())
    }
}

impl<T: Element> Instance for EmbInstance<T> {
    fn reference(&self) -> Vec<f64> {
        self.ids
            .iter()
            .flat_map(|&id| (0..self.p.dim).map(move |c| (id as usize, c)))
            .map(|(id, c)| self.table[self.lt.index_of(&[id, c])].to_f64())
            .collect()
    }
    fn poison(&mut self) {
        poison(&mut self.out);
        OnDevice::reset_output(&mut self.dev, |n| vec![f32::NAN; n]);
    }
    fn run(&mut self, v: &Variant, _: &TuneConfig) -> Result<()> {
        if v.backend.device_kind().is_some() {
            return self.run_on_device(v);
        }
        OnDevice::host_ran(&mut self.dev);
        let dims = [self.p.n_ids, self.p.dim];
        embedding(
            v.isa()?,
            &TensorView::new(&self.table, self.lt)?,
            &self.ids,
            &mut TensorViewMut::contiguous(&mut self.out, &dims)?,
        )
    }
    fn output(&self) -> Vec<f64> {
        if let Some(out) = OnDevice::output(&self.dev) {
            return out.into_iter().map(f64::from).collect();
        }
        self.out.iter().map(|&x| x as f64).collect()
    }
    fn inject_nonfinite(&mut self, rng: &mut Rng) -> Option<Vec<usize>> {
        self.dev = None; // the device copy of the table must be uploaded afresh
        let (id, c) = (
            self.ids[rng.random_range(0..self.ids.len())],
            rng.random_range(0..self.p.dim),
        );
        self.table[self.lt.index_of(&[id as usize, c])] = T::from_f32(f32::NAN);
        Some(
            self.ids
                .iter()
                .enumerate()
                .filter(|(_, &x)| x == id)
                .map(|(i, _)| i * self.p.dim + c)
                .collect(),
        )
    }
    fn footprint(&self) -> usize {
        self.p.n_ids * self.p.dim * std::mem::size_of::<T>() + bytes(&self.out)
    }
    fn resident_bytes(&self) -> usize {
        bytes(&self.table) + bytes(&self.out) + 4 * self.ids.len()
    }
    /// The next step's tokens: every id moves by a multiplicative step (a Lehmer
    /// generator's, mod the vocabulary), so a rotation of a few tables reads rows no
    /// recent call read, as a model's lookups do.
    fn warm_activations(&mut self) {
        let vocab = self.p.vocab as u64;
        for id in &mut self.ids {
            *id = ((u64::from(*id) * 48_271 + 1) % vocab) as u32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_id_is_an_error() {
        let table = vec![1.0f32; 12];
        let mut out = vec![0f32; 6];
        let t = TensorView::contiguous(&table, &[4, 3]).unwrap();
        let err = embedding(
            Isa::best(),
            &t,
            &[1, 4],
            &mut TensorViewMut::contiguous(&mut out, &[2, 3]).unwrap(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("token id 4 at position 1"),
            "{err}"
        );
        assert!(embedding(
            Isa::best(),
            &t,
            &[1],
            &mut TensorViewMut::contiguous(&mut out, &[2, 3]).unwrap()
        )
        .is_err());
    }

    /// Between benchmark samples a gather moves to other rows (still in the table), and
    /// the moved call gathers exactly those rows (checked against the float64 reference).
    #[test]
    fn the_next_samples_ids_are_other_rows_of_the_table() {
        let p = EmbeddingProblem {
            vocab: 1000,
            dim: 8,
            n_ids: 64,
            padded: true,
        };
        let mut inst = EmbInstance::<f32>::new(p, &mut crate::registry::rng(3)).unwrap();
        let before = inst.ids.clone();
        inst.warm_activations();
        assert!(inst.ids.iter().all(|&id| id < 1000));
        let moved = before.iter().zip(&inst.ids).filter(|(a, b)| a != b).count();
        assert!(moved > 60, "{moved} of 64 ids moved");
        inst.poison();
        inst.run(&Variant::cpu(Isa::Scalar), &TuneConfig::default())
            .unwrap();
        assert_eq!(inst.output(), inst.reference());
    }
}
