//! Where data lives and where new data is allocated: the device vocabulary every layer shares
//! (storage, communicators, meshes, launchers), kept at the bottom so none of them imports
//! another for it.

use crate::cuda::CudaDevice;
use std::fmt;
use std::sync::Arc;

/// Where a shard lives: the host or a CUDA device (by ordinal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory.
    #[default]
    Cpu,
    /// The CUDA device of this ordinal.
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(k) => write!(f, "cuda:{k}"),
        }
    }
}

/// What new storage is allocated on: the host, or a CUDA device handle (whose stream the
/// work is queued on). A [`DeviceMesh`](crate::DeviceMesh) holds the target of its rank.
#[derive(Clone, Debug)]
pub enum Target {
    /// Host memory.
    Cpu,
    /// A CUDA device (with the stream of this rank).
    Cuda(Arc<CudaDevice>),
}

impl Target {
    /// The device this target allocates on.
    pub fn device(&self) -> Device {
        match self {
            Target::Cpu => Device::Cpu,
            Target::Cuda(d) => Device::Cuda(d.ordinal()),
        }
    }
}
