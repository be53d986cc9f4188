//! A one-rank communicator that reports a chosen device (and optionally its CUDA handle):
//! every collective of a world of one is a copy (on host bytes: device buffers are staged
//! through the host by the blanket `Communicator` impl). Lets tests build meshes on a device
//! without a multi-rank device backend.
#![allow(dead_code)]

use dtensor_runtime::cuda::CudaDevice;
use dtensor_runtime::{DType, Device, HostCollectives, RecvBuf, ReduceOp, Result};
use std::sync::Arc;

#[derive(Debug)]
pub struct OneRankComm {
    pub device: Device,
    pub handle: Option<Arc<CudaDevice>>,
}

// SAFETY: each collective with a `RecvBuf` copies a whole `send` of its length into it.
unsafe impl HostCollectives for OneRankComm {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn backend(&self) -> &'static str {
        "one-rank"
    }
    fn device(&self) -> Device {
        self.device
    }
    fn cuda_device(&self) -> Option<Arc<CudaDevice>> {
        self.handle.clone()
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
