//! MPI backend (cargo feature `mpi`): one process per rank, started by `mpirun`.
//!
//! * The world is `MPI_COMM_WORLD`: rank and size come from `mpirun -np N`.
//! * A group (list of global ranks, in group order) maps to one MPI communicator whose rank
//!   `i` is `group[i]`. [`DeviceMesh::new`](crate::DeviceMesh::new) calls
//!   [`prepare_groups`](Communicator::prepare_groups) collectively with the groups of every
//!   mesh dim: each partition becomes one `MPI_Comm_split` (color = index of this rank's
//!   group, key = position in it). A group that was never prepared (e.g. the flattened group
//!   of a sub-mesh with reordered dims) is created on first use with `MPI_Comm_create_group`,
//!   which only the members of that group take part in — they all call the same collective.
//!   The whole world in rank order is `MPI_COMM_WORLD` itself.
//! * Collectives map one to one (`MPI_Allgather`, `MPI_Allreduce`, `MPI_Reduce_scatter_block`,
//!   `MPI_Alltoall`, `MPI_Bcast`, `MPI_Scatter`; uneven ones `MPI_Allgatherv`,
//!   `MPI_Alltoallv`, a padded reduce-scatter); `Avg` is a sum divided by the group size
//!   afterwards.
//! * Before any data moves, the members agree on the call: one small `MPI_Allreduce` of what
//!   each member was called with (collective, bytes, element type, reduction, root; the
//!   variable-size ones then compare every count), since MPI itself compares none of it and
//!   disagreeing members would read or write past each other's buffers or return different
//!   data. A disagreement, or a member whose own arguments are bad, is a typed error on every
//!   member (see `MpiComm::agree`). A barrier is that all-reduce alone.
//!
//! # Failures never hang
//! MPI's default error handler (`MPI_ERRORS_ARE_FATAL`) aborts the whole job on any MPI error
//! (truncated message, mismatched sizes, dead peer). On top of that:
//! * [`Launch::Mpi`](crate::Launch::Mpi) calls `MPI_Abort` when this rank's closure returns an error or panics (with
//!   more than one rank): `mpirun` then kills every process, so no peer waits forever in a
//!   collective this rank will never enter;
//! * a process that dies makes `mpirun` terminate the job;
//! * a watchdog thread aborts the job when one collective waits longer than
//!   `DTENSOR_TIMEOUT_MS` (default [`DEFAULT_TIMEOUT`](crate::env::DEFAULT_TIMEOUT)): the
//!   peer is alive but never calls it (e.g. ranks called collectives in a different order).
//!
//! # Process lifetime
//! MPI is initialised once per process (the first [`MpiComm::world`]), with
//! `MPI_THREAD_MULTIPLE` requested; `MPI_Finalize` runs at process exit (an `atexit` hook), so
//! one process may launch several programs in turn. Every call into MPI from this module is
//! serialised by one lock, so the communicator is safe to share between threads.

use super::pending::Completion;
use super::variable::{self, offsets};
use super::{check, group, reduce};
use super::{HostCollectives, OwnedBytes, PendingAllReduce, RecvBuf};
use crate::element::DType;
use crate::error::{Error, Result};
use crate::placement::ReduceOp;
use mpi::collective::SystemOperation;
use mpi::datatype::{Equivalence, Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::raw::AsRaw;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{Communicator as _, CommunicatorCollectives, Group as _, Root};
use mpi::Threading;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

fn backend_err(message: impl Into<String>) -> Error {
    Error::Backend { backend: "mpi".into(), message: message.into() }
}

// ------------------------------------------------------------------ process-wide state

/// The MPI universe owned by this crate (dropping it calls `MPI_Finalize`).
static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);
/// Outcome of the one-time initialisation: the granted threading level, or why MPI is unusable.
static INIT: OnceLock<std::result::Result<Threading, String>> = OnceLock::new();
/// The collective this process is blocked in, watched by the watchdog thread.
static IN_FLIGHT: Mutex<Option<InFlight>> = Mutex::new(None);

struct InFlight {
    op: &'static str,
    group: Vec<usize>,
    rank: usize,
    since: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // State behind these locks is a few plain values that stay consistent on panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

extern "C" fn finalize_at_exit() {
    // Drop the universe (MPI_Finalize) if we own it; nothing else may touch MPI afterwards.
    let u = lock(&UNIVERSE).take();
    drop(u);
}

unsafe extern "C" {
    fn atexit(cb: extern "C" fn()) -> std::ffi::c_int;
}

/// Initialises MPI once per process (idempotent). Called by [`MpiComm::world`].
///
/// Errors with [`Error::Unavailable`] when MPI was already finalised, and with
/// [`Error::Backend`] when the library grants less than `MPI_THREAD_SERIALIZED`, and with
/// [`Error::InvalidArgument`] when `DTENSOR_TIMEOUT_MS` is malformed or 0.
pub fn init() -> Result<()> {
    let t = crate::env::timeout()?;
    let r = INIT.get_or_init(|| {
        if mpi::environment::is_finalized() {
            return Err("MPI was already finalised in this process".into());
        }
        let level = match mpi::initialize_with_threading(Threading::Multiple) {
            Some((universe, level)) => {
                *lock(&UNIVERSE) = Some(universe);
                // SAFETY: registering a plain extern "C" fn; it runs once at exit.
                unsafe { atexit(finalize_at_exit) };
                level
            }
            // Someone else initialised MPI: use it, they finalise it.
            None => mpi::environment::threading_support(),
        };
        if level < Threading::Serialized {
            return Err(format!("MPI grants thread level {level:?}; dtensor needs at least Serialized"));
        }
        std::thread::Builder::new()
            .name("dtensor-mpi-watchdog".into())
            .spawn(move || watchdog(t))
            .map_err(|e| format!("cannot start the MPI watchdog thread: {e}"))?;
        Ok(level)
    });
    match r {
        Ok(_) => Ok(()),
        Err(reason) => Err(Error::Unavailable { what: "MPI".into(), reason: reason.clone() }),
    }
}

fn watchdog(timeout: Duration) {
    loop {
        std::thread::sleep(Duration::from_millis(100).min(timeout));
        let stuck = lock(&IN_FLIGHT).as_ref().filter(|f| f.since.elapsed() > timeout).map(|f| {
            format!(
                "dtensor[mpi]: rank {}: collective `{}` on group {:?} waited more than {} ms \
                 (DTENSOR_TIMEOUT_MS); aborting the MPI job",
                f.rank,
                f.op,
                f.group,
                timeout.as_millis()
            )
        });
        if let Some(msg) = stuck {
            eprintln!("{msg}");
            SimpleCommunicator::world().abort(3);
        }
    }
}

// ------------------------------------------------------------------------ communicator

/// A [`Communicator`] over MPI (see the [module docs](self)).
pub struct MpiComm {
    rank: usize,
    size: usize,
    /// Sub-communicators by group; the lock also serialises every MPI call of this process
    /// (shared with the started all-reduces, whose waits are MPI calls too).
    groups: Arc<SharedGroups>,
    sequences: super::fingerprint::Sequences,
}

#[derive(Default)]
struct Groups {
    comms: HashMap<Vec<usize>, SimpleCommunicator>,
    closed: bool,
}

/// The sub-communicators behind the process lock, shared by the communicator and the
/// all-reduces it started (whose `MPI_Wait` takes the same lock).
struct SharedGroups(Mutex<Groups>);

// SAFETY: as for `MpiComm` below: MPI handles are plain identifiers, used only under the lock.
unsafe impl Send for SharedGroups {}
unsafe impl Sync for SharedGroups {}

// SAFETY: MPI handles are plain identifiers; MPI is initialised with at least
// MPI_THREAD_SERIALIZED and every use of the handles goes through the `groups` mutex.
unsafe impl Send for MpiComm {}
unsafe impl Sync for MpiComm {}

impl fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MpiComm(rank {} of {})", self.rank, self.size)
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        let g = std::mem::take(&mut *lock(&self.groups.0));
        if mpi::environment::is_finalized() {
            // Freeing a communicator after MPI_Finalize is an MPI error: leak instead.
            std::mem::forget(g);
        }
    }
}

impl MpiComm {
    /// The communicator of `MPI_COMM_WORLD` (initialises MPI on first use).
    pub fn world() -> Result<Arc<MpiComm>> {
        init()?;
        let w = SimpleCommunicator::world();
        Ok(Arc::new(MpiComm {
            rank: w.rank() as usize,
            size: w.size() as usize,
            groups: Arc::new(SharedGroups(Mutex::new(Groups::default()))),
            sequences: Default::default(),
        }))
    }

    /// Frees the sub-communicators; later collectives fail with [`Error::Backend`].
    pub fn close(&self) {
        let mut g = lock(&self.groups.0);
        g.comms.clear();
        g.closed = true;
    }

    /// Aborts the whole MPI job (every process) with `code`.
    pub fn abort(&self, code: i32) -> ! {
        SimpleCommunicator::world().abort(code)
    }

    fn my_index(&self, op: &str, group: &[usize]) -> Result<usize> {
        group::member(op, self.rank, self.size, group)
    }

    /// Whether a collective whose every member moves `bytes` (the same on every member: the
    /// members agreed on their sizes first, see [`agree`](Self::agree)) has nothing to do:
    /// then no member calls MPI, whose libraries reject zero-length calls with aliased buffers
    /// (two empty `Vec`s share a dangling address: `MPI_ERR_ARG`, which aborts the job). Still
    /// an error when this rank is not in `group`.
    fn nothing_to_move(&self, op: &str, group: &[usize], bytes: usize) -> Result<bool> {
        self.my_index(op, group)?;
        Ok(bytes == 0)
    }

    /// Runs `body` on the MPI communicator of `group` with this rank's index in it, under
    /// the process lock and the watchdog.
    fn with_group<R>(
        &self,
        op: &'static str,
        group: &[usize],
        bytes: &[usize],
        body: impl FnOnce(&SimpleCommunicator, usize) -> R,
    ) -> Result<R> {
        let me = self.my_index(op, group)?;
        if let Some(&b) = bytes.iter().find(|&&b| b > i32::MAX as usize) {
            return Err(Error::BufferMismatch {
                op: op.into(),
                reason: format!("{b} bytes exceed MPI's count limit of {} per call", i32::MAX),
            });
        }
        let mut g = lock(&self.groups.0);
        if g.closed {
            return Err(backend_err(format!("`{op}` on a communicator whose launch already returned")));
        }
        *lock(&IN_FLIGHT) = Some(InFlight { op, group: group.to_vec(), rank: self.rank, since: Instant::now() });
        let world = SimpleCommunicator::world();
        let out = if group::is_world(group, self.size) {
            Ok(body(&world, me))
        } else {
            if !g.comms.contains_key(group) {
                let ranks: Vec<i32> = group.iter().map(|&r| r as i32).collect();
                let sub = world.group().include(&ranks);
                match world.split_by_subgroup_with_tag(&sub, GROUP_TAG) {
                    Some(c) => {
                        g.comms.insert(group.to_vec(), c);
                    }
                    None => {
                        *lock(&IN_FLIGHT) = None;
                        return Err(backend_err(format!(
                            "MPI_Comm_create_group for {group:?} returned no communicator"
                        )));
                    }
                }
            }
            Ok(body(&g.comms[group], me))
        };
        *lock(&IN_FLIGHT) = None;
        out
    }
}

/// Tag of `MPI_Comm_create_group` calls (they are serialised, so one tag suffices).
const GROUP_TAG: i32 = 0x6474;

fn mpi_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => SystemOperation::sum(),
        ReduceOp::Min => SystemOperation::min(),
        ReduceOp::Max => SystemOperation::max(),
        ReduceOp::Product => SystemOperation::product(),
    }
}

/// Byte counts (or displacements) as MPI's C ints; callers bound them first (`with_group`
/// refuses totals past `i32::MAX`).
fn ints(v: &[usize]) -> Vec<mpi::Count> {
    v.iter().map(|&x| x.min(i32::MAX as usize) as mpi::Count).collect()
}

/// Typed copy of a byte buffer (bytes from callers need not be aligned for `T`).
fn typed<T: bytemuck::Pod>(b: &[u8]) -> Vec<T> {
    bytemuck::pod_collect_to_vec(b)
}

/// A copy of `b` in 8-byte-aligned memory (aligned for every dtype MPI reduces here).
fn aligned_copy(b: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; b.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..b.len()].copy_from_slice(b);
    v
}

/// All-reduce of `buf` (whole elements of `datatype`, `size` bytes each) in place, through one
/// aligned copy of the input and no zero-filled output (`MPI_IN_PLACE` is not among the
/// constants the bindings export); an output that is not aligned for the dtype (bytes from a
/// caller need not be) goes through an aligned one.
fn all_reduce_raw(c: &SimpleCommunicator, buf: &mut [u8], datatype: mpi::ffi::MPI_Datatype, size: usize, op: ReduceOp) {
    let send = aligned_copy(buf);
    let mut bounce = (!(buf.as_ptr() as usize).is_multiple_of(size)).then(|| aligned_copy(buf));
    let recv: &mut [u8] = match &mut bounce {
        Some(b) => &mut bytemuck::cast_slice_mut::<u64, u8>(b)[..buf.len()],
        None => &mut *buf,
    };
    // SAFETY: both buffers hold `recv.len() / size` elements of `datatype` (the caller checked
    // whole elements), aligned for it, and live through the blocking call. MPI errors are
    // fatal (the default handler aborts the job), as for every rsmpi call here.
    unsafe {
        mpi::ffi::MPI_Allreduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            (recv.len() / size) as std::ffi::c_int,
            datatype,
            mpi_op(op).as_raw(),
            c.as_raw(),
        );
    }
    if let Some(b) = &bounce {
        buf.copy_from_slice(&bytemuck::cast_slice::<u64, u8>(b)[..buf.len()]);
    }
}

fn reduce_scatter_typed<T: bytemuck::Pod + Equivalence>(
    c: &SimpleCommunicator,
    send: &[u8],
    recv: &mut [u8],
    op: ReduceOp,
) {
    let send: Vec<T> = typed(send);
    let mut out = vec![T::zeroed(); recv.len() / std::mem::size_of::<T>()];
    c.reduce_scatter_block_into(&send[..], &mut out[..], mpi_op(op));
    recv.copy_from_slice(bytemuck::cast_slice(&out));
}

/// An `MPI_Iallreduce` in flight: it owns both buffers until MPI is done with them.
struct Started {
    request: mpi::ffi::MPI_Request,
    /// The input, aligned (MPI reads it until the request completes).
    send: Vec<u64>,
    /// The output, handed back by `wait`.
    recv: Option<Box<dyn OwnedBytes>>,
    dtype: DType,
    op: ReduceOp,
    group: Vec<usize>,
    rank: usize,
    groups: Arc<SharedGroups>,
}

// SAFETY: the request is a plain MPI handle, used only under the `groups` lock (as every MPI
// call of this module); the buffers are owned.
unsafe impl Send for Started {}

impl Started {
    /// Waits for the request (once), under the process lock and the watchdog.
    fn complete(&mut self) -> Result<()> {
        // SAFETY: reading a handle constant of the MPI library.
        let null = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
        if self.request == null {
            return Ok(());
        }
        if mpi::environment::is_finalized() {
            // Too late to wait (MPI_Finalize completed or abandoned the request): keep the
            // buffers alive for good rather than free memory MPI may still touch.
            std::mem::forget(std::mem::take(&mut self.send));
            std::mem::forget(self.recv.take());
            self.request = null;
            return Err(backend_err("an all-reduce was still in flight when MPI was finalised"));
        }
        let _serial = lock(&self.groups.0);
        *lock(&IN_FLIGHT) =
            Some(InFlight { op: "all_reduce", group: self.group.clone(), rank: self.rank, since: Instant::now() });
        // SAFETY: `request` came from MPI_Iallreduce and was not completed yet; MPI_Wait sets
        // it to MPI_REQUEST_NULL.
        let rc = unsafe { mpi::ffi::MPI_Wait(&mut self.request, mpi::ffi::RSMPI_STATUS_IGNORE) };
        *lock(&IN_FLIGHT) = None;
        if rc != 0 {
            // The request may still be live: keep the buffers for good, never wait again.
            std::mem::forget(std::mem::take(&mut self.send));
            std::mem::forget(self.recv.take());
            self.request = null;
            return Err(backend_err(format!("MPI_Wait of a started all-reduce returned {rc}")));
        }
        Ok(())
    }
}

impl Completion for Started {
    fn wait(mut self: Box<Self>) -> Result<Box<dyn OwnedBytes>> {
        self.complete()?;
        let mut recv = self.recv.take().ok_or_else(|| backend_err("a started all-reduce lost its buffer"))?;
        // Only host buffers are started (`all_reduce_start`), so this is the block MPI wrote.
        let bytes = recv.host_mut().ok_or_else(|| backend_err("a started all-reduce lost its host buffer"))?;
        reduce::finish(self.dtype, self.op, bytes, self.group.len());
        Ok(recv)
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        // A dropped handle still lets MPI finish with the buffers before they are freed.
        let _ = self.complete();
    }
}

/// A batch of `MPI_Iallgatherv`s in flight (a started [`Gather`](super::Gather) batch): it owns
/// every buffer and count array until MPI is done with them (MPI reads the counts and
/// displacements of a nonblocking collective until it completes).
struct StartedGathers {
    /// One per gather (`MPI_REQUEST_NULL` for one with nothing to move).
    requests: Vec<mpi::ffi::MPI_Request>,
    /// What MPI reads while the requests run.
    held: Vec<Held>,
    /// The receive buffers, handed back by `wait`.
    recvs: Option<Vec<Box<dyn OwnedBytes>>>,
    group: Vec<usize>,
    rank: usize,
    groups: Arc<SharedGroups>,
}

/// One started all-gather's send buffer, counts and displacements.
type Held = (Box<dyn OwnedBytes>, Vec<mpi::Count>, Vec<mpi::Count>);

// SAFETY: as `Started`: the requests are plain MPI handles, used only under the `groups`
// lock; the buffers are owned.
unsafe impl Send for StartedGathers {}

impl StartedGathers {
    /// Waits for every request (once), under the process lock and the watchdog.
    fn complete(&mut self) -> Result<()> {
        // SAFETY: reading a handle constant of the MPI library.
        let null = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
        if self.requests.iter().all(|r| *r == null) {
            return Ok(());
        }
        let keep_forever = |s: &mut Self| {
            std::mem::forget(std::mem::take(&mut s.held));
            std::mem::forget(s.recvs.take());
            s.requests.iter_mut().for_each(|r| *r = null);
        };
        if mpi::environment::is_finalized() {
            keep_forever(self);
            return Err(backend_err("an all-gather was still in flight when MPI was finalised"));
        }
        let groups = Arc::clone(&self.groups);
        let _serial = lock(&groups.0);
        *lock(&IN_FLIGHT) =
            Some(InFlight { op: "all_gather_v", group: self.group.clone(), rank: self.rank, since: Instant::now() });
        let mut rc = 0;
        for request in self.requests.iter_mut().filter(|r| **r != null) {
            // SAFETY: each request came from MPI_Iallgatherv and was not completed yet;
            // MPI_Wait sets it to MPI_REQUEST_NULL.
            rc = unsafe { mpi::ffi::MPI_Wait(request, mpi::ffi::RSMPI_STATUS_IGNORE) };
            if rc != 0 {
                break;
            }
        }
        *lock(&IN_FLIGHT) = None;
        if rc != 0 {
            // Requests may still be live: keep the buffers for good, never wait again.
            keep_forever(self);
            return Err(backend_err(format!("MPI_Wait of a started all-gather returned {rc}")));
        }
        self.held.clear(); // on the thread that waited (a lazily made copy is freed here)
        Ok(())
    }
}

impl Completion for StartedGathers {
    fn wait(mut self: Box<Self>) -> Result<Box<dyn OwnedBytes>> {
        self.complete()?;
        let recvs = self.recvs.take().ok_or_else(|| backend_err("a started all-gather lost its buffers"))?;
        Ok(Box::new(super::GatherBatch(recvs)))
    }
}

impl Drop for StartedGathers {
    fn drop(&mut self) {
        // A dropped handle still lets MPI finish with the buffers before they are freed.
        let _ = self.complete();
    }
}

/// The MPI datatype of a dtype MPI reduces natively (not the 16-bit floats).
fn mpi_datatype(dtype: DType) -> Option<mpi::ffi::MPI_Datatype> {
    Some(match dtype {
        DType::F32 => f32::equivalent_datatype().as_raw(),
        DType::F64 => f64::equivalent_datatype().as_raw(),
        DType::I64 => i64::equivalent_datatype().as_raw(),
        DType::I32 => i32::equivalent_datatype().as_raw(),
        DType::U8 => u8::equivalent_datatype().as_raw(),
        DType::BF16 | DType::F16 => return None,
    })
}

/// The collectives as the agreement header names them (its first word is the index plus one).
const KINDS: [&str; 11] = [
    "all_gather",
    "all_reduce",
    "reduce_scatter",
    "all_to_all",
    "all_to_all_strided",
    "all_gather_v",
    "reduce_scatter_v",
    "all_to_all_v",
    "broadcast",
    "scatter",
    "barrier",
];

/// Words of the agreement header: kind, bytes, dtype, reduce op, root, layout.
const HEADER: usize = 6;

fn kind_name(w: u64) -> &'static str {
    usize::try_from(w).ok().and_then(|w| w.checked_sub(1)).and_then(|i| KINDS.get(i)).copied().unwrap_or("?")
}

/// `bytes` fit MPI's per-call count (a C int).
fn within_count(op: &str, bytes: &[usize]) -> Result<()> {
    match bytes.iter().find(|&&b| b > i32::MAX as usize) {
        Some(b) => Err(check::mismatch(op, format!("{b} bytes exceed MPI's count limit of {} per call", i32::MAX))),
        None => Ok(()),
    }
}

impl MpiComm {
    /// The agreement every collective starts with, before any data moves: one
    /// `MPI_Allreduce(MAX)` of this member's header — collective, bytes, element type,
    /// reduction, root, layout — next to its bitwise complement (the maximum of `!w` is `!min w`,
    /// so each field's least and largest value over the group arrive together), and of the
    /// rank that rejected its own arguments. MPI itself compares none of this: members that
    /// passed buffers of different lengths, element types, reductions or roots would read or
    /// write past each other's data, or each return different results.
    ///
    /// `local` is this member's verdict on its own arguments: a member whose arguments are bad
    /// still takes part (its peers would otherwise wait for it in a collective it never
    /// enters) and returns its error; every other member returns one naming it. Any field on
    /// which the members disagree is a typed error on every member ([`Error::BufferMismatch`]
    /// for sizes, [`Error::CollectiveMismatch`] for the others), so the collective runs on all
    /// members or on none.
    ///
    /// It costs one small all-reduce per collective, measured on 2 ranks of one machine
    /// (tests/mpi_collectives.rs `agreement_cost`): an 8-byte all-reduce went from 1.1–1.8 to
    /// 2.2–2.3 µs, a 1 MiB one stayed at 1.1–1.4 ms; with 4 ranks on 2 cores (oversubscribed)
    /// 13 µs became 25–40 µs. A barrier is this agreement alone: an all-reduce returns nowhere
    /// before every member has contributed.
    fn agree(
        &self,
        op: &'static str,
        group: &[usize],
        bytes: usize,
        args: check::Args,
        layout: u64,
        local: Result<()>,
    ) -> Result<()> {
        let kind = KINDS.iter().position(|&k| k == op).map_or(u64::MAX, |i| i as u64 + 1);
        let [dtype, red, root] = args.words();
        let words = [kind, bytes as u64, dtype, red, root, layout];
        let mut send = [0u64; 2 * HEADER + 1];
        send[..HEADER].copy_from_slice(&words);
        for (k, w) in words.iter().enumerate() {
            send[HEADER + k] = !w;
        }
        send[2 * HEADER] = if local.is_err() { self.rank as u64 + 1 } else { 0 };
        let mut out = [0u64; 2 * HEADER + 1];
        self.with_group(op, group, &[], |c, _| c.all_reduce_into(&send[..], &mut out[..], SystemOperation::max()))?;
        local?;
        if let Some(r) = out[2 * HEADER].checked_sub(1) {
            return Err(check::mismatch(op, format!("rank {r} rejected its own arguments (see its error)")));
        }
        let Some(k) = (0..HEADER).find(|&k| out[k] != !out[HEADER + k]) else { return Ok(()) };
        let (lo, hi) = (!out[HEADER + k], out[k]);
        let disagree = |field: &str, detail: String| Error::CollectiveMismatch {
            rank: self.rank,
            group: group.to_vec(),
            field: field.into(),
            detail,
        };
        Err(match k {
            0 => disagree("kind", format!("the members called `{}` and `{}`", kind_name(lo), kind_name(hi))),
            1 => check::mismatch(op, format!("the members pass buffers of different sizes, from {lo} to {hi} bytes")),
            2..=4 => {
                let with = |w: u64| {
                    let mut a = [dtype, red, root];
                    a[k - 2] = w;
                    check::Args::from_words(a)
                };
                let (field, a, b) = with(lo).differ(with(hi)).unwrap_or(("arguments", lo.to_string(), hi.to_string()));
                disagree(field, format!("the members called `{op}` with {field} {a} and {b}"))
            }
            _ if op == "all_reduce" => disagree(
                "kind",
                "one member starts an MPI_Iallreduce (a started all-reduce) while another runs a blocking \
                 MPI_Allreduce (a blocking call, or a started one whose buffer is not aligned for its dtype)"
                    .into(),
            ),
            _ if op == "all_gather_v" => disagree(
                "kind",
                "the members start different batches of all-gathers (MPI_Iallgatherv), or one starts them while \
                 another runs a blocking MPI_Allgatherv"
                    .into(),
            ),
            _ => check::mismatch(
                op,
                format!("the members split their buffers differently (runs of {lo} and {hi} bytes)"),
            ),
        })
    }

    /// After [`agree`](Self::agree): the members of a variable-size collective agree on every
    /// count (one `MPI_Allreduce(MAX)` of the counts and their complements: exact, whatever
    /// the totals), so that counts that disagree are a typed error on every member, never
    /// wrong data.
    fn agree_counts(&self, op: &'static str, group: &[usize], counts: &[usize]) -> Result<()> {
        let n = counts.len();
        let send: Vec<u64> = counts.iter().map(|&c| c as u64).chain(counts.iter().map(|&c| !(c as u64))).collect();
        let mut out = vec![0u64; 2 * n];
        self.with_group(op, group, &[], |c, _| c.all_reduce_into(&send[..], &mut out[..], SystemOperation::max()))?;
        match (0..n).find(|&i| out[i] != !out[n + i]) {
            None => Ok(()),
            Some(i) => Err(check::mismatch(
                op,
                format!(
                    "the members pass different counts: counts[{i}] is {} on one and {} on another",
                    !out[n + i],
                    out[i]
                ),
            )),
        }
    }

    /// `MPI_Allgather` (arguments checked and agreed).
    fn raw_all_gather(&self, group: &[usize], send: &[u8], recv: &mut [u8]) -> Result<()> {
        if self.nothing_to_move("all_gather", group, recv.len())? {
            return Ok(());
        }
        self.with_group("all_gather", group, &[recv.len()], |c, _| c.all_gather_into(send, recv))
    }

    /// `MPI_Alltoall` (arguments checked and agreed).
    fn raw_all_to_all(&self, group: &[usize], send: &[u8], recv: &mut [u8]) -> Result<()> {
        if self.nothing_to_move("all_to_all", group, recv.len())? {
            return Ok(());
        }
        self.with_group("all_to_all", group, &[send.len()], |c, _| c.all_to_all_into(send, recv))
    }

    /// The all-reduce (arguments checked and agreed).
    fn raw_all_reduce(&self, group: &[usize], buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        if self.nothing_to_move("all_reduce", group, buf.len())? {
            return Ok(());
        }
        if dtype.is_half() {
            // MPI has no 16-bit float datatype: gather every member's buffer and fold it here,
            // in group order, so every member gets the same bits.
            let mut all = vec![0u8; buf.len() * group.len()];
            self.raw_all_gather(group, buf, &mut all)?;
            return reduce::fold_blocks(dtype, op, &all, buf);
        }
        // MPI_MAX/MPI_MIN drop NaN operands: reduce a NaN mask alongside (as PyTorch, a NaN wins).
        let mut mask = reduce::drops_nan(dtype, op).then(|| reduce::nan_mask(dtype, buf));
        let Some(datatype) = mpi_datatype(dtype) else { unreachable!("16-bit floats are reduced above") };
        self.with_group("all_reduce", group, &[buf.len()], |c, _| {
            all_reduce_raw(c, buf, datatype, dtype.size_of(), op);
            if let Some(m) = &mut mask {
                all_reduce_raw(c, m, datatype, dtype.size_of(), ReduceOp::Max);
            }
        })?;
        if let Some(m) = &mask {
            reduce::apply_nan_mask(dtype, buf, m);
        }
        reduce::finish(dtype, op, buf, group.len());
        Ok(())
    }

    /// The reduce-scatter (arguments checked and agreed).
    fn raw_reduce_scatter(
        &self,
        group: &[usize],
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        if self.nothing_to_move("reduce_scatter", group, recv.len())? {
            return Ok(());
        }
        if dtype.is_half() {
            // As in all_reduce, reduced locally: member i receives every member's block i.
            let mut mine = vec![0u8; send.len()];
            self.raw_all_to_all(group, send, &mut mine)?;
            return reduce::fold_blocks(dtype, op, &mine, recv);
        }
        // As in all_reduce: MPI_MAX/MPI_MIN drop NaN operands, a reduced mask restores them.
        let send_mask = reduce::drops_nan(dtype, op).then(|| reduce::nan_mask(dtype, send));
        let mut recv_mask = send_mask.as_ref().map(|_| vec![0u8; recv.len()]);
        self.with_group("reduce_scatter", group, &[send.len()], |c, _| {
            let reduce = |s: &[u8], r: &mut [u8], op| match dtype {
                DType::F32 => reduce_scatter_typed::<f32>(c, s, r, op),
                DType::F64 => reduce_scatter_typed::<f64>(c, s, r, op),
                DType::I64 => reduce_scatter_typed::<i64>(c, s, r, op),
                DType::I32 => reduce_scatter_typed::<i32>(c, s, r, op),
                DType::U8 => reduce_scatter_typed::<u8>(c, s, r, op),
                DType::BF16 | DType::F16 => unreachable!("16-bit floats are reduced above"),
            };
            reduce(send, recv, op);
            if let (Some(s), Some(r)) = (&send_mask, &mut recv_mask) {
                reduce(s, r, ReduceOp::Max);
            }
        })?;
        if let Some(m) = &recv_mask {
            reduce::apply_nan_mask(dtype, recv, m);
        }
        reduce::finish(dtype, op, recv, group.len());
        Ok(())
    }
}

// SAFETY: MPI writes into initialised memory only, so every `RecvBuf` is zero-filled first
// (`RecvBuf::zeroed`) and then overwritten by the collective.
unsafe impl HostCollectives for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.size
    }
    fn backend(&self) -> &'static str {
        "mpi"
    }
    fn sequences(&self) -> Option<&super::fingerprint::Sequences> {
        Some(&self.sequences)
    }

    fn prepare_groups(&self, partitions: &[Vec<Vec<usize>>]) -> Result<()> {
        let plan = group::splits(partitions, self.rank, self.size)?;
        let mut g = lock(&self.groups.0);
        if g.closed {
            return Err(backend_err("prepare_groups on a communicator whose launch already returned"));
        }
        let world = SimpleCommunicator::world();
        for group::Split { colour, key, group } in plan {
            *lock(&IN_FLIGHT) =
                Some(InFlight { op: "comm_split", group: group.clone(), rank: self.rank, since: Instant::now() });
            let c = world.split_by_color_with_key(Color::with_value(colour as i32), key as i32);
            *lock(&IN_FLIGHT) = None;
            let c = c.ok_or_else(|| backend_err(format!("MPI_Comm_split gave no communicator for {group:?}")))?;
            // Keep an existing communicator of the same group (its members agree on that).
            g.comms.entry(group).or_insert(c);
        }
        Ok(())
    }

    fn all_gather(&self, group: &[usize], send: &[u8], mut recv: RecvBuf<'_>) -> Result<()> {
        self.my_index("all_gather", group)?;
        let recv = recv.zeroed();
        let local = check::blocks("all_gather", "recv", recv.len(), group.len(), send.len());
        self.agree("all_gather", group, send.len(), check::Args::default(), 0, local)?;
        self.raw_all_gather(group, send, recv)
    }

    fn all_reduce(&self, group: &[usize], buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        self.my_index("all_reduce", group)?;
        let local = check::whole("all_reduce", buf.len(), dtype).and_then(|()| reduce::check_op(dtype, op));
        self.agree("all_reduce", group, buf.len(), check::Args::reduce(dtype, op), 0, local)?;
        self.raw_all_reduce(group, buf, dtype, op)
    }

    fn all_reduce_start(
        &self,
        group: &[usize],
        mut buf: Box<dyn OwnedBytes>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<PendingAllReduce> {
        self.my_index("all_reduce", group)?;
        // Device memory (never an MPI rank's own, but a caller may pass one) is reduced at
        // once, staged through the host (`pending::run_now`: `all_reduce_into` on buffers).
        let Some(bytes) = buf.host_mut() else {
            return super::pending::run_now(self, group, buf, dtype, op);
        };
        let local = check::whole("all_reduce", bytes.len(), dtype).and_then(|()| reduce::check_op(dtype, op));
        let datatype = mpi_datatype(dtype);
        let aligned = (bytes.as_ptr() as usize).is_multiple_of(dtype.size_of());
        let background = datatype.is_some() && !reduce::drops_nan(dtype, op) && aligned && !bytes.is_empty();
        // Agreed (blocking) before the transfer starts: a started all-reduce of disagreeing
        // sizes would read or write past the buffers while this rank went on. Whether it runs
        // in the background travels as the layout: an `MPI_Iallreduce` never matches a peer's
        // blocking `MPI_Allreduce` (the alignment of a buffer is this rank's own).
        self.agree("all_reduce", group, bytes.len(), check::Args::reduce(dtype, op), u64::from(background), local)?;
        if self.nothing_to_move("all_reduce", group, bytes.len())? {
            return Ok(PendingAllReduce::done(Ok(buf)));
        }
        let (Some(datatype), true) = (datatype, background) else {
            // 16-bit floats are gathered and folded here, max/min carry a NaN mask: both are
            // several MPI calls, run blocking; so does a buffer not aligned for its dtype (a
            // `Vec<T>` always is).
            self.raw_all_reduce(group, bytes, dtype, op)?;
            return Ok(PendingAllReduce::done(Ok(buf)));
        };
        let send = aligned_copy(bytes);
        let count = bytes.len() / dtype.size_of();
        // SAFETY: reading a handle constant of the MPI library.
        let mut request = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
        let rc = self.with_group("all_reduce", group, &[bytes.len()], |c, _| {
            // SAFETY: both buffers hold `count` elements of `datatype`, aligned for it (checked
            // above; `send` is 8-byte aligned), and are owned by the
            // `Started` made below, which waits for the request before it frees them (a Vec's
            // heap block does not move with the Vec, nor a boxed buffer's).
            unsafe {
                mpi::ffi::MPI_Iallreduce(
                    send.as_ptr().cast(),
                    bytes.as_mut_ptr().cast(),
                    count as std::ffi::c_int,
                    datatype,
                    mpi_op(op).as_raw(),
                    c.as_raw(),
                    &mut request,
                )
            }
        })?;
        if rc != 0 {
            return Err(backend_err(format!("MPI_Iallreduce returned {rc}")));
        }
        Ok(PendingAllReduce::running(Box::new(Started {
            request,
            send,
            recv: Some(buf),
            dtype,
            op,
            group: group.to_vec(),
            rank: self.rank,
            groups: Arc::clone(&self.groups),
        })))
    }

    /// Each all-gather of the batch as an `MPI_Iallgatherv` on the group's communicator,
    /// started in order (every member starts the same batch, so they match in order); the
    /// handle waits for all of them. Agreed first, once for the batch (blocking: sizes,
    /// counts, the number of gathers, and that every member starts them rather than running
    /// one blocking — a typed mismatch of the sizes or the kind on every member), so no
    /// started transfer reads or writes past a buffer while this rank goes on.
    fn all_gather_v_start(&self, group: &[usize], gathers: Vec<super::Gather>) -> Result<PendingAllReduce> {
        const OP: &str = "all_gather_v";
        let me = self.my_index(OP, group)?;
        // SAFETY: reading a handle constant of the MPI library.
        let null = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
        let mut started = StartedGathers {
            requests: Vec::with_capacity(gathers.len()),
            held: Vec::with_capacity(gathers.len()),
            recvs: Some(Vec::with_capacity(gathers.len())),
            group: group.to_vec(),
            rank: self.rank,
            groups: Arc::clone(&self.groups),
        };
        // One agreement for the batch (not two blocking round trips per gather): the sizes,
        // every count, and that every member starts the same number of gathers (a member
        // running one blocking passes layout 0).
        let mut local: Result<()> = Ok(());
        let (mut total, mut all_counts) = (0usize, Vec::new());
        let mut items = Vec::with_capacity(gathers.len());
        for super::Gather { mut send, counts, mut recv } in gathers {
            let lens = send.host_mut().map(|s| s.len()).zip(recv.host_mut().map(|r| r.len()));
            if local.is_ok() {
                local = match lens {
                    Some((s, r)) => variable::check_all_gather(group.len(), me, s, &counts, r),
                    None => Err(backend_err("a started all-gather takes host buffers only")),
                };
            }
            total += lens.map_or(0, |(_, r)| r);
            all_counts.extend_from_slice(&counts);
            items.push((send, counts, recv));
        }
        self.agree(OP, group, total, check::Args::default(), 1 + items.len() as u64, local)?;
        // Every member's counts have one entry per member (checked), so equal batches give
        // equal lengths here; an empty batch has none to agree on.
        if !all_counts.is_empty() {
            self.agree_counts(OP, group, &all_counts)?;
        }
        for (mut send, counts, mut recv) in items {
            let (Some(s), Some(r)) = (send.host_mut(), recv.host_mut()) else {
                return Err(backend_err("a started all-gather takes host buffers only"));
                // checked above
            };
            let mut request = null;
            if !self.nothing_to_move(OP, group, r.len())? {
                let (c, d) = (ints(&counts), ints(&offsets(&counts)));
                let byte = u8::equivalent_datatype().as_raw();
                let rc = self.with_group(OP, group, &[r.len()], |comm, _| {
                    // SAFETY: `s` holds `counts[me]` bytes and `r` their sum (checked and
                    // agreed above); both buffers, the counts and the displacements are owned
                    // by `started`, which waits for the request before it frees them (a boxed
                    // buffer's heap block and a Vec's do not move when they are moved).
                    unsafe {
                        mpi::ffi::MPI_Iallgatherv(
                            s.as_ptr().cast(),
                            s.len() as std::ffi::c_int,
                            byte,
                            r.as_mut_ptr().cast(),
                            c.as_ptr(),
                            d.as_ptr(),
                            byte,
                            comm.as_raw(),
                            &mut request,
                        )
                    }
                })?;
                if rc != 0 {
                    return Err(backend_err(format!("MPI_Iallgatherv returned {rc}")));
                }
                started.held.push((send, c, d));
            }
            started.requests.push(request);
            started.recvs.as_mut().expect("filled until wait").push(recv);
        }
        Ok(PendingAllReduce::running(Box::new(started)))
    }

    fn reduce_scatter(
        &self,
        group: &[usize],
        send: &[u8],
        mut recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        const OP: &str = "reduce_scatter";
        self.my_index(OP, group)?;
        let recv = recv.zeroed();
        let local = check::blocks(OP, "send", send.len(), group.len(), recv.len())
            .and_then(|()| check::whole(OP, recv.len(), dtype))
            .and_then(|()| reduce::check_op(dtype, op));
        self.agree(OP, group, recv.len(), check::Args::reduce(dtype, op), 0, local)?;
        self.raw_reduce_scatter(group, send, recv, dtype, op)
    }

    fn all_to_all(&self, group: &[usize], send: &[u8], mut recv: RecvBuf<'_>) -> Result<()> {
        self.my_index("all_to_all", group)?;
        let recv = recv.zeroed();
        let local = check::all_to_all(send.len(), recv.len(), group.len());
        self.agree("all_to_all", group, send.len(), check::Args::default(), 0, local)?;
        self.raw_all_to_all(group, send, recv)
    }

    fn all_to_all_strided(
        &self,
        group: &[usize],
        send: &[u8],
        rows: usize,
        run: usize,
        mut recv: RecvBuf<'_>,
    ) -> Result<()> {
        const OP: &str = "all_to_all_strided";
        let n = group.len();
        self.my_index(OP, group)?;
        let recv = recv.zeroed();
        let local = check::all_to_all_strided(send.len(), recv.len(), rows, run, n);
        // The run length travels as the layout: members that split their rows differently
        // would each pack other blocks.
        self.agree(OP, group, send.len(), check::Args::default(), run as u64, local)?;
        self.raw_all_to_all(group, &variable::pack_strided(send, n, run), recv)
    }

    fn all_gather_v(&self, group: &[usize], send: &[u8], counts: &[usize], mut recv: RecvBuf<'_>) -> Result<()> {
        const OP: &str = "all_gather_v";
        let me = self.my_index(OP, group)?;
        let recv = recv.zeroed();
        let local = variable::check_all_gather(group.len(), me, send.len(), counts, recv.len());
        self.agree(OP, group, recv.len(), check::Args::default(), 0, local)?;
        self.agree_counts(OP, group, counts)?;
        // The counts are the same on every member (so is the verdict).
        if self.nothing_to_move(OP, group, recv.len())? {
            return Ok(());
        }
        // Every count and displacement is at most the total, which `with_group` bounds.
        let (c, d) = (ints(counts), ints(&offsets(counts)));
        self.with_group(OP, group, &[recv.len()], |comm, _| {
            comm.all_gather_varcount_into(send, &mut PartitionMut::new(recv, c, d))
        })
    }

    // `reduce_scatter_v` pads the blocks to the largest and runs the reduce-scatter above, with
    // its NaN masks and 16-bit folds (MPI_Reduce_scatter would need both again); it agrees on
    // the counts first, as `all_gather_v` does.
    fn reduce_scatter_v(
        &self,
        group: &[usize],
        send: &[u8],
        counts: &[usize],
        recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        const OP: &str = "reduce_scatter_v";
        let me = self.my_index(OP, group)?;
        let local = variable::check_reduce_scatter(group.len(), me, send.len(), counts, recv.len(), dtype)
            .and_then(|()| reduce::check_op(dtype, op));
        self.agree(OP, group, send.len(), check::Args::reduce(dtype, op), 0, local)?;
        self.agree_counts(OP, group, counts)?;
        variable::reduce_scatter_padded(send, counts, me, recv, |blocks, mine| {
            self.raw_reduce_scatter(group, blocks, mine, dtype, op)
        })
    }

    fn all_to_all_v(
        &self,
        group: &[usize],
        send: &[u8],
        rows: usize,
        runs: &[usize],
        mut recv: RecvBuf<'_>,
        recv_counts: &[usize],
    ) -> Result<()> {
        const OP: &str = "all_to_all_v";
        let n = group.len();
        self.my_index(OP, group)?;
        let recv = recv.zeroed();
        let send_counts = variable::send_counts(rows, runs);
        let local = variable::check_all_to_all(n, send.len(), rows, runs, recv.len(), recv_counts)
            .and_then(|()| within_count(OP, &[send.len(), recv.len()]));
        self.agree(OP, group, 0, check::Args::default(), 0, local)?;
        // Member i sends member j `rows_i × runs_i[j]` bytes, which j must expect: each member
        // tells each peer what it sends it (an all-to-all of one count per peer), each compares
        // with its recv counts, and the members agree on the verdict (an all-reduce), so that
        // every member fails alike.
        let sent: Vec<u64> = send_counts.iter().flatten().map(|&c| c as u64).collect();
        let mut got = vec![0u64; n];
        self.with_group(OP, group, &[], |c, _| c.all_to_all_into(&sent[..], &mut got[..]))?;
        let wrong = variable::first_disagreement(&got, recv_counts);
        let mine = [wrong.map_or(0, |_| self.rank as u64 + 1)];
        let mut any = [0u64];
        self.with_group(OP, group, &[], |c, _| c.all_reduce_into(&mine[..], &mut any[..], SystemOperation::max()))?;
        if let Some((i, said, expected)) = wrong {
            let why = format!(
                "rank {} sends rank {} {said} bytes, which expects {expected} bytes from it",
                group[i], self.rank
            );
            return Err(check::mismatch(OP, why));
        }
        if let Some(r) = any[0].checked_sub(1) {
            return Err(check::mismatch(
                OP,
                format!("a member sends rank {r} another number of bytes than it expects"),
            ));
        }
        let send_counts = send_counts.unwrap_or_default();
        // MPI_Alltoallv takes one contiguous block per destination: rows of runs are packed
        // first (one copy; a single row is already such blocks).
        let packed;
        let send = if rows > 1 {
            packed =
                (0..n).flat_map(|j| variable::block_runs(send, rows, runs, j)).flatten().copied().collect::<Vec<u8>>();
            &packed[..]
        } else {
            send
        };
        // A member with nothing to send or receive still takes part (its peers may move data),
        // through buffers of its own: two empty buffers may share one dangling address, which
        // MPI rejects as aliased.
        let (spare_send, mut spare_recv) = ([0u8; 1], [0u8; 1]);
        let send = if send.is_empty() { &spare_send[..] } else { send };
        let recv = if recv.is_empty() { &mut spare_recv[..] } else { recv };
        let (sc, sd) = (ints(&send_counts), ints(&offsets(&send_counts)));
        let (rc, rd) = (ints(recv_counts), ints(&offsets(recv_counts)));
        self.with_group(OP, group, &[send.len(), recv.len()], |comm, _| {
            comm.all_to_all_varcount_into(&Partition::new(send, sc, sd), &mut PartitionMut::new(recv, rc, rd))
        })
    }

    fn broadcast(&self, group: &[usize], buf: &mut [u8], root: usize) -> Result<()> {
        self.my_index("broadcast", group)?;
        let local = check::root(root, group.len());
        self.agree("broadcast", group, buf.len(), check::Args::root(root), 0, local)?;
        if self.nothing_to_move("broadcast", group, buf.len())? {
            return Ok(());
        }
        self.with_group("broadcast", group, &[buf.len()], |c, _| c.process_at_rank(root as i32).broadcast_into(buf))
    }

    fn scatter(&self, group: &[usize], send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        let me = self.my_index("scatter", group)?;
        let n = group.len();
        let local = check::root(root, n).and_then(|()| match me == root {
            true => check::blocks("scatter", "root send", send.len(), n, recv.len()),
            false => Ok(()),
        });
        self.agree("scatter", group, recv.len(), check::Args::root(root), 0, local)?;
        // `recv` has the same length on every member (agreed).
        if self.nothing_to_move("scatter", group, recv.len())? {
            return Ok(());
        }
        // Non-roots' `send` is ignored: only the root's counts against MPI's limit.
        let sent = if me == root { send.len() } else { 0 };
        self.with_group("scatter", group, &[sent, recv.len()], |c, me| {
            let root_proc = c.process_at_rank(root as i32);
            if me == root {
                root_proc.scatter_into_root(send, recv)
            } else {
                root_proc.scatter_into(recv)
            }
        })
    }

    fn barrier(&self, group: &[usize]) -> Result<()> {
        self.my_index("barrier", group)?;
        // The agreement is an all-reduce: it returns nowhere before every member has entered.
        self.agree("barrier", group, 0, check::Args::default(), 0, Ok(()))
    }
}
