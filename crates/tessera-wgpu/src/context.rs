//! The adapter, device and queue; buffers; cached pipelines; launches recorded into one
//! pending command encoder. [`Device::run`] submits the call and waits for it (the
//! registry times calls one by one); [`Device::enqueue`] leaves it pending, and the
//! encoder goes to the queue every [`PASSES_PER_SUBMIT`] dispatches, before a `write`
//! (whose staged copy would otherwise run before the dispatches recorded ahead of it)
//! and before a download, which waits for all of it. A forward pass of ~15 calls per
//! layer thus makes one submission per few layers, not one wait per call.

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use tessera_core::device::blocks;
use tessera_core::device::{Device, DeviceBuffer, DeviceCall, DeviceKind};
use tessera_core::{DType, Error, Result};

/// An f32 (or u32-word) storage buffer on the device.
pub(crate) struct Buf {
    pub buffer: wgpu::Buffer,
}

/// 16-bit floats (F16 or BF16), two per 32-bit word, for the calls that read
/// half-precision storage.
pub(crate) struct HalfBuf {
    pub dtype: DType,
    pub buffer: wgpu::Buffer,
}

/// Quantized weights as the matmul shader reads them.
pub(crate) struct BlockBuf {
    pub format: DType,
    pub rows: usize,
    pub cols: usize,
    pub scales: wgpu::Buffer,
    pub codes: wgpu::Buffer,
}

/// Queued dispatches per submission: a default-model layer makes ~15.
pub(crate) const PASSES_PER_SUBMIT: usize = 64;

/// A `wgpu` adapter opened for compute.
pub struct WgpuDevice {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    pub(crate) max_binding: u64,
    pipelines: Mutex<HashMap<&'static str, Arc<wgpu::ComputePipeline>>>,
    /// Recorded dispatches not yet submitted, and how many.
    pending: Mutex<Option<(wgpu::CommandEncoder, usize)>>,
}

pub(crate) fn device_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Device(format!("wgpu {what}: {e}"))
}

impl WgpuDevice {
    /// Opens the first adapter of the primary backends (Vulkan, Metal, DX12), a software
    /// one (lavapipe) included; `TESSERA_WGPU_ADAPTER=substring` picks by name. An error
    /// when there is none, naming what was searched.
    pub fn new() -> Result<Self> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::PRIMARY;
        let instance = wgpu::Instance::new(desc);
        let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
        let wanted = std::env::var("TESSERA_WGPU_ADAPTER").ok();
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        let adapter = adapters
            .into_iter()
            .find(|a| {
                wanted
                    .as_deref()
                    .is_none_or(|w| a.get_info().name.to_lowercase().contains(&w.to_lowercase()))
            })
            .ok_or_else(|| {
                Error::Device(match &wanted {
                    Some(w) => format!("no wgpu adapter named like '{w}' (found: {names:?})"),
                    None => "no wgpu adapter (Vulkan, Metal or DX12); on Linux without a GPU, \
                             install Mesa's software Vulkan driver (Debian: mesa-vulkan-drivers)"
                        .into(),
                })
            })?;
        let limits = adapter.limits();
        let mut required = wgpu::Limits::defaults();
        required.max_storage_buffer_binding_size = limits.max_storage_buffer_binding_size;
        required.max_buffer_size = limits.max_buffer_size;
        required.max_storage_buffers_per_shader_stage =
            limits.max_storage_buffers_per_shader_stage.min(8);
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("tessera"),
            required_features: wgpu::Features::empty(),
            required_limits: required,
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| device_err("request_device", e))?;
        Ok(WgpuDevice {
            device,
            queue,
            info: adapter.get_info(),
            max_binding: limits.max_storage_buffer_binding_size,
            pipelines: Mutex::new(HashMap::new()),
            pending: Mutex::new(None),
        })
    }

    /// The adapter's description (name, driver, type).
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    fn storage(&self, bytes: u64, label: &str) -> Result<wgpu::Buffer> {
        if bytes > self.max_binding {
            return Err(Error::Device(format!(
                "{label}: {bytes} bytes exceed the adapter's largest storage binding ({} bytes)",
                self.max_binding
            )));
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            // Bindings of 0 bytes are invalid: keep one word.
            size: bytes.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(device_err(label, e));
        }
        Ok(buffer)
    }

    pub(crate) fn words(&self, data: &[u8], label: &str) -> Result<wgpu::Buffer> {
        let buffer = self.storage(data.len() as u64, label)?;
        if !data.is_empty() {
            self.queue.write_buffer(&buffer, 0, data);
        }
        Ok(buffer)
    }

    /// The pipeline for `entry` of `source`, compiled on first use.
    pub(crate) fn pipeline(
        &self,
        entry: &'static str,
        source: &'static str,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let mut cache = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cache.get(entry) {
            return Ok(p.clone());
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(entry),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(device_err(entry, e));
        }
        let pipeline = Arc::new(pipeline);
        cache.insert(entry, pipeline.clone());
        Ok(pipeline)
    }

    /// Binds `params` (as a uniform) and `buffers` (bindings 1..; None for a binding
    /// the entry point does not use, which its derived layout then lacks) to
    /// `pipeline` and records a dispatch of `grid` workgroups into the pending encoder
    /// ([`WgpuDevice::submit`] sends it).
    pub(crate) fn launch(
        &self,
        pipeline: &wgpu::ComputePipeline,
        params: &[u32],
        buffers: &[Option<&wgpu::Buffer>],
        grid: [u32; 3],
    ) -> Result<()> {
        if grid.contains(&0) {
            return Ok(());
        }
        let uniform = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: (params.len() * 4).next_multiple_of(16) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut bytes: Vec<u8> = params.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.resize(bytes.len().next_multiple_of(16), 0);
        // A fresh buffer: its staged write lands before the submission that reads it.
        self.queue.write_buffer(&uniform, 0, &bytes);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.as_entire_binding(),
        }];
        entries.extend(buffers.iter().enumerate().filter_map(|(i, b)| {
            b.map(|b| wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: b.as_entire_binding(),
            })
        }));
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let (encoder, passes) = pending.get_or_insert_with(|| {
                let desc = wgpu::CommandEncoderDescriptor { label: None };
                (self.device.create_command_encoder(&desc), 0)
            });
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
            *passes += 1;
        }
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(device_err("launch", e));
        }
        Ok(())
    }

    /// Submits the recorded dispatches, if any; with `wait`, waits until the queue has
    /// run everything submitted.
    pub(crate) fn submit(&self, wait: bool) -> Result<()> {
        let taken = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((encoder, _)) = taken {
            let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
            self.queue.submit([encoder.finish()]);
            if let Some(e) = pollster::block_on(scope.pop()) {
                return Err(device_err("submit", e));
            }
        }
        if wait {
            self.wait()?;
        }
        Ok(())
    }

    /// Dispatches recorded and not yet submitted.
    fn pending_passes(&self) -> usize {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.as_ref().map_or(0, |p| p.1)
    }

    pub(crate) fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| device_err("poll", e))
    }

    fn read_back(&self, buffer: &wgpu::Buffer, len: usize) -> Result<Vec<f32>> {
        self.submit(false)?;
        let bytes = (len * 4) as u64;
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("download"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, bytes);
        self.queue.submit([encoder.finish()]);
        let (tx, rx) = mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|e| device_err("map", e))?
            .map_err(|e| device_err("map", e))?;
        let view = staging
            .get_mapped_range(..)
            .map_err(|e| device_err("map range", e))?;
        Ok(view
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

impl std::fmt::Debug for WgpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuDevice({})", self.name())
    }
}

fn as_bytes(data: &[f32]) -> Vec<u8> {
    data.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl Device for WgpuDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Wgpu
    }
    fn name(&self) -> String {
        format!(
            "{} ({:?}, {})",
            self.info.name, self.info.backend, self.info.driver
        )
    }
    fn supports(&self, op: &str, dtype: DType) -> bool {
        match op {
            "rms_norm" | "softmax" | "swiglu" | "add" | "rope" | "rope_neox" => dtype == DType::F32,
            "gemm" => matches!(dtype, DType::F32 | DType::F16 | DType::BF16),
            "qmatmul" => blocks::format_code(dtype).is_some(),
            "attention" | "paged_attention" | "varlen_attention" | "embedding" => {
                dtype == DType::F32
            }
            _ => false,
        }
    }
    fn upload(&self, data: &[f32]) -> Result<DeviceBuffer> {
        let buffer = self.words(&as_bytes(data), "upload")?;
        Ok(DeviceBuffer::new(data.len(), Buf { buffer }))
    }
    fn upload_half(&self, dtype: DType, bits: &[u16]) -> Result<DeviceBuffer> {
        tessera_core::device::checks::half_dtype("wgpu upload_half", dtype)?;
        // Whole words: an odd count ends with a zero half no view reaches.
        let mut bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        bytes.resize(bytes.len().next_multiple_of(4), 0);
        let buffer = self.words(&bytes, "upload_half")?;
        Ok(DeviceBuffer::new(bits.len(), HalfBuf { dtype, buffer }))
    }
    fn upload_blocks(
        &self,
        format: DType,
        rows: usize,
        cols: usize,
        raw: &[u8],
    ) -> Result<DeviceBuffer> {
        let r = blocks::repack("wgpu upload_blocks", format, rows, cols, raw)?;
        let scales = self.words(&as_bytes(&r.scales), "block scales")?;
        let codes = self.words(&r.codes, "block codes")?;
        Ok(DeviceBuffer::new(
            rows * cols,
            BlockBuf {
                format,
                rows,
                cols,
                scales,
                codes,
            },
        ))
    }
    fn write(&self, buf: &DeviceBuffer, data: &[f32]) -> Result<()> {
        if data.len() != buf.len() {
            return Err(Error::shape(
                "wgpu write",
                format!("{} values for a buffer of {}", data.len(), buf.len()),
            ));
        }
        // Dispatches recorded before the write must read the old contents: they go to
        // the queue first (a staged write runs before the next submission).
        self.submit(false)?;
        if !data.is_empty() {
            self.queue
                .write_buffer(&buf.get::<Buf>()?.buffer, 0, &as_bytes(data));
        }
        Ok(())
    }
    fn download(&self, buf: &DeviceBuffer) -> Result<Vec<f32>> {
        self.read_back(&buf.get::<Buf>()?.buffer, buf.len())
    }
    fn run(&self, call: &DeviceCall<'_>) -> Result<()> {
        crate::kernels::run(self, call)?;
        self.submit(true)
    }
    fn enqueue(&self, call: &DeviceCall<'_>) -> Result<()> {
        crate::kernels::run(self, call)?;
        if self.pending_passes() >= PASSES_PER_SUBMIT {
            self.submit(false)?;
        }
        Ok(())
    }
}
