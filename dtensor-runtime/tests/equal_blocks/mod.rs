//! A communicator with only the required methods of `HostCollectives`, delegated to the thread
//! backend: its variable-size collectives run the trait's padded defaults over the
//! equal-block ones (what NCCL uses). Shared by the tests of those defaults.

use dtensor_runtime::comm::RecvBuf;
use dtensor_runtime::{DType, Error, HostCollectives, ReduceOp, ThreadComm};

#[derive(Debug)]
pub struct EqualBlocksOnly(pub ThreadComm);

// SAFETY: every method delegates to `ThreadComm`, which writes all of its `RecvBuf` on `Ok`.
unsafe impl HostCollectives for EqualBlocksOnly {
    fn rank(&self) -> usize {
        HostCollectives::rank(&self.0)
    }
    fn world_size(&self) -> usize {
        HostCollectives::world_size(&self.0)
    }
    fn backend(&self) -> &'static str {
        "equal-blocks-only"
    }
    fn all_gather(&self, g: &[usize], send: &[u8], recv: RecvBuf<'_>) -> Result<(), Error> {
        HostCollectives::all_gather(&self.0, g, send, recv)
    }
    fn all_reduce(&self, g: &[usize], buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<(), Error> {
        HostCollectives::all_reduce(&self.0, g, buf, dtype, op)
    }
    fn reduce_scatter(
        &self,
        g: &[usize],
        send: &[u8],
        recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), Error> {
        HostCollectives::reduce_scatter(&self.0, g, send, recv, dtype, op)
    }
    fn all_to_all(&self, g: &[usize], send: &[u8], recv: RecvBuf<'_>) -> Result<(), Error> {
        HostCollectives::all_to_all(&self.0, g, send, recv)
    }
    fn broadcast(&self, g: &[usize], buf: &mut [u8], root: usize) -> Result<(), Error> {
        HostCollectives::broadcast(&self.0, g, buf, root)
    }
    fn scatter(&self, g: &[usize], send: &[u8], recv: &mut [u8], root: usize) -> Result<(), Error> {
        HostCollectives::scatter(&self.0, g, send, recv, root)
    }
    fn barrier(&self, g: &[usize]) -> Result<(), Error> {
        HostCollectives::barrier(&self.0, g)
    }
}
