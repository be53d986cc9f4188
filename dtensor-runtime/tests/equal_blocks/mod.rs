//! A communicator with only the required methods of `Communicator`, delegated to the thread
//! backend: its variable-size collectives run the trait's padded defaults over the
//! equal-block ones (what NCCL uses). Shared by the tests of those defaults.

use dtensor_runtime::comm::RecvBuf;
use dtensor_runtime::{Communicator, DType, Error, ReduceOp, ThreadComm};

#[derive(Debug)]
pub struct EqualBlocksOnly(pub ThreadComm);

// SAFETY: every method delegates to `ThreadComm`, which writes all of its `RecvBuf` on `Ok`.
unsafe impl Communicator for EqualBlocksOnly {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    fn backend(&self) -> &'static str {
        "equal-blocks-only"
    }
    fn all_gather(&self, g: &[usize], send: &[u8], recv: RecvBuf<'_>) -> Result<(), Error> {
        self.0.all_gather(g, send, recv)
    }
    fn all_reduce(&self, g: &[usize], buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<(), Error> {
        self.0.all_reduce(g, buf, dtype, op)
    }
    fn reduce_scatter(
        &self,
        g: &[usize],
        send: &[u8],
        recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), Error> {
        self.0.reduce_scatter(g, send, recv, dtype, op)
    }
    fn all_to_all(&self, g: &[usize], send: &[u8], recv: RecvBuf<'_>) -> Result<(), Error> {
        self.0.all_to_all(g, send, recv)
    }
    fn broadcast(&self, g: &[usize], buf: &mut [u8], root: usize) -> Result<(), Error> {
        self.0.broadcast(g, buf, root)
    }
    fn scatter(&self, g: &[usize], send: &[u8], recv: &mut [u8], root: usize) -> Result<(), Error> {
        self.0.scatter(g, send, recv, root)
    }
    fn barrier(&self, g: &[usize]) -> Result<(), Error> {
        self.0.barrier(g)
    }
}
