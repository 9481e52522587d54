//! A device variant's benchmark times its calls without the host↔device copies and
//! reports those copies apart; a CPU variant has none. Runs on a real wgpu adapter
//! (lavapipe in CI, where `TESSERA_REQUIRE_WGPU=1` makes a missing one a failure).

use std::sync::Arc;
use std::time::Duration;
use tessera_core::DType;
use tessera_kernels::ops::rms_norm::RmsNorm;
use tessera_kernels::ops::rowwise::RowProblem;
use tessera_kernels::registry::{ComputeUnit, TuneConfig, Variant};
use tessera_perf::bench::{self, BenchOptions, BenchSpec};
use tessera_perf::calibrate::Ceilings;

#[test]
fn device_variants_report_their_transfers_apart() {
    let dev = match tessera_wgpu::WgpuDevice::new() {
        Ok(d) => Arc::new(d),
        Err(e) if std::env::var("TESSERA_REQUIRE_WGPU").as_deref() == Ok("1") => {
            panic!("TESSERA_REQUIRE_WGPU=1 but no adapter: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no wgpu adapter ({e})");
            return;
        }
    };
    tessera_core::device::install(dev);
    // Ceilings are only the percentages' denominators here.
    let c = Ceilings {
        threads: 1,
        fma_gflops: 10.0,
        bf16_gflops: 10.0,
        int8_gops: 10.0,
        dram_gbps: 10.0,
        cache_bytes: None,
    };
    let opts = BenchOptions {
        budget: Duration::from_millis(20),
        min_samples: 3,
        device_ceilings: Some(c),
        in_cache: true,
        ..Default::default()
    };
    let problem = RowProblem::<RmsNorm>::new(64, 576, false);
    let config = TuneConfig::default();
    let run = |variant: &Variant| {
        let spec = BenchSpec {
            op: "rms_norm",
            problem: &problem,
            dtype: DType::F32,
            variant,
            config: &config,
            unit: ComputeUnit::Fma,
        };
        bench::run(&spec, &c, &opts).expect("benchmarks")
    };
    let on_device = run(&Variant::device(tessera_core::device::DeviceKind::Wgpu));
    let t = on_device
        .transfer
        .expect("a device variant reports its transfers");
    assert!(t.upload_s.is_finite() && t.upload_s >= 0.0, "{t:?}");
    assert!(t.download_s.is_finite() && t.download_s > 0.0, "{t:?}");
    assert!(on_device.samples_s.len() >= 3);
    let on_cpu = run(&Variant::cpu(tessera_core::Isa::Scalar));
    assert!(on_cpu.transfer.is_none());
}
