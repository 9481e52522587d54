//! An instance's buffers on a device: uploaded on the first run of a device variant
//! (outside the timed call, as a model uploads its weights once), reused by later runs,
//! and read back only when the output is asked for. The inputs are the very values the
//! CPU variants see, so the float64 reference and tolerance are shared.

use super::Variant;
use std::sync::Arc;
use tessera_core::device::{Device, DeviceBuffer};
use tessera_core::{Error, Result};

/// One instance's buffers on the device of one variant.
pub struct OnDevice {
    /// The variant they were uploaded for.
    pub variant: Variant,
    /// Its device.
    pub device: Arc<dyn Device>,
    /// The instance's buffers, in the order its upload made them.
    pub bufs: Vec<DeviceBuffer>,
    /// The output buffer's index in `bufs`.
    pub out: usize,
    /// Whether the latest run of the instance was on this device (else its output is
    /// the host buffer's).
    pub ran: bool,
}

impl std::fmt::Debug for OnDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OnDevice({}, {} buffers)", self.variant, self.bufs.len())
    }
}

impl OnDevice {
    /// The state for device variant `v`, uploading with `upload` (which returns the
    /// buffers and the output's index) unless `slot` already holds this variant's.
    pub fn ensure<'a>(
        slot: &'a mut Option<OnDevice>,
        v: &Variant,
        upload: impl FnOnce(&dyn Device) -> Result<(Vec<DeviceBuffer>, usize)>,
    ) -> Result<&'a mut OnDevice> {
        if slot.as_ref().is_none_or(|s| s.variant != *v) {
            let device = v.device_handle().ok_or_else(|| {
                Error::Unsupported(format!("{}: no such device installed", v.label))
            })?;
            let (bufs, out) = upload(device.as_ref())?;
            *slot = Some(OnDevice {
                variant: v.clone(),
                device,
                bufs,
                out,
                ran: false,
            });
        }
        Ok(slot.as_mut().expect("just filled"))
    }

    /// Marks a host run: later outputs come from the host buffers.
    pub fn host_ran(slot: &mut Option<OnDevice>) {
        if let Some(s) = slot {
            s.ran = false;
        }
    }

    /// The device output if the latest run was on the device (None: read the host's).
    /// A failed download reads as NaN, which verification reports as unwritten.
    pub fn output(slot: &Option<OnDevice>) -> Option<Vec<f32>> {
        let s = slot.as_ref().filter(|s| s.ran)?;
        Some(
            s.device
                .download(&s.bufs[s.out])
                .unwrap_or_else(|_| vec![f32::NAN; s.bufs[s.out].len()]),
        )
    }

    /// Overwrites the device output with `values` (NaN poison, or β's initial C). If
    /// the write fails the state is dropped, so the next run uploads afresh rather than
    /// leave a stale output to be read as the new one.
    pub fn reset_output(slot: &mut Option<OnDevice>, values: impl FnOnce(usize) -> Vec<f32>) {
        if let Some(s) = slot {
            let out = &s.bufs[s.out];
            if s.device.write(out, &values(out.len())).is_err() {
                *slot = None;
            }
        }
    }
}
