//! Collective communication.
//!
//! One [`Communicator`] trait; backends implement it once:
//! - [`threads`]: the embedded default, one OS thread per rank in one process (zero setup);
//! - `mpi` (feature `mpi`): processes and nodes through MPI;
//! - `nccl` (feature `cuda`): GPUs through NCCL;
//! - [`cuda_threads`]: thread ranks whose shards live on GPUs.
//!
//! Redistribution and ops never call a backend directly: they go through the typed collectives of
//! [`DeviceMesh`](crate::DeviceMesh) (`mesh/`),
//! which works on typed slices, pads uneven shards and records every call for
//! [`CommDebugMode`](crate::CommDebugMode).
//!
//! The trait has one family of collectives, each on buffers in host or device memory
//! ([`Buf`] in, [`BufMut`] out — on the host a [`RecvBuf`], which need not be initialised —
//! and [`BufInOut`] for the in-place all-reduce and broadcast). Backends without a device
//! path (threads, MPI, the one-rank `SelfComm`) write their kernels once, on host bytes, as
//! [`HostCollectives`], whose blanket impl of [`Communicator`] stages device buffers through
//! the host ([`buf::staged`], the one place that does); NCCL and `cuda-threads` implement
//! [`Communicator`] directly and run device buffers on the device. The one started
//! collective, [`Communicator::all_reduce_start`], takes an owned buffer ([`OwnedBytes`]) in
//! host or device memory and returns a [`PendingAllReduce`]: the data-parallel overlap
//! (`autograd/grad_reducer.rs`) starts its device gradient buckets on the device with it.

pub(crate) mod background;
pub mod bootstrap;
pub mod buf;
mod check;
pub mod cuda_threads;
pub mod debug;
pub mod fingerprint;
mod group;
pub mod host;
pub(crate) mod in_flight;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod nccl_version;
pub mod pending;
mod recv;
pub mod reduce;
pub(crate) mod self_comm;
pub mod threads;
pub mod timeout;
pub(crate) mod variable;

use crate::cuda::CudaDevice;
use crate::device::Device;
use crate::element::DType;
use crate::error::Result;
use crate::placement::ReduceOp;
use std::fmt;
use std::sync::Arc;

use buf::staged;
pub use buf::{Buf, BufInOut, BufMut};
pub(crate) use group::index_of as group_index;
pub use host::HostCollectives;
pub use in_flight::{PendingGather, PendingReduce};
pub use pending::{Gather, GatherBatch, OwnedBytes, PendingAllReduce};
pub(crate) use recv::filled;
pub use recv::RecvBuf;

/// Collectives over a *group*: a list of global ranks in group order that contains the
/// calling rank. Every member of the group must make the same call with the same sizes.
///
/// One family of collectives, each on buffers in host or device memory: [`Buf`] to read,
/// [`BufMut`] to write (on the host a [`RecvBuf`], which may be uninitialised), [`BufInOut`]
/// for the in-place all-reduce and broadcast. Buffers are raw bytes of elements of `dtype`;
/// `root` is an index into `group`. A backend must fail (never hang forever) when a peer dies:
/// time out or propagate.
///
/// Backends without a device path implement [`HostCollectives`] (the kernels on host bytes)
/// and get this trait from its blanket impl, which stages device buffers through the host
/// ([`buf::staged`]); NCCL and `cuda-threads` implement it directly and run device buffers on
/// the device.
///
/// Members that disagree — on a length, a count (equal totals included), an element type, a
/// reduction or a root — get a typed error on every member before any data moves, never
/// `Ok` with wrong data: the thread backend compares what the members publish, MPI starts
/// every collective with a small agreement (`comm::mpi`), and the variable-size defaults
/// exchange the counts first (`comm::variable`). NCCL's equal-block collectives compare
/// nothing themselves: there the collective fingerprint check ([`fingerprint`], on with
/// `DTENSOR_DEBUG=detail`) is what catches disagreement.
///
/// # Safety
/// The host arm of a [`BufMut`] is a [`RecvBuf`] that may be uninitialised memory, which the
/// caller treats as initialised once the call returns `Ok`: an implementation must then have
/// written every one of its bytes (and every byte of a device [`BufMut`]). It must only write
/// initialised bytes through it.
pub unsafe trait Communicator: Send + Sync + fmt::Debug {
    /// This process' global rank.
    fn rank(&self) -> usize;
    /// Number of ranks in the world.
    fn world_size(&self) -> usize;
    /// Short backend name (`threads`, `cuda-threads`, `mpi`, `nccl`).
    fn backend(&self) -> &'static str;

    /// The device this rank's shards live on (default: the host). A mesh over this
    /// communicator places every DTensor's local data there.
    fn device(&self) -> Device {
        Device::Cpu
    }

    /// The handle of this rank's CUDA device (context and stream) when [`device`](Self::device)
    /// is `Device::Cuda` (default: none).
    fn cuda_device(&self) -> Option<Arc<CudaDevice>> {
        None
    }

    /// The sequence numbers of this rank's checked collectives per group, for the collective
    /// fingerprint check ([`fingerprint`]); `None` (the default) numbers every call 0.
    fn sequences(&self) -> Option<&fingerprint::Sequences> {
        None
    }

    /// Called collectively by every rank of the world when a mesh is created, with every
    /// group of every mesh dim (each a partition of the world). Backends that need
    /// sub-communicators (MPI, NCCL) create them here; the default does nothing.
    fn prepare_groups(&self, _partitions: &[Vec<Vec<usize>>]) -> Result<()> {
        Ok(())
    }

    /// `recv` (= `group.len() * send.len()` bytes) receives every member's `send`, in group order.
    fn all_gather(&self, group: &[usize], send: Buf<'_>, recv: BufMut<'_>) -> Result<()>;
    /// Variable-size [`all_gather`](Self::all_gather) (uneven shards): member `i` sends
    /// `counts[i]` bytes, and `recv` (`Σ counts` bytes) receives every member's `send`, back to
    /// back in group order. Every member passes the same `counts`.
    ///
    /// The default stages device buffers through the host, pads every block to the largest and
    /// runs `all_gather` (one copy in, one out); the thread backend copies the blocks into
    /// place, MPI runs `MPI_Allgatherv`.
    fn all_gather_v(&self, group: &[usize], send: Buf<'_>, counts: &[usize], recv: BufMut<'_>) -> Result<()> {
        staged::send_recv(send, recv, |s, r| variable::padded_all_gather(self, group, s, counts, r))
    }
    /// Reduces `buf` element-wise over the group, in place; the result is identical on every member.
    fn all_reduce(&self, group: &[usize], buf: BufInOut<'_>, dtype: DType, op: ReduceOp) -> Result<()>;
    /// Out-of-place all-reduce: `recv` (as long as `send`) receives the element-wise reduction
    /// of every member's `send`, identical on every member. Backends that read their peers'
    /// buffers reduce straight from the inputs (one pass instead of a copy and a pass).
    fn all_reduce_into(
        &self,
        group: &[usize],
        send: Buf<'_>,
        recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()>;
    /// `send` holds `group.len()` equal blocks; member `i` receives the reduction of block `i`.
    fn reduce_scatter(
        &self,
        group: &[usize],
        send: Buf<'_>,
        recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()>;
    /// Variable-size [`reduce_scatter`](Self::reduce_scatter): `send` holds `group.len()`
    /// blocks back to back, block `i` of `counts[i]` bytes (whole elements); member `i`'s
    /// `recv` (`counts[i]` bytes) receives the reduction of every member's block `i`. Every
    /// member passes the same `counts`. The default stages device buffers through the host,
    /// pads the blocks to the largest and runs `reduce_scatter`; the thread backend reduces
    /// the blocks where they lie.
    fn reduce_scatter_v(
        &self,
        group: &[usize],
        send: Buf<'_>,
        counts: &[usize],
        recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        staged::send_recv(send, recv, |s, r| variable::padded_reduce_scatter(self, group, s, counts, r, dtype, op))
    }
    /// `send` holds `group.len()` equal blocks; block `j` goes to member `j`, whose `recv`
    /// block `i` is what member `i` sent it.
    fn all_to_all(&self, group: &[usize], send: Buf<'_>, recv: BufMut<'_>) -> Result<()>;
    /// [`all_to_all`](Self::all_to_all) whose send blocks are the column blocks of a row-major
    /// buffer of `rows` rows of `group.len()` runs of `run` bytes each: block `j` is run `j` of
    /// every row (a split along a non-leading tensor dim). `recv` receives contiguous blocks,
    /// as from `all_to_all`. The default stages device buffers through the host, packs the
    /// blocks and calls `all_to_all`; the thread backend writes each member's runs straight
    /// into its peers' `recv`.
    fn all_to_all_strided(
        &self,
        group: &[usize],
        send: Buf<'_>,
        rows: usize,
        run: usize,
        recv: BufMut<'_>,
    ) -> Result<()> {
        staged::send_recv(send, recv, |s, r| variable::packed_all_to_all(self, group, s, rows, run, r))
    }
    /// Variable-size [`all_to_all_strided`](Self::all_to_all_strided): `send` is `rows` rows,
    /// each of `group.len()` runs, run `j` (`runs[j]` bytes) for member `j`; members may have
    /// different `rows` and `runs` (`rows = 1` is a plain all-to-all of blocks of `runs[j]`
    /// bytes). `recv` receives, in group order, what each member sends us, `recv_counts[i]`
    /// bytes from member `i` (its run for us, row after row), so `recv_counts[i]` must be
    /// member `i`'s `rows × runs[me]`.
    ///
    /// The default stages device buffers through the host, agrees on the largest block (an
    /// all-gather of one `u64`), pads every block to it and runs `all_to_all`; the thread
    /// backend writes each run straight into its peer's `recv`, MPI runs `MPI_Alltoallv`.
    fn all_to_all_v(
        &self,
        group: &[usize],
        send: Buf<'_>,
        rows: usize,
        runs: &[usize],
        recv: BufMut<'_>,
        recv_counts: &[usize],
    ) -> Result<()> {
        staged::send_recv(send, recv, |s, r| variable::padded_all_to_all(self, group, s, rows, runs, r, recv_counts))
    }
    /// Copies the root's `buf` into every member's `buf`.
    fn broadcast(&self, group: &[usize], buf: BufInOut<'_>, root: usize) -> Result<()>;
    /// The root's `send` holds `group.len()` equal blocks; member `i` receives block `i`.
    /// `send` is ignored on non-roots.
    fn scatter(&self, group: &[usize], send: Buf<'_>, recv: BufMut<'_>, root: usize) -> Result<()>;
    /// Returns once every member has entered.
    fn barrier(&self, group: &[usize]) -> Result<()>;
    /// Starts an in-place all-reduce of the owned buffer `buf` (host memory, or device memory
    /// of this rank's device) that may complete in the background; [`PendingAllReduce::wait`]
    /// returns the buffer reduced. Every member starts it at the same point of its sequence of
    /// collectives on `group`, and the caller waits for it before its next collective on
    /// `group` (the typed layer does both).
    ///
    /// The default ([`pending::run_now`]) runs the blocking all-reduce at once (no overlap): a
    /// host buffer through [`all_reduce`](Self::all_reduce), a device buffer through
    /// [`all_reduce_into`](Self::all_reduce_into) into a fresh device buffer, so NCCL and
    /// `cuda-threads` reduce device buffers on the device and the other backends stage them
    /// through the host. The thread backend queues host buffers to a per-rank worker thread;
    /// MPI starts an `MPI_Iallreduce` on host buffers.
    fn all_reduce_start(
        &self,
        group: &[usize],
        buf: Box<dyn OwnedBytes>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<PendingAllReduce> {
        pending::run_now(self, group, buf, dtype, op)
    }
    /// Starts a batch of [`all_gather_v`](Self::all_gather_v)s over `group` (each of owned host
    /// buffers: [`Gather`]) that may complete in the background, one after the other;
    /// [`PendingAllReduce::wait`] returns a [`GatherBatch`] of the filled receive buffers. The
    /// ordering contract of [`all_reduce_start`](Self::all_reduce_start) applies to the batch.
    ///
    /// The default ([`pending::gather_now`]) runs them at once; the thread backend queues the
    /// batch to the rank's worker thread as one job; MPI starts one `MPI_Iallgatherv` each.
    fn all_gather_v_start(&self, group: &[usize], gathers: Vec<Gather>) -> Result<PendingAllReduce> {
        pending::gather_now(self, group, gathers)
    }
}
