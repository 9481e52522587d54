//! GEMM: `C = α·A·B + β·C`, f32 / f16 / bf16 inputs, f32 accumulation and output, any
//! strides (so Aᵀ and Bᵀ are views, not flags), optionally batched.
//!
//! Files: `reference.rs` (float64), `pack.rs` (panel packing), `micro.rs` (micro-kernels
//! per ISA), `driver.rs` (cache blocking and threads), `spec.rs` (registry entry, tests'
//! problems and tolerances).
//!
//! bf16 on AVX512_BF16 runs `vdpbf16ps` on bf16 pairs; elsewhere bf16 and f16 are widened
//! to f32 while packing (exact) and run the f32 kernel.

mod bt_rows;
mod driver;
mod gemv;
mod micro;
mod pack;
pub mod reference;
mod spec;
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod wide_tests;

pub use bt_rows::{gemm_bt_rows, gemm_bt_weight_rows, FillRow, FillRows8, WeightRows};
pub use driver::Blocking;
pub use spec::{GemmOp, GemmProblem, TOL_BF16, TOL_F16, TOL_F32};

use crate::registry::{TuneConfig, TuneParam, TuneSpace};
use driver::{MatMut, MicroKernel, Operands};
use pack::{Mat, PackSource};
use pool::SharedMut;
use tessera_core::{CpuFeatures, Element, Error, Isa, Result, TensorView, TensorViewMut};

use crate::pool;

/// Scalars of `C = α·A·B + β·C`. With `beta == 0`, C is not read (NaN in C is ignored).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmParams {
    /// Scale of the product A·B.
    pub alpha: f32,
    /// Scale of the C already in the output (0: C is overwritten, NaN in it ignored).
    pub beta: f32,
}

impl Default for GemmParams {
    fn default() -> Self {
        GemmParams {
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

/// Input element types GEMM accepts.
pub trait GemmInput: PackSource {}
impl GemmInput for f32 {}
impl GemmInput for half::f16 {}
impl GemmInput for half::bf16 {}

/// The default blocking for an ISA, from the `tessera bench gemm` sweep recorded in
/// docs/performance.md (KC·NR·4 bytes of B micro-panel sized for L1, MC·KC for L2).
pub fn default_blocking(isa: Isa) -> Blocking {
    let threads = pool::global().threads();
    match isa {
        Isa::Avx512 => Blocking {
            mc: 96,
            kc: 384,
            nc: 1024,
            threads,
        },
        Isa::Avx2 => Blocking {
            mc: 96,
            kc: 256,
            nc: 1024,
            threads,
        },
        Isa::Neon | Isa::Scalar => Blocking {
            mc: 64,
            kc: 256,
            nc: 512,
            threads,
        },
    }
}

/// The tunable blocking space (defaults from [`default_blocking`] on the best ISA), shared
/// by the registry's problems and the run-time lookup of tuned values.
pub fn tune_space() -> TuneSpace {
    let d = default_blocking(Isa::best());
    TuneSpace(vec![
        TuneParam {
            name: "mc",
            default: d.mc,
            choices: vec![48, 72, 96, 144, 192, 288],
        },
        TuneParam {
            name: "kc",
            default: d.kc,
            choices: vec![128, 192, 256, 384, 512],
        },
        TuneParam {
            name: "nc",
            default: d.nc,
            choices: vec![256, 512, 1024, 2048, 4096],
        },
        TuneParam {
            name: "threads",
            default: d.threads,
            choices: (1..=d.threads).collect(),
        },
    ])
}

/// The blocking from a tuning configuration (missing values: the ISA's defaults).
pub fn blocking_from(isa: Isa, cfg: &TuneConfig) -> Blocking {
    let d = default_blocking(isa);
    Blocking {
        mc: cfg.get("mc").unwrap_or(d.mc),
        kc: cfg.get("kc").unwrap_or(d.kc),
        nc: cfg.get("nc").unwrap_or(d.nc),
        threads: cfg.get("threads").unwrap_or(d.threads),
    }
}

/// The blocking `tessera tune` chose for this shape on this machine, else the default.
pub fn tuned_blocking(
    isa: Isa,
    dtype: tessera_core::DType,
    m: usize,
    n: usize,
    k: usize,
) -> Blocking {
    // The common case (nothing tuned) skips building the space and key on every call:
    // dense decode calls this once per layer per token.
    if crate::tuning::is_empty() {
        return default_blocking(isa);
    }
    match crate::tuning::lookup(
        "gemm",
        &dtype.to_string(),
        isa.name(),
        &[m, n, k],
        &tune_space(),
    ) {
        Some(cfg) => blocking_from(isa, &cfg),
        None => default_blocking(isa),
    }
}

/// `C = α·A·B + β·C` on the best ISA, with the tuned blocking for this shape (defaults
/// when none was tuned).
pub fn gemm<T: GemmInput>(
    a: &TensorView<'_, T>,
    b: &TensorView<'_, T>,
    c: &mut TensorViewMut<'_, f32>,
    p: GemmParams,
) -> Result<()> {
    let isa = Isa::best();
    let (cd, ad) = (c.dims(), a.dims());
    let blocking = match (cd.len(), ad.len()) {
        (r, ra) if r >= 2 && ra >= 2 => {
            tuned_blocking(isa, T::DTYPE, cd[r - 2], cd[r - 1], ad[ra - 1])
        }
        _ => default_blocking(isa), // gemm_with reports the rank error
    };
    gemm_with(isa, blocking, a, b, c, p)
}

/// Shapes after validation: (batches, m, n, k) and per-operand batch strides in matrices.
struct Shapes {
    dims: (usize, usize, usize, usize),
    a_batched: bool,
    b_batched: bool,
}

fn check_shapes<T>(
    a: &TensorView<'_, T>,
    b: &TensorView<'_, T>,
    c: &TensorViewMut<'_, f32>,
) -> Result<Shapes>
where
    T: Element,
{
    const OP: &str = "gemm";
    for (name, r) in [("A", a.rank()), ("B", b.rank()), ("C", c.rank())] {
        if !(2..=3).contains(&r) {
            return Err(Error::Rank {
                op: OP,
                expected: format!("2 or 3 for {name}"),
                got: r,
            });
        }
    }
    let mat = |d: &[usize]| (d[d.len() - 2], d[d.len() - 1]);
    let batch = |d: &[usize]| if d.len() == 3 { d[0] } else { 1 };
    let ((m, k), (k2, n), (cm, cn)) = (mat(a.dims()), mat(b.dims()), mat(c.dims()));
    if k != k2 || cm != m || cn != n {
        return Err(Error::shape(
            OP,
            format!("A {:?} · B {:?} → C {:?}", a.dims(), b.dims(), c.dims()),
        ));
    }
    let batches = batch(c.dims());
    for (name, d) in [("A", a.dims()), ("B", b.dims())] {
        if batch(d) != batches && batch(d) != 1 {
            return Err(Error::shape(
                OP,
                format!("{name} batch {} vs C batch {batches}", batch(d)),
            ));
        }
    }
    Ok(Shapes {
        dims: (batches, m, n, k),
        a_batched: a.rank() == 3 && batch(a.dims()) > 1,
        b_batched: b.rank() == 3 && batch(b.dims()) > 1,
    })
}

fn matrix<'v, T: Element>(v: &TensorView<'v, T>, batched: bool, i: usize) -> TensorView<'v, T> {
    match (v.rank(), batched) {
        (3, true) => v.index0(i).expect("batch index checked"),
        (3, false) => v.index0(0).expect("batch of one"),
        _ => *v,
    }
}

/// `C = α·A·B + β·C` on a chosen ISA with chosen blocking.
pub fn gemm_with<T: GemmInput>(
    isa: Isa,
    blocking: Blocking,
    a: &TensorView<'_, T>,
    b: &TensorView<'_, T>,
    c: &mut TensorViewMut<'_, f32>,
    p: GemmParams,
) -> Result<()> {
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    let s = check_shapes(a, b, c)?;
    let (batches, m, n, k) = s.dims;
    if batches * m * n == 0 {
        return Ok(());
    }
    let c_mat = c_matrices(c, m, n);
    if k == 0 {
        scale_c(&c_mat, batches, p.beta);
        return Ok(());
    }
    if m <= gemv::MAX_M
        && (b.layout().stride(b.rank() - 2) == 1 || b.layout().stride(b.rank() - 1) == 1)
    {
        run_gemv(isa, blocking.threads, a, b, &s, &c_mat, p);
        return Ok(());
    }
    if T::DTYPE == tessera_core::DType::BF16 && isa == Isa::Avx512 && CpuFeatures::get().avx512_bf16
    {
        #[cfg(target_arch = "x86_64")]
        {
            let kern = MicroKernel::<u32> {
                mr: micro::WIDE_MR,
                nr: 16 * micro::WIDE_NV,
                run: micro::avx512_bf16_6x64,
            };
            blocked(kern, blocking, (a, b), &s, &c_mat, p);
            return Ok(());
        }
    }
    blocked(f32_kernel(isa), blocking, (a, b), &s, &c_mat, p);
    Ok(())
}

/// Per batch entry, C's matrix (validated view: `m × n`).
fn c_matrices(
    c: &mut TensorViewMut<'_, f32>,
    m: usize,
    n: usize,
) -> impl Fn(usize) -> MatMut + Sync {
    let cl = *c.layout();
    let cptr = SharedMut(c.data_mut().as_mut_ptr());
    move |i: usize| {
        let l = if cl.rank() == 3 {
            cl.index0(i).expect("batch checked")
        } else {
            cl
        };
        MatMut {
            // SAFETY: the view was validated; offset is inside its buffer.
            ptr: SharedMut(unsafe { cptr.get().add(l.offset()) }),
            rows: m,
            cols: n,
            rs: l.stride(0),
            cs: l.stride(1),
        }
    }
}

/// The blocked driver over every batch entry with micro-kernel `kern`.
fn blocked<T: GemmInput, P: pack::Packed>(
    kern: MicroKernel<P>,
    blocking: Blocking,
    (a, b): (&TensorView<'_, T>, &TensorView<'_, T>),
    s: &Shapes,
    c_mat: &(dyn Fn(usize) -> MatMut + Sync),
    p: GemmParams,
) {
    let operands = |i: usize| Operands {
        a: Mat::of(&matrix(a, s.a_batched, i)),
        b: Mat::of(&matrix(b, s.b_batched, i)),
        c: c_mat(i),
    };
    driver::run(kern, blocking, s.dims, &operands, (p.alpha, p.beta));
}

/// Small-M path: each row of A against B, no packing.
fn run_gemv<T: GemmInput>(
    isa: Isa,
    threads: usize,
    a: &TensorView<'_, T>,
    b: &TensorView<'_, T>,
    s: &Shapes,
    c_mat: &(dyn Fn(usize) -> MatMut + Sync),
    p: GemmParams,
) {
    let (batches, m, n, k) = s.dims;
    let mut x = vec![0f32; k];
    for bt in 0..batches {
        let (am, bm, c) = (
            matrix(a, s.a_batched, bt),
            matrix(b, s.b_batched, bt),
            c_mat(bt),
        );
        let (al, bl) = (am.layout(), bm.layout());
        for i in 0..m {
            gemv::widen_row(
                am.data(),
                al.offset() + i * al.stride(0),
                al.stride(1),
                &mut x,
            );
            let row = gemv::GemvRow {
                x: &x,
                b: bm.data(),
                b_off: bl.offset(),
                rs: bl.stride(0),
                cs: bl.stride(1),
                n,
            };
            // SAFETY: row i of a validated C view.
            let c_row = SharedMut(unsafe { c.ptr.get().add(i * c.rs) });
            gemv::row(isa, &row, c_row, c.cs, p.alpha, p.beta, threads);
        }
    }
}

/// The f32 micro-kernel for an ISA (callers checked availability).
fn f32_kernel(isa: Isa) -> MicroKernel<f32> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => MicroKernel {
            mr: micro::WIDE_MR,
            nr: 16 * micro::WIDE_NV,
            run: micro::avx512_f32_6x64,
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => MicroKernel {
            mr: 6,
            nr: 16,
            run: micro::avx2_6x16,
        },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => MicroKernel {
            mr: 8,
            nr: 8,
            run: micro::neon_8x8,
        },
        _ => MicroKernel {
            mr: 4,
            nr: 8,
            run: micro::scalar_4x8,
        },
    }
}

/// `C = β·C` (K = 0: the product is empty).
fn scale_c(c_mat: &dyn Fn(usize) -> MatMut, batches: usize, beta: f32) {
    for bt in 0..batches {
        let c = c_mat(bt);
        for i in 0..c.rows {
            for j in 0..c.cols {
                // SAFETY: (i, j) inside a validated C view.
                unsafe {
                    let p = c.ptr.get().add(i * c.rs + j * c.cs);
                    *p = if beta == 0.0 { 0.0 } else { beta * *p };
                }
            }
        }
    }
}
