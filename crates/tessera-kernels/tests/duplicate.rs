//! `Instance::duplicate`, which benchmarks fill cold rotation sets with: where an op
//! offers it, the copy is the same problem in its own memory. Run on the scalar variant,
//! it computes what the original does, its float64 reference is the original's, and
//! running it leaves the original's output (poisoned) untouched.

use tessera_core::Isa;
use tessera_kernels::registry::{self, verify::rel_error_finite, TuneConfig, Variant};

#[test]
fn duplicates_compute_the_original_problem_in_their_own_memory() {
    let scalar = Variant::cpu(Isa::Scalar);
    let config = TuneConfig::default();
    let mut rng = registry::rng(0xd0b1e);
    let mut duplicated = Vec::new();
    for op in tessera_kernels::ops::all() {
        for &dtype in op.dtypes() {
            for problem in op.test_problems(&mut rng) {
                if !problem.supports(dtype, &scalar) {
                    continue;
                }
                let Ok(mut original) = problem.instantiate(dtype, &mut rng) else {
                    continue;
                };
                let Some(mut copy) = original.duplicate() else {
                    continue;
                };
                let what = format!("{} {problem} {dtype}", op.name());
                assert_eq!(copy.footprint(), original.footprint(), "{what}");
                assert_eq!(copy.reference(), original.reference(), "{what}");
                original.poison();
                copy.poison();
                copy.run(&scalar, &config).unwrap();
                assert!(original.output().iter().all(|x| x.is_nan()), "{what}");
                // Measured as `verify` measures it: over the sum's magnitude where the
                // op offers one, so an output that cancels to nearly 0 cannot fail.
                let (out, want) = (copy.output(), original.reference());
                let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
                let err = match original.magnitude(&scalar) {
                    Some(mag) => {
                        rel_error_finite(&out, &want) * norm(&want)
                            / norm(&mag).max(f64::MIN_POSITIVE)
                    }
                    None => rel_error_finite(&out, &want),
                };
                let tol = op.variant_tolerance(dtype, &scalar).rel;
                assert!(err <= tol, "{what}: error {err:e} over {tol:e}");
                original.run(&scalar, &config).unwrap();
                assert_eq!(
                    copy.output(),
                    original.output(),
                    "{what}: same inputs, same path"
                );
                duplicated.push(op.name());
            }
        }
    }
    for op in ["qmatmul", "qmatmul_i8", "qmatmul_fp8"] {
        assert!(
            duplicated.contains(&op),
            "{op} offers duplicates: {duplicated:?}"
        );
    }
}
