//! `cuda-threads`: ranks as threads of one process whose shards live on CUDA devices (several
//! ranks may share one GPU), exchanging data through the thread backend's rendezvous.
//!
//! The communicator is the rank's [`ThreadComm`] plus its [`CudaDevice`] handle (own context
//! binding and stream): a mesh over it places every DTensor on that device, and the
//! collectives on device storage stage the shards through the host, as the thread backend
//! does for every device buffer (there is no device reduce kernel shared between ranks yet,
//! so reductions run on the host too).

use super::threads::ThreadComm;
use super::{fingerprint, Communicator, RecvBuf};
use crate::cuda::CudaDevice;
use crate::element::DType;
use crate::error::Result;
use crate::placement::ReduceOp;
use crate::storage::Device;
use std::sync::Arc;

/// A thread-backend rank whose shards live on `device` (see the [module docs](self)).
#[derive(Debug)]
pub struct CudaThreadsComm {
    inner: ThreadComm,
    device: Arc<CudaDevice>,
}

impl CudaThreadsComm {
    /// The rank of `inner` with its shards on `device` (open one handle per rank: each owns
    /// its stream).
    pub fn new(inner: ThreadComm, device: Arc<CudaDevice>) -> Self {
        CudaThreadsComm { inner, device }
    }
}

// SAFETY: every collective is the inner thread communicator's, which upholds the contract.
unsafe impl Communicator for CudaThreadsComm {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn backend(&self) -> &'static str {
        "cuda-threads"
    }
    fn device(&self) -> Device {
        Device::Cuda(self.device.ordinal())
    }
    fn cuda_device(&self) -> Option<Arc<CudaDevice>> {
        Some(Arc::clone(&self.device))
    }
    fn sequences(&self) -> Option<&fingerprint::Sequences> {
        self.inner.sequences()
    }
    fn all_gather(&self, group: &[usize], send: &[u8], recv: RecvBuf<'_>) -> Result<()> {
        self.inner.all_gather(group, send, recv)
    }
    fn all_reduce(&self, group: &[usize], buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        self.inner.all_reduce(group, buf, dtype, op)
    }
    fn all_reduce_into(
        &self,
        group: &[usize],
        send: &[u8],
        recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.inner.all_reduce_into(group, send, recv, dtype, op)
    }
    fn reduce_scatter(
        &self,
        group: &[usize],
        send: &[u8],
        recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.inner.reduce_scatter(group, send, recv, dtype, op)
    }
    fn all_to_all(&self, group: &[usize], send: &[u8], recv: RecvBuf<'_>) -> Result<()> {
        self.inner.all_to_all(group, send, recv)
    }
    fn all_to_all_strided(
        &self,
        group: &[usize],
        send: &[u8],
        rows: usize,
        run: usize,
        recv: RecvBuf<'_>,
    ) -> Result<()> {
        self.inner.all_to_all_strided(group, send, rows, run, recv)
    }
    fn broadcast(&self, group: &[usize], buf: &mut [u8], root: usize) -> Result<()> {
        self.inner.broadcast(group, buf, root)
    }
    fn scatter(&self, group: &[usize], send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        self.inner.scatter(group, send, recv, root)
    }
    fn barrier(&self, group: &[usize]) -> Result<()> {
        self.inner.barrier(group)
    }
}
