//! Every CUDA kernel source compiles to a CUBIN for sm_80 and sm_90 through NVRTC — no
//! GPU needed. Without NVRTC the test says so and passes (CI installs it).

use tessera_cuda::{compile_cubin, nvrtc_available, nvrtc_version, CudaError, ARCHS, KERNELS};

#[test]
fn every_kernel_compiles_for_every_arch() {
    if !nvrtc_available() {
        eprintln!(
            "CUDA compile tests SKIPPED: libnvrtc not found. CI installs nvidia-cuda-nvrtc==13.0.* \
             and puts its lib directory on LD_LIBRARY_PATH; see .ci/run."
        );
        assert!(matches!(
            compile_cubin("x", "", "sm_80"),
            Err(CudaError::NotAvailable(_))
        ));
        return;
    }
    eprintln!("NVRTC {:?}", nvrtc_version().expect("version"));
    for (name, source) in KERNELS {
        for arch in ARCHS {
            let cubin = compile_cubin(name, source, arch).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                &cubin[..4],
                b"\x7fELF",
                "{name} for {arch}: not an ELF cubin"
            );
        }
    }
}

#[test]
fn broken_source_is_a_compile_error_with_the_log() {
    if !nvrtc_available() {
        return;
    }
    let err = compile_cubin(
        "broken",
        "extern \"C\" __global__ void k() { undeclared(); }",
        "sm_80",
    )
    .expect_err("must not compile");
    match err {
        CudaError::Compile { log, .. } => assert!(log.contains("undeclared"), "log: {log}"),
        e => panic!("unexpected {e}"),
    }
}
