//! [`HostCollectives`]: the collectives of a backend without a device path, on host bytes.
//!
//! The thread backend, MPI, the one-rank `SelfComm` (and the test communicators) move host
//! memory only. Each implements this trait once, on host bytes, and gets
//! [`Communicator`] from the blanket impl below, which runs every
//! collective on [`Buf`]/[`BufMut`]/[`BufInOut`] through [`staged`]: host buffers pass
//! straight to the kernel (a host receive buffer stays uninitialised), device buffers are
//! copied to the host and back. So the device staging is written once, here, for every such
//! backend, and no backend writes a collective twice.
//!
//! Why a trait with a blanket impl rather than an adapter type: a backend stays the type its
//! users hold (`ThreadComm`, `MpiComm` are handed around, wrapped in `Arc<dyn Communicator>`
//! and downcast by tests), and the host kernels keep the signatures they had, so each backend's
//! kernels did not change. NCCL and `cuda-threads` implement `Communicator` themselves (their
//! device path); the blanket impl cannot overlap them, since neither implements this trait.
//!
//! The method names are those of `Communicator`: on a type that has both traits in scope, call
//! through the trait (`HostCollectives::all_gather(self, …)`).

use super::buf::{staged, Buf, BufInOut, BufMut};
use super::{fingerprint, pending, variable, Communicator, Gather, OwnedBytes, PendingAllReduce, RecvBuf};
use crate::cuda::CudaDevice;
use crate::device::Device;
use crate::element::DType;
use crate::error::Result;
use crate::placement::ReduceOp;
use std::fmt;
use std::sync::Arc;

/// The collectives of a backend on host bytes (see the [module docs](self)); every
/// implementation is a [`Communicator`] through the blanket impl, which stages device
/// buffers through the host. The methods mean what [`Communicator`]'s of the same name mean.
///
/// # Safety
/// A [`RecvBuf`] may be uninitialised memory that the caller treats as initialised once the
/// call returns `Ok`: an implementation must then have written every one of its bytes.
pub unsafe trait HostCollectives: Send + Sync + fmt::Debug {
    /// [`Communicator::rank`].
    fn rank(&self) -> usize;
    /// [`Communicator::world_size`].
    fn world_size(&self) -> usize;
    /// [`Communicator::backend`].
    fn backend(&self) -> &'static str;
    /// [`Communicator::device`] (default: the host).
    fn device(&self) -> Device {
        Device::Cpu
    }
    /// [`Communicator::cuda_device`] (default: none).
    fn cuda_device(&self) -> Option<Arc<CudaDevice>> {
        None
    }
    /// [`Communicator::sequences`] (default: none).
    fn sequences(&self) -> Option<&fingerprint::Sequences> {
        None
    }
    /// [`Communicator::prepare_groups`] (default: nothing to prepare).
    fn prepare_groups(&self, _partitions: &[Vec<Vec<usize>>]) -> Result<()> {
        Ok(())
    }

    /// [`Communicator::all_gather`] on host bytes.
    fn all_gather(&self, group: &[usize], send: &[u8], recv: RecvBuf<'_>) -> Result<()>;
    /// [`Communicator::all_reduce`] on host bytes.
    fn all_reduce(&self, group: &[usize], buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()>;
    /// [`Communicator::reduce_scatter`] on host bytes.
    fn reduce_scatter(&self, group: &[usize], send: &[u8], recv: RecvBuf<'_>, dtype: DType, op: ReduceOp)
        -> Result<()>;
    /// [`Communicator::all_to_all`] on host bytes.
    fn all_to_all(&self, group: &[usize], send: &[u8], recv: RecvBuf<'_>) -> Result<()>;
    /// [`Communicator::all_reduce_into`] on host bytes. The default copies `send` into `recv`
    /// and reduces in place; backends that read their peers' buffers override it to reduce
    /// straight from the inputs.
    fn all_reduce_into(
        &self,
        group: &[usize],
        send: &[u8],
        mut recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        super::check::same_len("all_reduce", send.len(), recv.len())?;
        HostCollectives::all_reduce(self, group, recv.init_from(send), dtype, op)
    }
    /// [`Communicator::all_to_all_strided`] on host bytes. The default packs the blocks and
    /// calls `all_to_all`.
    fn all_to_all_strided(
        &self,
        group: &[usize],
        send: &[u8],
        rows: usize,
        run: usize,
        recv: RecvBuf<'_>,
    ) -> Result<()> {
        variable::packed_all_to_all(self, group, send, rows, run, recv)
    }
    /// [`Communicator::all_gather_v`] on host bytes. The default pads every block to the
    /// largest and runs `all_gather` (`comm::variable`).
    fn all_gather_v(&self, group: &[usize], send: &[u8], counts: &[usize], recv: RecvBuf<'_>) -> Result<()> {
        variable::padded_all_gather(self, group, send, counts, recv)
    }
    /// [`Communicator::reduce_scatter_v`] on host bytes. The default pads the blocks to the
    /// largest and runs `reduce_scatter` (`comm::variable`).
    fn reduce_scatter_v(
        &self,
        group: &[usize],
        send: &[u8],
        counts: &[usize],
        recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        variable::padded_reduce_scatter(self, group, send, counts, recv, dtype, op)
    }
    /// [`Communicator::all_to_all_v`] on host bytes. The default agrees on the largest block,
    /// pads every block to it and runs `all_to_all` (`comm::variable`).
    fn all_to_all_v(
        &self,
        group: &[usize],
        send: &[u8],
        rows: usize,
        runs: &[usize],
        recv: RecvBuf<'_>,
        recv_counts: &[usize],
    ) -> Result<()> {
        variable::padded_all_to_all(self, group, send, rows, runs, recv, recv_counts)
    }
    /// [`Communicator::broadcast`] on host bytes.
    fn broadcast(&self, group: &[usize], buf: &mut [u8], root: usize) -> Result<()>;
    /// [`Communicator::scatter`] on host bytes (`recv` initialised: the staging zero-fills a
    /// fresh one).
    fn scatter(&self, group: &[usize], send: &[u8], recv: &mut [u8], root: usize) -> Result<()>;
    /// [`Communicator::barrier`].
    fn barrier(&self, group: &[usize]) -> Result<()>;
    /// [`Communicator::all_reduce_start`]. The default ([`pending::run_now`]) runs the blocking
    /// all-reduce at once: a host buffer in place, a device buffer staged through the host.
    fn all_reduce_start(
        &self,
        group: &[usize],
        buf: Box<dyn OwnedBytes>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<PendingAllReduce> {
        pending::run_now(self, group, buf, dtype, op)
    }
    /// [`Communicator::all_gather_v_start`]. The default ([`pending::gather_now`]) runs the
    /// batch at once.
    fn all_gather_v_start(&self, group: &[usize], gathers: Vec<Gather>) -> Result<PendingAllReduce> {
        pending::gather_now(self, group, gathers)
    }
}

// SAFETY: host receive buffers go to the kernels as they are (each upholds the contract);
// device ones receive a host buffer that a kernel wrote completely (`BufMut::stage`).
unsafe impl<H: HostCollectives + ?Sized> Communicator for H {
    fn rank(&self) -> usize {
        HostCollectives::rank(self)
    }
    fn world_size(&self) -> usize {
        HostCollectives::world_size(self)
    }
    fn backend(&self) -> &'static str {
        HostCollectives::backend(self)
    }
    fn device(&self) -> Device {
        HostCollectives::device(self)
    }
    fn cuda_device(&self) -> Option<Arc<CudaDevice>> {
        HostCollectives::cuda_device(self)
    }
    fn sequences(&self) -> Option<&fingerprint::Sequences> {
        HostCollectives::sequences(self)
    }
    fn prepare_groups(&self, partitions: &[Vec<Vec<usize>>]) -> Result<()> {
        HostCollectives::prepare_groups(self, partitions)
    }
    fn all_gather(&self, group: &[usize], send: Buf<'_>, recv: BufMut<'_>) -> Result<()> {
        staged::send_recv(send, recv, |s, r| HostCollectives::all_gather(self, group, s, r))
    }
    fn all_gather_v(&self, group: &[usize], send: Buf<'_>, counts: &[usize], recv: BufMut<'_>) -> Result<()> {
        staged::send_recv(send, recv, |s, r| HostCollectives::all_gather_v(self, group, s, counts, r))
    }
    fn all_reduce(&self, group: &[usize], buf: BufInOut<'_>, dtype: DType, op: ReduceOp) -> Result<()> {
        staged::in_place(buf, |b| HostCollectives::all_reduce(self, group, b, dtype, op))
    }
    fn all_reduce_into(
        &self,
        group: &[usize],
        send: Buf<'_>,
        recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        staged::send_recv(send, recv, |s, r| HostCollectives::all_reduce_into(self, group, s, r, dtype, op))
    }
    fn reduce_scatter(
        &self,
        group: &[usize],
        send: Buf<'_>,
        recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        staged::send_recv(send, recv, |s, r| HostCollectives::reduce_scatter(self, group, s, r, dtype, op))
    }
    fn reduce_scatter_v(
        &self,
        group: &[usize],
        send: Buf<'_>,
        counts: &[usize],
        recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        staged::send_recv(send, recv, |s, r| HostCollectives::reduce_scatter_v(self, group, s, counts, r, dtype, op))
    }
    fn all_to_all(&self, group: &[usize], send: Buf<'_>, recv: BufMut<'_>) -> Result<()> {
        staged::send_recv(send, recv, |s, r| HostCollectives::all_to_all(self, group, s, r))
    }
    fn all_to_all_strided(
        &self,
        group: &[usize],
        send: Buf<'_>,
        rows: usize,
        run: usize,
        recv: BufMut<'_>,
    ) -> Result<()> {
        staged::send_recv(send, recv, |s, r| HostCollectives::all_to_all_strided(self, group, s, rows, run, r))
    }
    fn all_to_all_v(
        &self,
        group: &[usize],
        send: Buf<'_>,
        rows: usize,
        runs: &[usize],
        recv: BufMut<'_>,
        recv_counts: &[usize],
    ) -> Result<()> {
        staged::send_recv(send, recv, |s, r| HostCollectives::all_to_all_v(self, group, s, rows, runs, r, recv_counts))
    }
    fn broadcast(&self, group: &[usize], buf: BufInOut<'_>, root: usize) -> Result<()> {
        staged::in_place(buf, |b| HostCollectives::broadcast(self, group, b, root))
    }
    fn scatter(&self, group: &[usize], send: Buf<'_>, recv: BufMut<'_>, root: usize) -> Result<()> {
        staged::send_recv_init(send, recv, |s, r| HostCollectives::scatter(self, group, s, r, root))
    }
    fn barrier(&self, group: &[usize]) -> Result<()> {
        HostCollectives::barrier(self, group)
    }
    fn all_reduce_start(
        &self,
        group: &[usize],
        buf: Box<dyn OwnedBytes>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<PendingAllReduce> {
        HostCollectives::all_reduce_start(self, group, buf, dtype, op)
    }
    fn all_gather_v_start(&self, group: &[usize], gathers: Vec<Gather>) -> Result<PendingAllReduce> {
        HostCollectives::all_gather_v_start(self, group, gathers)
    }
}
