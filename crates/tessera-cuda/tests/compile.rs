//! Every CUDA kernel source compiles to a CUBIN for sm_80 and sm_90 through NVRTC — no
//! GPU needed. Without NVRTC the test says so and passes (CI installs it).

use tessera_cuda::{
    compile_cubin, kernel_source, nvrtc_available, nvrtc_version, CudaError, ARCHS, KERNELS,
};

#[test]
fn every_kernel_compiles_for_every_arch() {
    if !nvrtc_available() {
        // Written to stderr directly: libtest captures eprintln! of passing tests.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
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
    for (name, _) in KERNELS {
        let source = kernel_source(name).expect("listed");
        for arch in ARCHS {
            let cubin = compile_cubin(name, &source, arch).unwrap_or_else(|e| panic!("{e}"));
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

#[test]
fn cubin_cache_hits_recompiles_corrupt_entries_and_survives_races() {
    use tessera_cuda::{compile_cached, Origin};
    if !nvrtc_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tessera-cubin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (name, src) = KERNELS[0];
    let (first, o1) = compile_cached(&dir, name, src, "sm_80").expect("compiles");
    assert_eq!(o1, Origin::Compiled);
    let (again, o2) = compile_cached(&dir, name, src, "sm_80").expect("cached");
    assert_eq!((o2, &again), (Origin::Cache, &first));
    // Another arch or another source is another entry.
    assert_eq!(
        compile_cached(&dir, name, src, "sm_90").unwrap().1,
        Origin::Compiled
    );
    let edited = format!("{src}\n// edited");
    assert_eq!(
        compile_cached(&dir, name, &edited, "sm_80").unwrap().1,
        Origin::Compiled
    );
    // A corrupt entry is recompiled, not returned.
    for entry in std::fs::read_dir(&dir).unwrap() {
        std::fs::write(entry.unwrap().path(), b"garbage").unwrap();
    }
    assert_eq!(
        compile_cached(&dir, name, src, "sm_80").unwrap().1,
        Origin::Compiled
    );
    // Threads compiling the same kernel at once all get a valid CUBIN.
    let _ = std::fs::remove_dir_all(&dir);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| compile_cached(&dir, name, src, "sm_90").unwrap().0))
            .collect();
        for h in hs {
            assert!(h.join().unwrap().starts_with(b"\x7fELF"));
        }
    });
    let leftovers = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".tmp")
        })
        .count();
    assert_eq!(leftovers, 0, "temporary files left behind");
    let _ = std::fs::remove_dir_all(&dir);
}
