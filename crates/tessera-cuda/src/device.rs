//! A CUDA device as the ops use it: one context and stream, the device's architecture,
//! and each kernel source compiled (through the disk cache) and loaded once.

use crate::{compile_cached, default_cache_dir, kernel_source, CudaError};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Whether the CUDA driver library can be loaded (never panics).
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the candidate library names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// One GPU: context, stream and loaded modules.
#[derive(Debug)]
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
}

impl Device {
    /// Opens device `ordinal`, or says why CUDA is not usable here.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        if !driver_available() {
            return Err(CudaError::NotAvailable(
                "libcuda not found (no NVIDIA driver on this machine)".into(),
            ));
        }
        if !crate::nvrtc_available() {
            return Err(CudaError::NotAvailable(
                "libnvrtc not found (install the nvidia-cuda-nvrtc 13.0 wheel)".into(),
            ));
        }
        let count =
            CudaContext::device_count().map_err(|e| CudaError::driver("device count", e))?;
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::NotAvailable(format!(
                "device {ordinal} requested, {count} present"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::driver("context", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| CudaError::driver("compute capability", e))?;
        if major < 8 {
            return Err(CudaError::NotAvailable(format!(
                "compute capability {major}.{minor}: the tensor-core kernels need 8.0 or newer"
            )));
        }
        let stream = ctx.default_stream();
        Ok(Device {
            ctx,
            stream,
            arch: format!("sm_{major}{minor}"),
            modules: Mutex::new(HashMap::new()),
        })
    }

    /// The architecture kernels are compiled for (`sm_90` on an H100).
    pub fn arch(&self) -> &str {
        &self.arch
    }
    /// The device's L2 cache in bytes (what a cold benchmark's rotation set must exceed).
    pub fn l2_bytes(&self) -> Result<usize, CudaError> {
        use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE;
        let bytes = self
            .ctx
            .attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
            .map_err(|e| CudaError::driver("L2 cache size", e))?;
        Ok(bytes.max(0) as usize)
    }
    /// The device's name as the driver reports it.
    pub fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown GPU".into())
    }
    /// The stream every launch on this device is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Function `func` of kernel source `kernel`, compiling and loading it on first use.
    pub(crate) fn function(&self, kernel: &str, func: &str) -> Result<CudaFunction, CudaError> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        let module = match modules.get(kernel) {
            Some(m) => m.clone(),
            None => {
                let src = kernel_source(kernel)
                    .ok_or_else(|| CudaError::NotAvailable(format!("no kernel '{kernel}'")))?;
                let (cubin, _) = compile_cached(&default_cache_dir(), kernel, &src, &self.arch)?;
                let m = self
                    .ctx
                    .load_module(Ptx::from_binary(cubin))
                    .map_err(|e| CudaError::driver(format!("load {kernel}"), e))?;
                modules.insert(kernel.to_string(), m.clone());
                m
            }
        };
        module
            .load_function(func)
            .map_err(|e| CudaError::driver(format!("function {func}"), e))
    }

    /// A device copy of `host`.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, CudaError> {
        self.stream
            .clone_htod(host)
            .map_err(|e| CudaError::driver("upload", e))
    }
    /// `n` zeroed elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        self.stream
            .alloc_zeros(n)
            .map_err(|e| CudaError::driver("alloc", e))
    }
    /// A host copy of `dev` (waits for the stream).
    pub fn download<T: DeviceRepr + Clone + Default>(
        &self,
        dev: &CudaSlice<T>,
    ) -> Result<Vec<T>, CudaError> {
        self.stream
            .clone_dtoh(dev)
            .map_err(|e| CudaError::driver("download", e))
    }
    /// Waits for every queued launch.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(|e| CudaError::driver("synchronize", e))
    }
}
