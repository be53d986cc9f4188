//! `SelfComm`: the communicator of a one-rank world on one device, where every collective
//! is a copy. Local tensors (PyTorch's plain `torch.Tensor`) live on meshes made of it.

use super::{HostCollectives, RecvBuf};
use crate::cuda::CudaDevice;
use crate::device::{Device, Target};
use crate::element::DType;
use crate::error::Result;
use crate::placement::ReduceOp;
use std::sync::Arc;

/// The communicator of a one-rank world on one device: every collective is a copy.
#[derive(Debug)]
pub(crate) struct SelfComm {
    target: Target,
}

impl SelfComm {
    /// The backend name local meshes report (how [`is_local_mesh`](crate::autograd::is_local_mesh) recognises them).
    pub(crate) const BACKEND: &'static str = "local";

    pub(crate) fn new(target: Target) -> SelfComm {
        SelfComm { target }
    }
}

// SAFETY: each collective with a `RecvBuf` copies a whole `send` of its length into it.
unsafe impl HostCollectives for SelfComm {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn backend(&self) -> &'static str {
        Self::BACKEND
    }
    fn device(&self) -> Device {
        self.target.device()
    }
    fn cuda_device(&self) -> Option<Arc<CudaDevice>> {
        match &self.target {
            Target::Cpu => None,
            Target::Cuda(d) => Some(Arc::clone(d)),
        }
    }
    fn all_gather(&self, _g: &[usize], send: &[u8], mut recv: RecvBuf<'_>) -> Result<()> {
        recv.init_from(send);
        Ok(())
    }
    fn all_reduce(&self, _g: &[usize], _buf: &mut [u8], _dtype: DType, _op: ReduceOp) -> Result<()> {
        Ok(())
    }
    fn reduce_scatter(&self, _g: &[usize], send: &[u8], mut recv: RecvBuf<'_>, _d: DType, _op: ReduceOp) -> Result<()> {
        recv.init_from(send);
        Ok(())
    }
    fn all_to_all(&self, _g: &[usize], send: &[u8], mut recv: RecvBuf<'_>) -> Result<()> {
        recv.init_from(send);
        Ok(())
    }
    fn broadcast(&self, _g: &[usize], _buf: &mut [u8], _root: usize) -> Result<()> {
        Ok(())
    }
    fn scatter(&self, _g: &[usize], send: &[u8], recv: &mut [u8], _root: usize) -> Result<()> {
        let n = recv.len();
        recv.copy_from_slice(&send[..n]);
        Ok(())
    }
    fn barrier(&self, _g: &[usize]) -> Result<()> {
        Ok(())
    }
}
