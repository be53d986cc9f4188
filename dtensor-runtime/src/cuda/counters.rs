//! Counts of the work this process gives CUDA devices: kernel launches, cuBLAS calls and
//! copies between host and device, so that a step's launches and transfers can be compared
//! with PyTorch's (`torch.profiler`) and a copy that should not happen inside a step is seen.
//!
//! Process-wide (every rank of `cuda-threads` and every device together) and always present:
//! without the `cuda` feature, or without device work, every count stays zero. Read the
//! difference of two snapshots around the work.
//!
//! ```
//! use dtensor_runtime::cuda::DeviceCounters;
//! let before = DeviceCounters::now();
//! // ... a training step on a CUDA mesh ...
//! let step = DeviceCounters::now().since(&before);
//! assert_eq!(step.host_to_device, 0); // nothing ran on a device here
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of the counts (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceCounters {
    /// Kernels launched (the crate's own, compiled with NVRTC).
    pub kernel_launches: u64,
    /// cuBLAS calls (each one or more kernels of the library's own).
    pub blas_calls: u64,
    /// Host-to-device copies, and their bytes.
    pub host_to_device: u64,
    /// Bytes copied host to device.
    pub host_to_device_bytes: u64,
    /// Device-to-host copies.
    pub device_to_host: u64,
    /// Bytes copied device to host.
    pub device_to_host_bytes: u64,
    /// Device-to-device copies (copies on write, device collectives' staging).
    pub device_to_device: u64,
}

/// One process-wide count per field, in field order.
static COUNTS: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];

/// What is counted.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Clone, Copy)]
pub(crate) enum Work {
    Launch,
    Blas,
    HostToDevice(usize),
    DeviceToHost(usize),
    DeviceToDevice,
}

/// Counts one piece of device work.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn count(work: Work) {
    let add = |i: usize, n: u64| COUNTS[i].fetch_add(n, Ordering::Relaxed);
    match work {
        Work::Launch => add(0, 1),
        Work::Blas => add(1, 1),
        Work::HostToDevice(bytes) => {
            add(2, 1);
            add(3, bytes as u64)
        }
        Work::DeviceToHost(bytes) => {
            add(4, 1);
            add(5, bytes as u64)
        }
        Work::DeviceToDevice => add(6, 1),
    };
}

impl DeviceCounters {
    /// The counts so far.
    pub fn now() -> Self {
        let c = |i: usize| COUNTS[i].load(Ordering::Relaxed);
        DeviceCounters {
            kernel_launches: c(0),
            blas_calls: c(1),
            host_to_device: c(2),
            host_to_device_bytes: c(3),
            device_to_host: c(4),
            device_to_host_bytes: c(5),
            device_to_device: c(6),
        }
    }

    /// The counts since `earlier` (a snapshot taken before).
    pub fn since(&self, earlier: &DeviceCounters) -> Self {
        DeviceCounters {
            kernel_launches: self.kernel_launches.saturating_sub(earlier.kernel_launches),
            blas_calls: self.blas_calls.saturating_sub(earlier.blas_calls),
            host_to_device: self.host_to_device.saturating_sub(earlier.host_to_device),
            host_to_device_bytes: self.host_to_device_bytes.saturating_sub(earlier.host_to_device_bytes),
            device_to_host: self.device_to_host.saturating_sub(earlier.device_to_host),
            device_to_host_bytes: self.device_to_host_bytes.saturating_sub(earlier.device_to_host_bytes),
            device_to_device: self.device_to_device.saturating_sub(earlier.device_to_device),
        }
    }
}
