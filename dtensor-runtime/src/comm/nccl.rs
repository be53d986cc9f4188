//! NCCL backend (cargo feature `cuda`): collectives between GPUs, one rank per GPU.
//!
//! Every collective runs on the rank's stream (the one its [`CudaDevice`] queues kernels on).
//! Collectives on device buffers ([`Buf::Cuda`], [`BufInOut::Cuda`]) of this rank's device call
//! NCCL on them directly; host buffers are staged through device buffers (copy in, run, wait,
//! copy out), so host DTensors on an NCCL mesh keep working. Max/min of floats (NaN mask) and
//! `Avg` without `ncclAvg` (host divide) stage device buffers through the host instead
//! ([`staged`](super::buf::staged)). The variable-size collectives and the strided all-to-all
//! are the trait's defaults (padded or packed equal-block collectives).
//!
//! * all-reduce, all-gather, reduce-scatter, broadcast: the NCCL collectives (`Avg` is
//!   `ncclAvg` on NCCL ≥ 2.10, else a sum divided by the group size on the host);
//! * max/min: a NaN mask is max-reduced alongside, so a NaN operand wins as in PyTorch;
//! * all-to-all: grouped `ncclSend`/`ncclRecv` (NCCL has no all-to-all);
//! * scatter: grouped send/recv from the root; barrier: a one-element all-reduce.
//!
//! Groups: [`prepare_groups`](Communicator::prepare_groups) (called collectively by
//! `DeviceMesh::new`) creates one sub-communicator per group it is given: `ncclCommSplit` on
//! NCCL ≥ 2.18, else `ncclCommInitRank` per group with an id shared over the world
//! communicator ([`NcclVersion::group_strategy`]; the version is read with `ncclGetVersion`
//! first, because cudarc panics on a symbol the library lacks). NCCL cannot create a
//! communicator for only some ranks later, so a group that was not prepared is an
//! [`Error::Unavailable`]. cudarc's safe `Comm` is never used: its `Drop` panics on error.
//!
//! Bootstrap (the 128-byte NCCL unique id must reach every rank):
//! * [`NcclComm::from_env`]: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` as torchrun
//!   sets them; rank 0 creates the id and serves it over one TCP connection per peer
//!   ([`super::bootstrap::Rendezvous`]);
//! * `NcclComm::from_mpi` (features `cuda` + `mpi`): rank 0's id is broadcast over MPI;
//! * [`NcclComm::init_all`]: every GPU of this process at once (no id to exchange);
//! * [`NcclComm::single`]: a world of one GPU.
//!
//! Failures: each wait polls the stream and `ncclCommGetAsyncError`; on an NCCL error or after
//! `DTENSOR_TIMEOUT_MS` the communicator is aborted (`ncclCommAbort`) and the call returns
//! [`Error::Backend`] / [`Error::CollectiveTimeout`]; the communicator is unusable afterwards.

use super::bootstrap::Rendezvous;
use super::buf::{in_out_on, staged, CudaBytes, CudaBytesMut, Reduce};
use super::nccl_version::{GroupStrategy, NcclVersion};
use super::{check, group, reduce};
use super::{Buf, BufInOut, BufMut, Communicator, RecvBuf};
use crate::cuda::counters::{count, Work};
use crate::cuda::{cuda_err, require, CudaDevice, CudaLib};
use crate::device::Device;
use crate::element::DType;
use crate::error::{Error, Result};
use crate::placement::ReduceOp;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::{result, sys};
use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn nccl_err(what: &str, e: impl fmt::Debug) -> Error {
    Error::Backend { backend: "nccl".into(), message: format!("{what}: {e:?}") }
}

/// The 128-byte NCCL unique id every rank of one communicator must share.
pub type NcclId = [u8; 128];

/// The loaded NCCL library's version (`ncclGetVersion`), or [`Error::Unavailable`] without it.
pub fn version() -> Result<NcclVersion> {
    require(CudaLib::Nccl)?;
    result::get_nccl_version().map(NcclVersion).map_err(|e| nccl_err("ncclGetVersion", e))
}

/// A fresh NCCL unique id (call on one rank, then ship it to the others).
pub fn unique_id() -> Result<NcclId> {
    require(CudaLib::Nccl)?;
    let id = result::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e))?;
    Ok(id.internal.map(|c| c as u8))
}

/// A communicator handle, destroyed on drop (aborted instead once it failed).
struct Raw(sys::ncclComm_t);

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the handle came from ncclCommInitRank/ncclCommSplit and is dropped once.
        unsafe {
            let _ = result::comm_destroy(self.0);
        }
    }
}

struct State {
    world: Option<Raw>,
    groups: HashMap<Vec<usize>, Raw>,
    failed: Option<String>,
}

/// A [`Communicator`] over NCCL (see the [module docs](self)).
pub struct NcclComm {
    rank: usize,
    size: usize,
    device: Arc<CudaDevice>,
    stream: Arc<CudaStream>,
    timeout: Duration,
    version: NcclVersion,
    state: Mutex<State>,
    sequences: super::fingerprint::Sequences,
}

// SAFETY: NCCL communicators may be used from any thread as long as calls are not concurrent;
// every use goes through the `state` mutex.
unsafe impl Send for NcclComm {}
unsafe impl Sync for NcclComm {}

impl fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NcclComm(rank {} of {} on {:?})", self.rank, self.size, self.device)
    }
}

impl NcclComm {
    /// Joins the communicator identified by `id` as `rank` of `size` on `device`.
    /// Collective: every rank calls it with the same id.
    pub fn with_id(device: &Arc<CudaDevice>, rank: usize, size: usize, id: &NcclId) -> Result<NcclComm> {
        require(CudaLib::Nccl)?;
        if rank >= size {
            return Err(Error::RankOutOfRange { rank, world_size: size });
        }
        let timeout = crate::env::timeout()?;
        let version = version()?;
        device.context().bind_to_thread().map_err(|e| cuda_err("binding the CUDA context", e))?;
        let uid = sys::ncclUniqueId { internal: id.map(|b| b as std::ffi::c_char) };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; the id is shared by all ranks.
        unsafe { result::comm_init_rank(&mut comm, size as i32, uid, rank as i32) }
            .map_err(|e| nccl_err("ncclCommInitRank", e))?;
        Ok(Self::from_raw(device, rank, size, Raw(comm), timeout, version))
    }

    /// One communicator per device of `devices` (rank `i` on `devices[i]`), created together
    /// by `ncclCommInitAll` in this thread: the thread mode of [`Launch::Nccl`](crate::Launch::Nccl).
    pub fn init_all(devices: &[Arc<CudaDevice>]) -> Result<Vec<NcclComm>> {
        require(CudaLib::Nccl)?;
        let timeout = crate::env::timeout()?;
        let version = version()?;
        let n = devices.len();
        let ordinals: Vec<i32> = devices.iter().map(|d| d.ordinal() as i32).collect();
        let mut comms: Vec<sys::ncclComm_t> = vec![std::ptr::null_mut(); n];
        // SAFETY: `comms` has room for `n` handles, `ordinals` holds `n` device ordinals.
        unsafe { result::comm_init_all(comms.as_mut_ptr(), n as i32, ordinals.as_ptr()) }
            .map_err(|e| nccl_err("ncclCommInitAll", e))?;
        Ok(comms
            .into_iter()
            .enumerate()
            .map(|(r, c)| Self::from_raw(&devices[r], r, n, Raw(c), timeout, version))
            .collect())
    }

    fn from_raw(
        device: &Arc<CudaDevice>,
        rank: usize,
        size: usize,
        world: Raw,
        timeout: Duration,
        version: NcclVersion,
    ) -> NcclComm {
        NcclComm {
            rank,
            size,
            device: Arc::clone(device),
            // The rank's own stream: collectives on device buffers are ordered with its kernels.
            stream: Arc::clone(device.stream()),
            timeout,
            version,
            state: Mutex::new(State { world: Some(world), groups: HashMap::new(), failed: None }),
            sequences: Default::default(),
        }
    }

    /// Aborts every communicator of this rank (`ncclCommAbort`): called when the rank fails,
    /// so that NCCL releases its resources; later collectives fail with [`Error::Backend`].
    pub fn abort(&self, why: &str) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        Self::abort_all(&mut st, why);
    }

    fn abort_all(st: &mut State, why: &str) {
        st.failed.get_or_insert_with(|| why.to_string());
        // The handles are forgotten, not destroyed: ncclCommDestroy on an aborted handle is invalid.
        let all: Vec<Raw> = st.world.take().into_iter().chain(st.groups.drain().map(|(_, r)| r)).collect();
        for r in all {
            // SAFETY: a live handle, aborted once and never used again.
            unsafe {
                let _ = result::comm_abort(r.0);
            }
            std::mem::forget(r);
        }
    }

    /// A world of one rank on `device` (no bootstrap needed).
    pub fn single(device: &Arc<CudaDevice>) -> Result<NcclComm> {
        Self::with_id(device, 0, 1, &unique_id()?)
    }

    /// torchrun-style bootstrap from `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`: rank 0
    /// creates the id and sends it to every peer over TCP; peers retry connecting until
    /// `DTENSOR_TIMEOUT_MS`.
    pub fn from_env(device: &Arc<CudaDevice>) -> Result<NcclComm> {
        let rv = Rendezvous::from_env()?;
        let id = rv.share_from_rank0(crate::env::timeout()?, unique_id)?;
        Self::with_id(device, rv.rank, rv.world_size, &id)
    }

    /// Bootstrap over an MPI world: rank 0's id is broadcast (features `cuda` + `mpi`).
    #[cfg(feature = "mpi")]
    pub fn from_mpi(device: &Arc<CudaDevice>, mpi: &crate::comm::mpi::MpiComm) -> Result<NcclComm> {
        let world: Vec<usize> = (0..mpi.world_size()).collect();
        let mut id: NcclId = if mpi.rank() == 0 { unique_id()? } else { [0; 128] };
        mpi.broadcast(&world, (&mut id).into(), 0)?;
        Self::with_id(device, mpi.rank(), mpi.world_size(), &id)
    }

    /// The device this rank's collectives run on.
    pub fn cuda(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    fn my_index(&self, op: &str, group: &[usize]) -> Result<usize> {
        group::member(op, self.rank, self.size, group)
    }

    /// Runs `enqueue` with the group's NCCL communicator and this rank's index, then waits for
    /// the stream (bounded, aborting the communicator on error or timeout).
    fn run<R>(
        &self,
        op: &'static str,
        group: &[usize],
        enqueue: impl FnOnce(sys::ncclComm_t, usize) -> Result<R>,
    ) -> Result<R> {
        let me = self.my_index(op, group)?;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &st.failed {
            return Err(nccl_err(op, format!("the communicator was aborted earlier: {why}")));
        }
        let comm = if group::is_world(group, self.size) {
            st.world.as_ref().map(|r| r.0)
        } else {
            st.groups.get(group).map(|r| r.0)
        };
        let comm = comm.ok_or_else(|| Error::Unavailable {
            what: format!("an NCCL communicator for group {group:?}"),
            reason: "NCCL creates sub-communicators only collectively, in DeviceMesh::new (prepare_groups)".into(),
        })?;
        self.device.context().bind_to_thread().map_err(|e| cuda_err("binding the CUDA context", e))?;
        let out = enqueue(comm, me)?;
        if let Err(e) = self.wait(comm, op, group) {
            // A failed collective leaves every communicator of this rank in an unknown state:
            // abort them all (releases NCCL's resources and unblocks its kernels).
            Self::abort_all(&mut st, &e.to_string());
            return Err(e);
        }
        Ok(out)
    }

    fn wait(&self, comm: sys::ncclComm_t, op: &str, group: &[usize]) -> Result<()> {
        let ev = self.stream.record_event(None).map_err(|e| cuda_err("recording an event", e))?;
        // A timeout too long to add to now (Duration::MAX) means no limit.
        let deadline = super::timeout::deadline(self.timeout);
        loop {
            if ev.try_is_complete().map_err(|e| cuda_err("querying the stream", e))? {
                return Ok(());
            }
            let mut async_err = sys::ncclResult_t::ncclSuccess;
            // SAFETY: valid communicator and out-pointer.
            unsafe { sys::ncclCommGetAsyncError(comm, &mut async_err) };
            if async_err != sys::ncclResult_t::ncclSuccess {
                return Err(nccl_err(op, format!("asynchronous NCCL error {async_err:?} on group {group:?}")));
            }
            if super::timeout::passed(deadline) {
                return Err(Error::CollectiveTimeout {
                    op: op.into(),
                    group: group.to_vec(),
                    rank: self.rank,
                    timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>> {
        count(Work::HostToDevice(bytes.len()));
        self.stream.clone_htod(bytes).map_err(|e| cuda_err("staging host bytes on the device", e))
    }

    fn alloc(&self, len: usize) -> Result<CudaSlice<u8>> {
        self.stream.alloc_zeros::<u8>(len).map_err(|e| cuda_err("allocating a staging buffer", e))
    }

    fn download(&self, dev: &CudaSlice<u8>, out: &mut [u8]) -> Result<()> {
        count(Work::DeviceToHost(out.len()));
        self.stream.memcpy_dtoh(dev, out).map_err(|e| cuda_err("copying the result to the host", e))
    }

    /// The host divide of `Avg` where NCCL summed (no `ncclAvg`).
    fn finish(&self, dtype: DType, op: ReduceOp, buf: &mut [u8], n: usize) {
        if !self.version.has_avg() {
            reduce::finish(dtype, op, buf, n);
        }
    }

    /// The NCCL library version this communicator runs on.
    pub fn nccl_version(&self) -> NcclVersion {
        self.version
    }

    fn cu_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }
}

fn nccl_dtype(d: DType) -> sys::ncclDataType_t {
    match d {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
        DType::I32 => sys::ncclDataType_t::ncclInt32,
        DType::U8 => sys::ncclDataType_t::ncclUint8,
    }
}

/// The NCCL reduction of `op`: `Avg` is `ncclAvg` where the library has it, else a sum that
/// [`NcclComm::finish`] divides on the host.
fn nccl_op(op: ReduceOp, version: NcclVersion) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Avg if version.has_avg() => sys::ncclRedOp_t::ncclAvg,
        ReduceOp::Sum | ReduceOp::Avg => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Product => sys::ncclRedOp_t::ncclProd,
    }
}

const U8: sys::ncclDataType_t = sys::ncclDataType_t::ncclUint8;

// SAFETY: device results are written by NCCL into the whole receive buffer (lengths checked
// first); host results come back through host copies into initialised memory, so every
// `RecvBuf` is zero-filled first (`RecvBuf::zeroed`) and then overwritten.
unsafe impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.size
    }
    fn backend(&self) -> &'static str {
        "nccl"
    }
    fn device(&self) -> Device {
        Device::Cuda(self.device.ordinal())
    }
    fn cuda_device(&self) -> Option<Arc<CudaDevice>> {
        Some(Arc::clone(&self.device))
    }
    fn sequences(&self) -> Option<&super::fingerprint::Sequences> {
        Some(&self.sequences)
    }

    fn prepare_groups(&self, partitions: &[Vec<Vec<usize>>]) -> Result<()> {
        let splits = group::splits(partitions, self.rank, self.size)?;
        match self.version.group_strategy() {
            GroupStrategy::Split => self.split_groups(splits),
            GroupStrategy::InitRank => self.init_groups(splits),
        }
    }

    fn all_gather(&self, group: &[usize], send: Buf<'_>, mut recv: BufMut<'_>) -> Result<()> {
        let Some((s, r)) = self.on_device(&send, &mut recv) else {
            return staged::send_recv(send, recv, |s, r| self.host_all_gather(group, s, r));
        };
        check::blocks("all_gather", "recv", r.len(), group.len(), s.len())?;
        if s.is_empty() {
            return self.my_index("all_gather", group).map(|_| ());
        }
        self.run("all_gather", group, |comm, _| {
            let (sp, _g1) = s.view.device_ptr(&self.stream);
            let (rp, _g2) = r.view.device_ptr_mut(&self.stream);
            // SAFETY: device buffers of s.len() and n * s.len() bytes (checked above).
            unsafe { result::all_gather(sp as *const c_void, rp as *mut c_void, s.len(), U8, comm, self.cu_stream()) }
                .map(|_| ())
                .map_err(|e| nccl_err("ncclAllGather", e))
        })
    }

    fn all_reduce(&self, group: &[usize], mut buf: BufInOut<'_>, dtype: DType, op: ReduceOp) -> Result<()> {
        let direct = self.reduces_on_device(dtype, op);
        let Some(b) = in_out_on(&self.device, &mut buf).filter(|_| direct) else {
            return staged::in_place(buf, |h| self.host_all_reduce(group, h, dtype, op));
        };
        reduce::check_op(dtype, op)?;
        let Some(count) = self.reduce_count(Reduce::All, group, b.len(), b.len(), dtype)? else { return Ok(()) };
        self.run("all_reduce", group, |comm, _| {
            let (p, _g) = b.view.device_ptr_mut(&self.stream);
            // SAFETY: in-place reduction over `count` elements of `dtype` (checked above).
            unsafe { self.enqueue_reduce(Reduce::All, comm, p, p, count, dtype, op) }
        })
    }

    fn all_reduce_into(
        &self,
        group: &[usize],
        send: Buf<'_>,
        recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce_buf(Reduce::All, group, send, recv, dtype, op)
    }

    fn reduce_scatter(
        &self,
        group: &[usize],
        send: Buf<'_>,
        recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce_buf(Reduce::Scatter, group, send, recv, dtype, op)
    }

    fn all_to_all(&self, group: &[usize], send: Buf<'_>, mut recv: BufMut<'_>) -> Result<()> {
        let Some((s, r)) = self.on_device(&send, &mut recv) else {
            return staged::send_recv(send, recv, |s, r| self.host_all_to_all(group, s, r));
        };
        let n = group.len();
        check::all_to_all(s.len(), r.len(), n)?;
        if s.is_empty() {
            return self.my_index("all_to_all", group).map(|_| ());
        }
        let l = s.len() / n;
        self.run("all_to_all", group, |comm, _| {
            let (sp, _g1) = s.view.device_ptr(&self.stream);
            let (rp, _g2) = r.view.device_ptr_mut(&self.stream);
            self.grouped_exchange(comm, sp, rp, n, l)
        })
    }

    fn broadcast(&self, group: &[usize], mut buf: BufInOut<'_>, root: usize) -> Result<()> {
        let Some(b) = in_out_on(&self.device, &mut buf) else {
            return staged::in_place(buf, |h| self.host_broadcast(group, h, root));
        };
        check::root(root, group.len())?;
        if b.is_empty() {
            return self.my_index("broadcast", group).map(|_| ());
        }
        let len = b.len();
        self.run("broadcast", group, |comm, _| {
            let (p, _g) = b.view.device_ptr_mut(&self.stream);
            // SAFETY: in-place broadcast of `len` bytes.
            unsafe {
                result::broadcast(p as *const c_void, p as *mut c_void, len, U8, root as i32, comm, self.cu_stream())
            }
            .map(|_| ())
            .map_err(|e| nccl_err("ncclBroadcast", e))
        })
    }

    fn scatter(&self, group: &[usize], send: Buf<'_>, recv: BufMut<'_>, root: usize) -> Result<()> {
        staged::send_recv_init(send, recv, |s, r| self.host_scatter(group, s, r, root))
    }

    fn barrier(&self, group: &[usize]) -> Result<()> {
        let mut one = 1f32.to_ne_bytes();
        self.host_all_reduce(group, &mut one, DType::F32, ReduceOp::Sum)
    }
}

/// The collectives on host bytes, staged through device buffers (copy in, run, wait, copy
/// out): what host buffers, and device buffers NCCL alone cannot reduce as PyTorch does, run.
impl NcclComm {
    fn host_all_gather(&self, group: &[usize], send: &[u8], mut recv: RecvBuf<'_>) -> Result<()> {
        let recv = recv.zeroed();
        check::blocks("all_gather", "recv", recv.len(), group.len(), send.len())?;
        if send.is_empty() {
            return self.my_index("all_gather", group).map(|_| ());
        }
        let s = self.upload(send)?;
        let mut r = self.alloc(recv.len())?;
        self.run("all_gather", group, |comm, _| {
            let (sp, _g1) = s.device_ptr(&self.stream);
            let (rp, _g2) = r.device_ptr_mut(&self.stream);
            // SAFETY: device buffers sized send.len() and n * send.len().
            unsafe {
                result::all_gather(sp as *const c_void, rp as *mut c_void, send.len(), U8, comm, self.cu_stream())
            }
            .map(|_| ())
            .map_err(|e| nccl_err("ncclAllGather", e))
        })?;
        self.download(&r, recv)
    }

    fn host_all_reduce(&self, group: &[usize], buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        reduce::check_op(dtype, op)?;
        // As PyTorch, a NaN operand wins max/min: reduce a NaN mask alongside.
        let mask = reduce::drops_nan(dtype, op).then(|| reduce::nan_mask(dtype, buf));
        self.all_reduce_native(group, buf, dtype, op)?;
        if let Some(mut m) = mask {
            self.all_reduce_native(group, &mut m, dtype, ReduceOp::Max)?;
            reduce::apply_nan_mask(dtype, buf, &m);
        }
        Ok(())
    }

    /// Out of place: `send` copied into `recv`, then reduced there in place.
    fn host_all_reduce_into(
        &self,
        group: &[usize],
        send: &[u8],
        mut recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        check::same_len("all_reduce", send.len(), recv.len())?;
        self.host_all_reduce(group, recv.init_from(send), dtype, op)
    }

    fn host_reduce_scatter(
        &self,
        group: &[usize],
        send: &[u8],
        mut recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let recv = recv.zeroed();
        reduce::check_op(dtype, op)?;
        let mask = reduce::drops_nan(dtype, op).then(|| reduce::nan_mask(dtype, send));
        self.reduce_scatter_native(group, send, recv, dtype, op)?;
        if let Some(m) = mask {
            let mut r = vec![0u8; recv.len()];
            self.reduce_scatter_native(group, &m, &mut r, dtype, ReduceOp::Max)?;
            reduce::apply_nan_mask(dtype, recv, &r);
        }
        Ok(())
    }

    fn host_all_to_all(&self, group: &[usize], send: &[u8], mut recv: RecvBuf<'_>) -> Result<()> {
        let recv = recv.zeroed();
        let n = group.len();
        check::all_to_all(send.len(), recv.len(), n)?;
        if send.is_empty() {
            return self.my_index("all_to_all", group).map(|_| ());
        }
        let l = send.len() / n;
        let s = self.upload(send)?;
        let mut r = self.alloc(recv.len())?;
        self.run("all_to_all", group, |comm, _| {
            let (sp, _g1) = s.device_ptr(&self.stream);
            let (rp, _g2) = r.device_ptr_mut(&self.stream);
            self.grouped_exchange(comm, sp, rp, n, l)
        })?;
        self.download(&r, recv)
    }

    fn host_broadcast(&self, group: &[usize], buf: &mut [u8], root: usize) -> Result<()> {
        check::root(root, group.len())?;
        if buf.is_empty() {
            return self.my_index("broadcast", group).map(|_| ());
        }
        let mut d = self.upload(buf)?;
        self.run("broadcast", group, |comm, _| {
            let (p, _g) = d.device_ptr_mut(&self.stream);
            // SAFETY: in-place broadcast of buf.len() bytes.
            unsafe {
                result::broadcast(
                    p as *const c_void,
                    p as *mut c_void,
                    buf.len(),
                    U8,
                    root as i32,
                    comm,
                    self.cu_stream(),
                )
            }
            .map(|_| ())
            .map_err(|e| nccl_err("ncclBroadcast", e))
        })?;
        self.download(&d, buf)
    }

    fn host_scatter(&self, group: &[usize], send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        let n = group.len();
        check::root(root, n)?;
        let me = self.my_index("scatter", group)?;
        let l = recv.len();
        if me == root {
            check::blocks("scatter", "root send", send.len(), n, l)?;
        }
        if l == 0 {
            return Ok(());
        }
        let s = if me == root { self.upload(send)? } else { self.alloc(1)? };
        let mut r = self.alloc(l)?;
        self.run("scatter", group, |comm, me| {
            let (sp, _g1) = s.device_ptr(&self.stream);
            let (rp, _g2) = r.device_ptr_mut(&self.stream);
            result::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
            let mut res = Ok(());
            if me == root {
                for j in (0..n).filter(|&j| j != root) {
                    // SAFETY: block j of the root's buffer.
                    let r = unsafe {
                        result::send((sp + (j * l) as u64) as *const c_void, l, U8, j as i32, comm, self.cu_stream())
                    };
                    if let Err(e) = r {
                        res = Err(nccl_err("ncclSend", e));
                        break;
                    }
                }
            } else {
                // SAFETY: recv buffer of l bytes.
                let r = unsafe { result::recv(rp as *mut c_void, l, U8, root as i32, comm, self.cu_stream()) };
                res = r.map(|_| ()).map_err(|e| nccl_err("ncclRecv", e));
            }
            let end = result::group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
            res.and(end.map(|_| ()))
        })?;
        if me == root {
            recv.copy_from_slice(&send[root * l..(root + 1) * l]);
            Ok(())
        } else {
            self.download(&r, recv)
        }
    }
}

impl NcclComm {
    /// Both buffers on this rank's device (same handle, so the same stream orders them), or
    /// `None`: then the collective is staged through the host.
    fn on_device<'s, 'a, 'b>(
        &self,
        send: &'s Buf<'a>,
        recv: &'s mut BufMut<'b>,
    ) -> Option<(&'s CudaBytes<'a>, &'s mut CudaBytesMut<'b>)> {
        super::buf::both_on(&self.device, send, recv)
    }

    /// Whether NCCL alone computes `op` as PyTorch does: not max/min of floats (NaN operands,
    /// handled by a host mask), not `Avg` without `ncclAvg` (a host divide).
    fn reduces_on_device(&self, dtype: DType, op: ReduceOp) -> bool {
        !reduce::drops_nan(dtype, op) && (op != ReduceOp::Avg || self.version.has_avg())
    }

    /// The checks of a `kind` reduction of `send` bytes into `recv` bytes (equal lengths for an
    /// all-reduce, `group.len()` blocks of `recv` for a reduce-scatter) and its output element
    /// count; `None` when no byte moves (after checking this rank is a member).
    fn reduce_count(
        &self,
        kind: Reduce,
        group: &[usize],
        send: usize,
        recv: usize,
        dtype: DType,
    ) -> Result<Option<usize>> {
        let name = kind.op();
        match kind {
            Reduce::All => check::same_len(name, send, recv)?,
            Reduce::Scatter => check::blocks(name, "send", send, group.len(), recv)?,
        }
        check::whole(name, recv, dtype)?;
        if recv == 0 {
            return self.my_index(name, group).map(|_| None);
        }
        Ok(Some(recv / dtype.size_of()))
    }

    /// `all_reduce_into` / `reduce_scatter`: on the device buffers directly when NCCL alone
    /// computes `op` as PyTorch does, else staged through the host collective.
    fn reduce_buf(
        &self,
        kind: Reduce,
        group: &[usize],
        send: Buf<'_>,
        mut recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let direct = self.reduces_on_device(dtype, op);
        let Some((s, r)) = self.on_device(&send, &mut recv).filter(|_| direct) else {
            return match kind {
                Reduce::All => staged::send_recv(send, recv, |s, r| self.host_all_reduce_into(group, s, r, dtype, op)),
                Reduce::Scatter => {
                    staged::send_recv(send, recv, |s, r| self.host_reduce_scatter(group, s, r, dtype, op))
                }
            };
        };
        reduce::check_op(dtype, op)?;
        let Some(count) = self.reduce_count(kind, group, s.len(), r.len(), dtype)? else { return Ok(()) };
        self.run(kind.op(), group, |comm, _| {
            let (sp, _g1) = s.view.device_ptr(&self.stream);
            let (rp, _g2) = r.view.device_ptr_mut(&self.stream);
            // SAFETY: recv holds `count` elements, send `count` or n * count (checked above).
            unsafe { self.enqueue_reduce(kind, comm, sp, rp, count, dtype, op) }
        })
    }

    /// Enqueues `ncclAllReduce` or `ncclReduceScatter` of `count` output elements of `dtype`
    /// from `sp` into `rp` (which may be `sp` for an all-reduce) on this rank's stream.
    ///
    /// # Safety
    /// `rp` holds `count` elements and `sp` `count` (all-reduce) or `n * count` (reduce-scatter
    /// over `n` members), in device memory that stays alive until the stream has passed.
    #[allow(clippy::too_many_arguments)]
    unsafe fn enqueue_reduce(
        &self,
        kind: Reduce,
        comm: sys::ncclComm_t,
        sp: u64,
        rp: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let (s, r, t, o, st) =
            (sp as *const c_void, rp as *mut c_void, nccl_dtype(dtype), nccl_op(op, self.version), self.cu_stream());
        // SAFETY: the caller's contract.
        let res = unsafe {
            match kind {
                Reduce::All => result::all_reduce(s, r, count, t, o, comm, st),
                Reduce::Scatter => result::reduce_scatter(s, r, count, t, o, comm, st),
            }
        };
        let name = match kind {
            Reduce::All => "ncclAllReduce",
            Reduce::Scatter => "ncclReduceScatter",
        };
        res.map(|_| ()).map_err(|e| nccl_err(name, e))
    }

    /// Grouped `ncclSend`/`ncclRecv` of block `j` (`l` bytes) of `sp` to member `j` and from
    /// member `j` into block `j` of `rp`: NCCL's all-to-all.
    fn grouped_exchange(&self, comm: sys::ncclComm_t, sp: u64, rp: u64, n: usize, l: usize) -> Result<()> {
        result::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let mut res = Ok(());
        for j in 0..n {
            let off = (j * l) as u64;
            // SAFETY: block j of both buffers is l bytes inside their allocations (checked by callers).
            let r1 = unsafe { result::send((sp + off) as *const c_void, l, U8, j as i32, comm, self.cu_stream()) };
            let r2 = unsafe { result::recv((rp + off) as *mut c_void, l, U8, j as i32, comm, self.cu_stream()) };
            if let Err(e) = r1.and(r2) {
                res = Err(nccl_err("ncclSend/ncclRecv", e));
                break;
            }
        }
        let end = result::group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
        res.and(end.map(|_| ()))
    }

    /// One sub-communicator per split with `ncclCommSplit` (NCCL ≥ 2.18; the version was
    /// checked, so cudarc finds the symbol).
    fn split_groups(&self, splits: Vec<group::Split>) -> Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let world = st.world.as_ref().map(|r| r.0).ok_or_else(|| nccl_err("prepare_groups", "communicator aborted"))?;
        for group::Split { colour, key, group } in splits {
            let mut sub: sys::ncclComm_t = std::ptr::null_mut();
            // SAFETY: collective over the world communicator, called by every rank in order.
            // (cudarc 0.19's `result::comm_split` is compiled only for cuda-1202x..1205x, the
            // binding itself exists for every version.)
            unsafe { sys::ncclCommSplit(world, colour as i32, key as i32, &mut sub, std::ptr::null_mut()).result() }
                .map_err(|e| nccl_err("ncclCommSplit", e))?;
            // The split is collective over the world, so it runs even for a group this rank
            // already has (another group of the partition may be new).
            st.groups.entry(group).or_insert(Raw(sub));
        }
        Ok(())
    }

    /// One sub-communicator per split with `ncclCommInitRank` (NCCL < 2.18): the first member
    /// of each group makes its unique id, one all-gather of ids over the world communicator
    /// per partition hands every rank its group's id, then the members initialise together.
    fn init_groups(&self, splits: Vec<group::Split>) -> Result<()> {
        let world: Vec<usize> = (0..self.size).collect();
        for group::Split { key, group, .. } in splits {
            let mine: NcclId = if key == 0 { unique_id()? } else { [0; 128] };
            let mut ids = vec![0u8; 128 * self.size];
            self.host_all_gather(&world, &mine, (&mut ids).into())?;
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.groups.contains_key(&group) {
                continue; // the initialisation involves only the members, who all have it
            }
            let leader = group[0] * 128;
            let uid = sys::ncclUniqueId { internal: std::array::from_fn(|i| ids[leader + i] as std::ffi::c_char) };
            let mut sub: sys::ncclComm_t = std::ptr::null_mut();
            // SAFETY: `sub` is a valid out-pointer; every member passes the leader's id.
            unsafe { result::comm_init_rank(&mut sub, group.len() as i32, uid, key as i32) }
                .map_err(|e| nccl_err("ncclCommInitRank (sub-communicator)", e))?;
            st.groups.insert(group, Raw(sub));
        }
        Ok(())
    }

    /// `ncclAllReduce` staged through the device (its max/min may drop NaN operands).
    fn all_reduce_native(&self, group: &[usize], buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        let Some(count) = self.reduce_count(Reduce::All, group, buf.len(), buf.len(), dtype)? else { return Ok(()) };
        let mut d = self.upload(buf)?;
        self.run("all_reduce", group, |comm, _| {
            let (p, _g) = d.device_ptr_mut(&self.stream);
            // SAFETY: in-place reduction over `count` elements of `dtype`.
            unsafe { self.enqueue_reduce(Reduce::All, comm, p, p, count, dtype, op) }
        })?;
        self.download(&d, buf)?;
        self.finish(dtype, op, buf, group.len());
        Ok(())
    }

    /// `ncclReduceScatter` staged through the device (its max/min may drop NaN operands).
    fn reduce_scatter_native(
        &self,
        group: &[usize],
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let Some(count) = self.reduce_count(Reduce::Scatter, group, send.len(), recv.len(), dtype)? else {
            return Ok(());
        };
        let s = self.upload(send)?;
        let mut r = self.alloc(recv.len())?;
        self.run("reduce_scatter", group, |comm, _| {
            let (sp, _g1) = s.device_ptr(&self.stream);
            let (rp, _g2) = r.device_ptr_mut(&self.stream);
            // SAFETY: send holds n * count elements, recv count.
            unsafe { self.enqueue_reduce(Reduce::Scatter, comm, sp, rp, count, dtype, op) }
        })?;
        self.download(&r, recv)?;
        self.finish(dtype, op, recv, group.len());
        Ok(())
    }
}
