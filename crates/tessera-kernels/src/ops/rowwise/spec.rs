//! The registry entry shared by every row-wise op.

use super::{run_rows, RowOpDesc};
use crate::ops::common::{bytes, poison, random_in};
use crate::registry::on_device::OnDevice;
use crate::registry::{
    parse_dims, BenchProblem, Cost, Instance, OpSpec, ProblemCase, Rng, Tolerance, TuneConfig,
    TuneParam, TuneSpace, Variant,
};
use half::bf16;
use rand::Rng as _;
use std::fmt;
use std::marker::PhantomData;
use tessera_core::device::{DeviceBuffer, DeviceCall};
use tessera_core::{AlignedVec, DType, Element, Error, Layout, Result, TensorView, TensorViewMut};

/// `rows` rows of length `n`; `strided` stores inputs with padded rows and the output
/// transposed-and-back (non-unit column stride), exercising the general paths.
#[derive(Debug)]
pub struct RowProblem<D> {
    /// Rows (product of the leading dims).
    pub rows: usize,
    /// Row length.
    pub n: usize,
    /// Inputs and output viewed with a non-unit column stride.
    pub strided: bool,
    _op: PhantomData<fn() -> D>,
}

impl<D> Clone for RowProblem<D> {
    fn clone(&self) -> Self {
        RowProblem::new(self.rows, self.n, self.strided)
    }
}

impl<D> RowProblem<D> {
    /// A problem of `rows` rows of `n`.
    pub fn new(rows: usize, n: usize, strided: bool) -> Self {
        RowProblem {
            rows,
            n,
            strided,
            _op: PhantomData,
        }
    }
}

impl<D> fmt::Display for RowProblem<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}x{}{}",
            self.rows,
            self.n,
            if self.strided { " strided" } else { "" }
        )
    }
}

/// The registry entry of row-wise op `D`.
#[derive(Debug)]
pub struct RowOpSpec<D>(PhantomData<fn() -> D>);

impl<D> RowOpSpec<D> {
    /// The registry entry for descriptor `D`.
    pub const fn new() -> Self {
        RowOpSpec(PhantomData)
    }
}

impl<D> Default for RowOpSpec<D> {
    fn default() -> Self {
        Self::new()
    }
}

impl<D: RowOpDesc> OpSpec for RowOpSpec<D> {
    fn name(&self) -> &'static str {
        D::NAME
    }
    fn summary(&self) -> &'static str {
        D::SUMMARY
    }
    fn dtypes(&self) -> &'static [DType] {
        D::dtypes()
    }
    fn tolerance(&self, dtype: DType) -> Tolerance {
        D::tolerance(dtype)
    }
    fn test_problems(&self, rng: &mut Rng) -> Vec<Box<dyn ProblemCase>> {
        let mut shapes = vec![
            (1, 1, false),
            (7, 33, true),
            (33, 7, false),
            (1, 127, true),
            (127, 64, false),
            (3, 4099, true),
            (300, 2, false),
            (5, 576, false),
        ];
        shapes.push((rng.random_range(1..60), rng.random_range(1..500), true));
        shapes
            .into_iter()
            .map(|(r, n, s)| (r, if D::valid_n(n) { n } else { n + 1 }, s))
            .map(|(r, n, s)| Box::new(RowProblem::<D>::new(r, n, s)) as Box<dyn ProblemCase>)
            .collect()
    }
    fn bench_problems(&self) -> Vec<BenchProblem> {
        vec![
            (
                "model-512x576",
                Box::new(RowProblem::<D>::new(512, 576, false)),
            ),
            (
                "large-4096x4096",
                Box::new(RowProblem::<D>::new(4096, 4096, false)),
            ),
        ]
    }
    fn parse_problem(&self, s: &str) -> Result<Box<dyn ProblemCase>> {
        let d = parse_dims(D::NAME, s, 2, "ROWSxN")?;
        if !D::valid_n(d[1]) {
            return Err(Error::invalid(
                D::NAME,
                format!("row length {} not supported", d[1]),
            ));
        }
        Ok(Box::new(RowProblem::<D>::new(d[0], d[1], false)))
    }
}

impl<D: RowOpDesc> ProblemCase for RowProblem<D> {
    fn cost(&self, dtype: DType) -> Cost {
        let elems = (self.rows * self.n) as f64;
        Cost {
            flops: D::FLOPS_PER_ELEM * elems,
            bytes: elems * (D::INPUTS * dtype.size_bytes()) as f64
                + (self.rows * D::out_len(self.n) * 4) as f64,
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
            DType::F32 => Ok(Box::new(RowInstance::<D, f32>::new(self.clone(), rng)?)),
            DType::BF16 => Ok(Box::new(RowInstance::<D, bf16>::new(self.clone(), rng)?)),
            d => Err(Error::DType {
                op: D::NAME,
                dtype: d.to_string(),
            }),
        }
    }
}

struct RowInstance<D: RowOpDesc, T: Element> {
    p: RowProblem<D>,
    kernel: D::Kernel,
    inputs: Vec<AlignedVec<T>>,
    lin: Layout,
    out: AlignedVec<f32>,
    lout: Layout,
    dev: Option<OnDevice>,
}

impl<D: RowOpDesc, T: Element> RowInstance<D, T> {
    fn new(p: RowProblem<D>, rng: &mut Rng) -> Result<Self> {
        let (rows, n, m) = (p.rows, p.n, D::out_len(p.n));
        let (lin, lout) = if p.strided {
            (
                Layout::strided(&[rows, n], &[n + 5, 1], 2)?,
                Layout::contiguous(&[m, rows])?.transposed(0, 1)?,
            )
        } else {
            (
                Layout::contiguous(&[rows, n])?,
                Layout::contiguous(&[rows, m])?,
            )
        };
        let (lo, hi) = D::input_range();
        let inputs = (0..D::INPUTS)
            .map(|_| random_in(rng, lin.span()?, lo, hi))
            .collect::<Result<_>>()?;
        Ok(RowInstance {
            kernel: D::kernel(rows, n, rng),
            inputs,
            lin,
            out: AlignedVec::zeroed(lout.span()?)?,
            lout,
            p,
            dev: None,
        })
    }
}

impl<D: RowOpDesc, T: Element> RowInstance<D, T> {
    fn run_on_device(&mut self, v: &Variant) -> Result<()> {
        let (op, gamma) = D::device_op(&self.kernel)
            .ok_or_else(|| Error::Unsupported(format!("{} has no {} kernel", D::NAME, v.label)))?;
        let (rows, n) = (self.p.rows, self.p.n);
        let (inputs, lin) = (&self.inputs, self.lin);
        let state = OnDevice::ensure(&mut self.dev, v, |dev| {
            // Devices take contiguous rows: the (possibly strided) inputs are packed.
            let pack = |b: &AlignedVec<T>| -> Vec<f32> {
                (0..rows * n)
                    .map(|j| b[lin.index_of(&[j / n, j % n])].to_f32())
                    .collect()
            };
            let mut bufs = inputs
                .iter()
                .map(|b| dev.upload(&pack(b)))
                .collect::<Result<Vec<_>>>()?;
            bufs.push(dev.upload(gamma.unwrap_or(&[]))?);
            bufs.push(dev.upload(&vec![f32::NAN; rows * D::out_len(n)])?);
            let out = bufs.len() - 1;
            Ok((bufs, out))
        })?;
        let k = D::INPUTS;
        let inputs: Vec<&DeviceBuffer> = state.bufs[..k].iter().collect();
        state.device.run(&DeviceCall::Rows {
            op,
            inputs: &inputs,
            gamma: gamma.map(|_| &state.bufs[k]),
            out: &state.bufs[k + 1],
            out_offset: 0,
            rows,
            n,
        })?;
        state.ran = true;
        Ok(())
    }
}

impl<D: RowOpDesc, T: Element> Instance for RowInstance<D, T> {
    fn reference(&self) -> Vec<f64> {
        let mut out = Vec::new();
        for r in 0..self.p.rows {
            let x: Vec<Vec<f64>> = self
                .inputs
                .iter()
                .map(|b| {
                    (0..self.p.n)
                        .map(|i| b[self.lin.index_of(&[r, i])].to_f64())
                        .collect()
                })
                .collect();
            out.extend(D::reference(&self.kernel, r, &x));
        }
        out
    }
    fn poison(&mut self) {
        poison(&mut self.out);
        OnDevice::reset_output(&mut self.dev, |n| vec![f32::NAN; n]);
    }
    fn run(&mut self, v: &Variant, cfg: &TuneConfig) -> Result<()> {
        if v.backend.device_kind().is_some() {
            return self.run_on_device(v);
        }
        OnDevice::host_ran(&mut self.dev);
        let views = self
            .inputs
            .iter()
            .map(|b| TensorView::new(b, self.lin))
            .collect::<Result<Vec<_>>>()?;
        let threads = cfg
            .get("threads")
            .unwrap_or(crate::pool::global().threads());
        let mut out = TensorViewMut::new(&mut self.out, self.lout)?;
        run_rows(
            D::NAME,
            v.isa()?,
            threads,
            &self.kernel,
            &views,
            &mut out,
            D::out_len(self.p.n),
        )
    }
    fn output(&self) -> Vec<f64> {
        if let Some(out) = OnDevice::output(&self.dev) {
            return out.into_iter().map(f64::from).collect();
        }
        let m = D::out_len(self.p.n);
        (0..self.p.rows)
            .flat_map(|r| (0..m).map(move |i| (r, i)))
            .map(|(r, i)| self.out[self.lout.index_of(&[r, i])] as f64)
            .collect()
    }
    fn inject_nonfinite(&mut self, rng: &mut Rng) -> Option<Vec<usize>> {
        let (r, c) = (
            rng.random_range(0..self.p.rows),
            rng.random_range(0..self.p.n),
        );
        let reach = D::nan_reach(self.p.n, c)?;
        let at = self.lin.index_of(&[r, c]);
        self.inputs[0][at] = T::from_f32(f32::NAN);
        let m = D::out_len(self.p.n);
        Some(reach.into_iter().map(|i| r * m + i).collect())
    }
    fn footprint(&self) -> usize {
        self.inputs.iter().map(|b| bytes(b)).sum::<usize>() + bytes(&self.out)
    }
}
