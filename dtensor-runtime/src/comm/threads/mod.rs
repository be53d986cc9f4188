//! The embedded default backend: every rank is an OS thread of one process and collectives
//! exchange data through shared memory.
//!
//! A collective is a rendezvous on the group (module `rendezvous`): each member publishes pointers
//! to its buffers, waits until every member has arrived, copies what it needs straight out of
//! its peers' buffers (one copy, like shared-memory MPI; the strided all-to-all instead pushes
//! each member's rows into its peers' outputs), then waits until every member is done copying
//! before it returns (so no buffer is freed while a peer still reads or writes it).
//!
//! Memory safety rests on three rules: a rank is in at most one collective per group at a
//! time (a second thread of the same rank gets [`Error::ConcurrentCollective`]); every length
//! comes from the caller's own buffers, and a peer's published length is only checked against
//! it; peers' buffers are only ever read in sub-ranges that nobody writes in that phase, and
//! written only in the sub-ranges of their outputs that this member alone writes.
//!
//! Arrival waits are bounded by the timeout and abort at once when a peer has failed or exited;
//! a rank that gives up withdraws its pointers, so nobody reads them later. The departure wait
//! is bounded by the timeout too, but returns only once the peers have finished copying (they
//! never block while copying), since returning earlier would free buffers they still read.
//!
//! The rendezvous is model-checked with `loom` (small worlds, every interleaving):
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p dtensor-runtime --lib --release loom`.

#[cfg(test)]
mod device_rendezvous_tests;
#[cfg(all(test, loom))]
mod loom_tests;
mod rendezvous;
mod sync;

use super::background::Background;
use super::check::Args;
use super::reduce;
use super::variable::{self, offsets};
use super::{check, group, timeout};
use super::{Gather, HostCollectives, OwnedBytes, PendingAllReduce, RecvBuf};
use crate::element::DType;
use crate::error::{Error, Result};
use crate::placement::ReduceOp;
pub(crate) use rendezvous::Bufs;
use rendezvous::Slot;
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use sync::{Mutex, MutexGuard};

#[derive(Debug, Default)]
struct State {
    failed: Option<(usize, String)>,
    /// The ranks that returned from their closures (a set, so that a world costs nothing per
    /// rank before its ranks start).
    exited: std::collections::BTreeSet<usize>,
}

/// Shared state of all ranks of one in-process world.
#[derive(Debug)]
pub struct ThreadWorld {
    size: usize,
    timeout: Duration,
    cores: usize,
    state: Mutex<State>,
    slots: Mutex<HashMap<Vec<usize>, Arc<Slot>>>,
}

impl ThreadWorld {
    /// A world of `size` ranks whose collectives give up after `timeout` (any timeout: one too
    /// long to add to the current time means no limit). Nothing is allocated per rank here;
    /// launchers bound `size` first ([`MAX_WORLD_SIZE`](crate::launch::MAX_WORLD_SIZE)).
    pub fn new(size: usize, timeout: Duration) -> Arc<ThreadWorld> {
        Arc::new(ThreadWorld {
            size,
            timeout,
            cores: std::thread::available_parallelism().map_or(1, |c| c.get()),
            state: Mutex::new(State::default()),
            slots: Mutex::new(HashMap::new()),
        })
    }

    /// Communicator handle of `rank`.
    pub fn communicator(self: &Arc<Self>, rank: usize) -> Result<ThreadComm> {
        if rank >= self.size {
            return Err(Error::RankOutOfRange { rank, world_size: self.size });
        }
        Ok(ThreadComm { world: Arc::clone(self), rank, sequences: Arc::default(), background: Arc::default() })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update under this lock is a single assignment, so a panic cannot leave it
        // half-done: recover from poisoning.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The rendezvous slot of `group`, created (after checking the group) on first use.
    fn slot(&self, op: &str, group: &[usize]) -> Result<Arc<Slot>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slots.get(group) {
            return Ok(Arc::clone(s));
        }
        group::validate(op, group, self.size)?;
        let s = Arc::new(Slot::new(group.len(), self.cores));
        slots.insert(group.to_vec(), Arc::clone(&s));
        Ok(s)
    }

    /// Wakes every parked waiter so that it sees a failure or exit now.
    fn wake_all(&self) {
        let slots: Vec<Arc<Slot>> = self.slots.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        slots.iter().for_each(|s| s.wake());
    }

    /// Marks `rank` as failed: every pending and future collective aborts with `PeerFailed`.
    pub fn fail(&self, rank: usize, reason: String) {
        let mut st = self.lock();
        if st.failed.is_none() {
            st.failed = Some((rank, reason));
        }
        drop(st);
        self.wake_all();
    }

    /// Marks `rank` as finished: collectives that wait for it abort instead of timing out.
    pub fn exit(&self, rank: usize) {
        let mut st = self.lock();
        if rank < self.size {
            st.exited.insert(rank);
        }
        drop(st);
        self.wake_all();
    }

    fn check_alive(&self, rank: usize, group: &[usize]) -> Result<()> {
        let st = self.lock();
        if let Some((failed_rank, reason)) = &st.failed {
            return Err(Error::PeerFailed { rank, failed_rank: *failed_rank, reason: reason.clone() });
        }
        if let Some(&gone) = group.iter().find(|&&r| r != rank && st.exited.contains(&r)) {
            return Err(Error::PeerFailed {
                rank,
                failed_rank: gone,
                reason: "it returned from its closure while this rank still waits in a collective".into(),
            });
        }
        Ok(())
    }
}

/// One rank's handle on a [`ThreadWorld`].
#[derive(Debug, Clone)]
pub struct ThreadComm {
    world: Arc<ThreadWorld>,
    rank: usize,
    sequences: Arc<super::fingerprint::Sequences>,
    /// The worker of [`all_reduce_start`](Communicator::all_reduce_start), started on first use
    /// and shared by the clones of this handle.
    background: Arc<OnceLock<Background>>,
}

/// The collectives, as the tags members publish (a mismatch is detected before any copy). The
/// `*_buf` ones are the device-to-device collectives of the `cuda-threads` backend (through
/// [`ThreadComm::rendezvous`]): their own tags, so that a host collective never reads a device
/// record as its data.
const OPS: [&str; 16] = [
    "all_gather",
    "all_reduce",
    "reduce_scatter",
    "all_to_all",
    "all_to_all_strided",
    "broadcast",
    "scatter",
    "barrier",
    "all_gather_buf",
    "all_reduce_buf",
    "reduce_scatter_buf",
    "all_to_all_buf",
    "broadcast_buf",
    "all_gather_v",
    "reduce_scatter_v",
    "all_to_all_v",
];

fn tag(op: &str) -> usize {
    OPS.iter().position(|&o| o == op).map_or(0, |i| i + 1)
}

/// Frees a member's seat when its collective ends, however it ends.
struct Seat<'a> {
    slot: &'a Slot,
    me: usize,
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        self.slot.leave(self.me);
    }
}

/// Departs on unwind too: a member whose body panicked must not leave its peers waiting.
struct Departure<'a> {
    slot: &'a Slot,
    phase: u64,
    done: bool,
}

impl Departure<'_> {
    fn finish(mut self, give_up: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.done = true;
        self.slot.depart(self.phase, give_up)
    }
}

impl Drop for Departure<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.slot.depart::<()>(self.phase, &mut || Ok(()));
        }
    }
}

impl ThreadComm {
    /// This rank's background worker, started on first use.
    fn worker(&self) -> Result<&Background> {
        if let Some(b) = self.background.get() {
            return Ok(b);
        }
        // The worker's handle shares the world, rank and sequence numbers, not the worker (so
        // that dropping this rank's handles ends it). A lost race drops a spare worker, which
        // then exits.
        let own = ThreadComm { background: Arc::default(), ..self.clone() };
        let spare = Background::spawn(Box::new(own))?;
        Ok(self.background.get_or_init(|| spare))
    }

    fn timeout_error(&self, op: &str, group: &[usize]) -> Error {
        Error::CollectiveTimeout {
            op: op.into(),
            group: group.to_vec(),
            rank: self.rank,
            timeout_ms: u64::try_from(self.world.timeout.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Member `i` passed other arguments (element type, reduction, root) than this rank.
    fn args_mismatch(&self, op: &str, group: &[usize], i: usize, all: &[Bufs]) -> Error {
        let me = group.iter().position(|&r| r == self.rank).unwrap_or(0);
        let (theirs, mine) = (Args::unpack(all[i].args), Args::unpack(all[me].args));
        let (field, a, b) = theirs.differ(mine).unwrap_or(("arguments", String::new(), String::new()));
        Error::CollectiveMismatch {
            rank: self.rank,
            group: group.to_vec(),
            field: field.into(),
            detail: format!("rank {} called `{op}` with {field} {a} while rank {} passed {b}", group[i], self.rank),
        }
    }

    /// The rendezvous. `body` runs once every member has published its buffers; it gets
    /// every member's buffers and this rank's index. The call returns after every member
    /// has finished its body, however it ended (so what the buffers point to stays alive
    /// while any peer still uses it); `body` must not block on the peers. Members whose tags
    /// (collectives) or `args` (element type, reduction, root) differ all fail before any
    /// `body` runs: a root that disagreed would have read a peer's unpublished buffer.
    ///
    /// Also the rendezvous of a backend layered on this one (the `cuda-threads` device path,
    /// whose records hold device addresses), under the `*_buf` names of [`OPS`]: their own
    /// tags, so that a host collective never reads a device record as its data.
    pub(crate) fn rendezvous<R>(
        &self,
        op: &'static str,
        group: &[usize],
        mine: Bufs,
        body: impl FnOnce(&[Bufs], usize) -> Result<R>,
    ) -> Result<R> {
        let me = group::index_of(op, self.rank, group)?;
        let w = &*self.world;
        let slot = w.slot(op, group)?;
        if !slot.enter(me) {
            return Err(Error::ConcurrentCollective { op: op.into(), rank: self.rank, group: group.to_vec() });
        }
        let _seat = Seat { slot: &slot, me };
        let deadline = timeout::deadline(w.timeout);
        let (phase, all) = slot.arrive(me, Bufs { tag: tag(op), ..mine }, &mut || {
            w.check_alive(self.rank, group)?;
            if timeout::passed(deadline) {
                return Err(self.timeout_error(op, group));
            }
            Ok(())
        })?;
        let departure = Departure { slot: &slot, phase, done: false };
        // Each member compares every member with itself: when not all agree, every member
        // finds one that differs from it, so all fail alike.
        let result = match all.iter().position(|b| b.tag != all[me].tag) {
            Some(i) => Err(Error::BufferMismatch {
                op: op.into(),
                reason: format!(
                    "rank {} called `{}` while rank {} called `{op}`",
                    group[i],
                    OPS.get(all[i].tag.wrapping_sub(1)).copied().unwrap_or("?"),
                    self.rank
                ),
            }),
            None => match all.iter().position(|b| b.args != all[me].args) {
                Some(i) => Err(self.args_mismatch(op, group, i, &all)),
                None => body(&all, me),
            },
        };
        let departed = departure.finish(&mut || {
            if timeout::passed(deadline) {
                return Err(self.timeout_error(op, group));
            }
            Ok(())
        });
        let r = result?;
        departed?;
        Ok(r)
    }
}

impl ThreadComm {
    /// An all-reduce in one rendezvous: every member folds every member's `send` (which
    /// nobody writes) into its own `recv` in group order, so results are bit-identical.
    fn reduce_small(
        &self,
        group: &[usize],
        send: &[u8],
        mut recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let len = send.len();
        let args = Args::reduce(dtype, op).packed();
        let mine = Bufs { send: send.as_ptr() as usize, send_len: len, args, ..Bufs::default() };
        self.rendezvous("all_reduce", group, mine, |all, _| {
            same_len("all_reduce", all, Side::Send, len, group)?;
            let acc = recv.init_from(peer("all_reduce", &all[0], Side::Send, 0..len)?);
            for b in &all[1..] {
                reduce::accumulate(dtype, op, acc, peer("all_reduce", b, Side::Send, 0..len)?)?;
            }
            reduce::finish(dtype, op, acc, group.len());
            Ok(())
        })
    }

    /// An all-reduce in one rendezvous without private copies: member `i` reduces element
    /// range `i` of every member's input (`send`, `len` bytes) into range `i` of its output
    /// (`recv`, which may be `send` itself), one cache-sized block at a time, and copies each
    /// finished block into range `i` of every peer's output while it is still in cache. Each
    /// rank thus reads its share of the inputs once and writes as many bytes as it receives,
    /// as a memcpy does; a gather of the ranges from their owners afterwards (the former second
    /// rendezvous) read and wrote the output once more. One member computes each range, so
    /// results are bit-identical.
    ///
    /// Both pointers must be the caller's buffers of `len` bytes, reached only through this
    /// call until it returns (`send` is only read unless it is `recv`); `recv` may be
    /// uninitialised unless it is `send`. On `Ok` every byte of `recv` was written.
    fn reduce_in_ranges(
        &self,
        group: &[usize],
        send: *const u8,
        recv: *mut MaybeUninit<u8>,
        len: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let n = group.len();
        let es = dtype.size_of();
        let range = |i: usize| {
            let (sz, off) = crate::layout::chunk_size_and_offset(len / es, n, i);
            off * es..(off + sz) * es
        };
        let in_place = std::ptr::eq(send, recv.cast());
        let args = Args::reduce(dtype, op).packed();
        let mine =
            Bufs { send: send as usize, send_len: len, recv: recv as usize, recv_len: len, args, ..Bufs::default() };
        // Whole elements; n + 1 blocks stay within a core's L2 cache.
        let block = REDUCE_BLOCK / es * es;
        self.rendezvous("all_reduce", group, mine, |all, me| {
            same_len("all_reduce", all, Side::Send, len, group)?;
            same_len("all_reduce", all, Side::Recv, len, group)?;
            // Before the blocks, so that every member fails alike: a member whose range is
            // empty reaches no fold that would check the op, and would return `Ok` while the
            // peers that own the other ranges fail without writing them.
            reduce::check_op(dtype, op)?;
            let r = range(me);
            // Out of place, the first peer's range is folded in while our input is copied.
            let first = usize::from(me == 0);
            let mut at = r.start;
            while at < r.end {
                let b = at..(at + block).min(r.end);
                at = b.end;
                // SAFETY: block `b` of range `r` of our own output: nobody else touches range
                // `r` of any member's buffer (each member works on its own range only).
                let own = unsafe { own_mut(recv, len, b.clone()) };
                let acc = if in_place {
                    // SAFETY: in place, `recv` is the caller's initialised `send`.
                    unsafe { assume_init(own) }
                } else if n > 1 {
                    let (mine, theirs) = (peer("all_reduce", &all[me], Side::Send, b.clone())?, &all[first]);
                    reduce::combine(dtype, op, own, mine, peer("all_reduce", theirs, Side::Send, b.clone())?)?
                } else {
                    own.write_copy_of_slice(peer("all_reduce", &all[me], Side::Send, b.clone())?)
                };
                for (j, pb) in all.iter().enumerate() {
                    if j != me && (in_place || j != first) {
                        reduce::accumulate(dtype, op, acc, peer("all_reduce", pb, Side::Send, b.clone())?)?;
                    }
                }
                reduce::finish(dtype, op, acc, n);
                for (j, pb) in all.iter().enumerate() {
                    if j != me {
                        // SAFETY: block `b` of member j's output (published, `len` bytes, kept
                        // alive until every member leaves): only we touch range `r` of it, and
                        // when it is j's input too, we read that block above and are done with it.
                        unsafe { own_mut(pb.recv as *mut MaybeUninit<u8>, len, b.clone()) }.write_copy_of_slice(acc);
                    }
                }
            }
            Ok(())
        })
    }
}

/// Which of a member's published buffers to view.
#[derive(Clone, Copy)]
enum Side {
    Send,
    Recv,
}

/// Bytes `r` of a member's published buffer, checked against the length it published.
///
/// SAFETY (of the unchecked view inside): the member is blocked in the same rendezvous until
/// every member has departed, so the buffer is alive; callers only view sub-ranges that
/// nobody writes in the current phase (each collective says which).
fn peer<'a>(op: &str, b: &Bufs, side: Side, r: Range<usize>) -> Result<&'a [u8]> {
    let (ptr, len) = match side {
        Side::Send => (b.send, b.send_len),
        Side::Recv => (b.recv, b.recv_len),
    };
    if r.start > r.end || r.end > len {
        return Err(check::mismatch(op, format!("a peer published {len} bytes, bytes {r:?} were expected")));
    }
    if r.is_empty() {
        return Ok(&[]);
    }
    // SAFETY: see above; `r` lies inside the published allocation.
    Ok(unsafe { std::slice::from_raw_parts((ptr as *const u8).add(r.start), r.len()) })
}

/// `b`, whose bytes were all written, as initialised bytes.
///
/// SAFETY: every byte of `b` is initialised.
unsafe fn assume_init(b: &mut [MaybeUninit<u8>]) -> &mut [u8] {
    &mut *(std::ptr::from_mut::<[MaybeUninit<u8>]>(b) as *mut [u8])
}

/// Bytes `r` of a buffer at `ptr` (of `len` bytes) that this rank writes in the current phase:
/// its own, or the block of a peer's output that only it writes.
///
/// SAFETY: `ptr` is a live buffer of `len` bytes (the caller's own, or one a peer published
/// and keeps alive until it departs); nobody else touches range `r` in the current phase,
/// and no other view of that range is alive meanwhile.
unsafe fn own_mut<'a>(ptr: *mut MaybeUninit<u8>, len: usize, r: Range<usize>) -> &'a mut [MaybeUninit<u8>] {
    debug_assert!(r.start <= r.end && r.end <= len);
    if r.is_empty() {
        return &mut [];
    }
    std::slice::from_raw_parts_mut(ptr.add(r.start), r.len())
}

/// Every member published `len` bytes on `side` (every member sees the same verdict).
fn same_len(op: &str, all: &[Bufs], side: Side, len: usize, group: &[usize]) -> Result<()> {
    let of = |b: &Bufs| match side {
        Side::Send => b.send_len,
        Side::Recv => b.recv_len,
    };
    if let Some(i) = all.iter().position(|b| of(b) != of(&all[0])) {
        return Err(check::mismatch(
            op,
            format!("rank {} has {} bytes but rank {} has {}", group[i], of(&all[i]), group[0], of(&all[0])),
        ));
    }
    debug_assert_eq!(of(&all[0]), len);
    Ok(())
}

/// The `len` numbers a member published through `extra`: a pointer to its own argument slice
/// (the counts of a variable-size collective).
///
/// SAFETY (of the view inside): the member is blocked in the same rendezvous until every
/// member has departed, so its arguments are alive, and nobody writes them; the tags matched,
/// so every member's `extra` is such a pointer, to `len` numbers (each checked its own first).
fn peer_counts<'a>(b: &Bufs, len: usize) -> &'a [usize] {
    if len == 0 {
        return &[];
    }
    // SAFETY: see above.
    unsafe { std::slice::from_raw_parts(b.extra as *const usize, len) }
}

/// Every member passed the same `counts` (every member sees the same verdict).
fn same_counts(op: &str, all: &[Bufs], counts: &[usize], group: &[usize], me: usize) -> Result<()> {
    match all.iter().position(|b| peer_counts(b, counts.len()) != counts) {
        None => Ok(()),
        Some(i) => Err(check::mismatch(
            op,
            format!(
                "rank {} passed counts {:?}, rank {} {counts:?}",
                group[i],
                peer_counts(&all[i], counts.len()),
                group[me]
            ),
        )),
    }
}

/// All-reduces of at most this many bytes reduce private copies of the inputs; larger ones
/// split the reduction over the members (no copies).
const SMALL_ALL_REDUCE: usize = 64 << 10;

/// Block of a member's range that a large all-reduce reduces, then copies to the peers.
const REDUCE_BLOCK: usize = 64 << 10;

// SAFETY: every collective below writes all of its `RecvBuf` before returning `Ok` (each
// says how), and a failed length check returns before anything is read.
unsafe impl HostCollectives for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world.size
    }
    fn backend(&self) -> &'static str {
        "threads"
    }
    fn sequences(&self) -> Option<&super::fingerprint::Sequences> {
        Some(&self.sequences)
    }

    fn all_reduce_start(
        &self,
        group: &[usize],
        mut buf: Box<dyn OwnedBytes>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<PendingAllReduce> {
        // Only host buffers go to the worker: device memory (never a thread rank's own, but a
        // caller may pass one) is reduced at once on this thread, staged through the host.
        let Some(bytes) = buf.host_mut() else {
            return super::pending::run_now(self, group, buf, dtype, op);
        };
        // Checked here so that a bad call fails on the caller's thread, as a blocking one would.
        check::whole("all_reduce", bytes.len(), dtype)?;
        reduce::check_op(dtype, op)?;
        group::index_of("all_reduce", self.rank, group)?;
        Ok(self.worker()?.all_reduce(group, buf, dtype, op))
    }

    fn all_gather_v_start(&self, group: &[usize], mut gathers: Vec<Gather>) -> Result<PendingAllReduce> {
        // Checked here so that a bad call fails on the caller's thread, as a blocking one
        // would (a send buffer may make its bytes only when the worker asks: the mesh checked
        // its length).
        group::index_of("all_gather_v", self.rank, group)?;
        for g in &mut gathers {
            let Some(r) = g.recv.host_mut() else {
                return super::pending::gather_now(self, group, gathers);
            };
            if g.counts.len() != group.len() || g.counts.iter().sum::<usize>() != r.len() {
                return Err(crate::error::Error::Backend {
                    backend: "threads".into(),
                    message: format!(
                        "all_gather_v: counts {:?} for a group of {} do not fill {} bytes received",
                        g.counts,
                        group.len(),
                        r.len()
                    ),
                });
            }
        }
        let group = group.to_vec();
        Ok(self.worker()?.start(Box::new(move |c| super::pending::run_gathers(c, &group, gathers))))
    }

    fn all_gather(&self, group: &[usize], send: &[u8], mut recv: RecvBuf<'_>) -> Result<()> {
        let n = group.len();
        let l = send.len();
        check::blocks("all_gather", "recv", recv.len(), n, l)?;
        let mine = Bufs { send: send.as_ptr() as usize, send_len: l, ..Bufs::default() };
        self.rendezvous("all_gather", group, mine, |all, _| {
            same_len("all_gather", all, Side::Send, l, group)?;
            for (j, b) in all.iter().enumerate() {
                // Peers only read their own send buffers, which nobody writes.
                // Block j of n: all of `recv` once the loop ends.
                recv.write(j * l, peer("all_gather", b, Side::Send, 0..l)?);
            }
            Ok(())
        })
    }

    fn all_reduce(&self, group: &[usize], buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        check::whole("all_reduce", buf.len(), dtype)?;
        if buf.len() <= SMALL_ALL_REDUCE {
            // Peers read a private copy of the input, never the buffer its owner writes.
            let copy = buf.to_vec();
            return self.reduce_small(group, &copy, buf.into(), dtype, op);
        }
        // From here on the buffer is only reached through this pointer, as sub-ranges.
        let ptr = buf.as_mut_ptr();
        self.reduce_in_ranges(group, ptr, ptr.cast(), buf.len(), dtype, op)
    }

    fn all_reduce_into(
        &self,
        group: &[usize],
        send: &[u8],
        mut recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        check::same_len("all_reduce", send.len(), recv.len())?;
        check::whole("all_reduce", send.len(), dtype)?;
        if send.len() <= SMALL_ALL_REDUCE {
            return self.reduce_small(group, send, recv, dtype, op);
        }
        self.reduce_in_ranges(group, send.as_ptr(), recv.as_mut_ptr(), send.len(), dtype, op)
    }

    fn reduce_scatter(
        &self,
        group: &[usize],
        send: &[u8],
        mut recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let n = group.len();
        let l = recv.len();
        check::blocks("reduce_scatter", "send", send.len(), n, l)?;
        check::whole("reduce_scatter", l, dtype)?;
        let args = Args::reduce(dtype, op).packed();
        let mine = Bufs { send: send.as_ptr() as usize, send_len: send.len(), args, ..Bufs::default() };
        self.rendezvous("reduce_scatter", group, mine, |all, me| {
            same_len("reduce_scatter", all, Side::Send, send.len(), group)?;
            let r = me * l..(me + 1) * l;
            let acc = recv.init_from(peer("reduce_scatter", &all[0], Side::Send, r.clone())?);
            for b in &all[1..] {
                reduce::accumulate(dtype, op, acc, peer("reduce_scatter", b, Side::Send, r.clone())?)?;
            }
            reduce::finish(dtype, op, acc, n);
            Ok(())
        })
    }

    fn all_to_all(&self, group: &[usize], send: &[u8], mut recv: RecvBuf<'_>) -> Result<()> {
        let n = group.len();
        check::all_to_all(send.len(), recv.len(), n)?;
        let l = send.len() / n;
        let mine = Bufs { send: send.as_ptr() as usize, send_len: send.len(), ..Bufs::default() };
        self.rendezvous("all_to_all", group, mine, |all, me| {
            same_len("all_to_all", all, Side::Send, send.len(), group)?;
            for (j, b) in all.iter().enumerate() {
                // Block j of n: all of `recv` once the loop ends.
                recv.write(j * l, peer("all_to_all", b, Side::Send, me * l..(me + 1) * l)?);
            }
            Ok(())
        })
    }

    fn all_to_all_strided(
        &self,
        group: &[usize],
        send: &[u8],
        rows: usize,
        run: usize,
        mut recv: RecvBuf<'_>,
    ) -> Result<()> {
        let n = group.len();
        let len = send.len();
        check::all_to_all_strided(len, recv.len(), rows, run, n)?;
        let l = rows * run;
        // Every member must use the same layout: the run length travels as `extra`.
        let out = recv.as_mut_ptr();
        let mine = Bufs {
            send: send.as_ptr() as usize,
            send_len: len,
            recv: out as usize,
            recv_len: len,
            extra: run,
            ..Bufs::default()
        };
        self.rendezvous("all_to_all_strided", group, mine, |all, me| {
            same_len("all_to_all", all, Side::Send, len, group)?;
            same_len("all_to_all", all, Side::Recv, len, group)?;
            if let Some(i) = all.iter().position(|b| b.extra != run) {
                return Err(check::mismatch(
                    "all_to_all",
                    format!(
                        "rank {} splits its rows into runs of {} bytes, rank {} into {run}",
                        group[i], all[i].extra, self.rank
                    ),
                ));
            }
            // Each member pushes its own rows into the outputs, row by row: reading our send
            // buffer front to back (the runs of a row are adjacent) keeps the hardware
            // prefetcher streaming, while pulling run `me` of every peer row would start a cold
            // stream every row. Block `me` of each output is written by us alone, and nobody
            // reads an output in this phase.
            let outs: Vec<*mut MaybeUninit<u8>> = all.iter().map(|b| b.recv as *mut MaybeUninit<u8>).collect();
            // (`max(1)`: with runs of 0 bytes there is nothing to copy, and no row to split.)
            for (r, row) in send.chunks_exact((n * run).max(1)).enumerate() {
                let to = me * l + r * run..me * l + (r + 1) * run;
                for (&dst, src) in outs.iter().zip(row.chunks_exact(run)) {
                    // SAFETY: member k published `len` bytes at `dst` (checked above) and keeps
                    // them alive until it departs; row r of block `me` lies inside them and only
                    // we write it. Once every member is done every byte of every output is written.
                    unsafe { own_mut(dst, len, to.clone()) }.write_copy_of_slice(src);
                }
            }
            Ok(())
        })
    }

    fn all_gather_v(&self, group: &[usize], send: &[u8], counts: &[usize], mut recv: RecvBuf<'_>) -> Result<()> {
        const OP: &str = "all_gather_v";
        let me = group::index_of(OP, self.rank, group)?;
        variable::check_all_gather(group.len(), me, send.len(), counts, recv.len())?;
        let mine = Bufs {
            send: send.as_ptr() as usize,
            send_len: send.len(),
            extra: counts.as_ptr() as usize,
            ..Bufs::default()
        };
        self.rendezvous(OP, group, mine, |all, me| {
            // With equal counts every member's send is its count long (each checked its own).
            same_counts(OP, all, counts, group, me)?;
            for ((b, &c), at) in all.iter().zip(counts).zip(offsets(counts)) {
                // Peers only read their own send buffers; the blocks tile `recv`.
                recv.write(at, peer(OP, b, Side::Send, 0..c)?);
            }
            Ok(())
        })
    }

    fn reduce_scatter_v(
        &self,
        group: &[usize],
        send: &[u8],
        counts: &[usize],
        mut recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        const OP: &str = "reduce_scatter_v";
        let n = group.len();
        let me = group::index_of(OP, self.rank, group)?;
        variable::check_reduce_scatter(n, me, send.len(), counts, recv.len(), dtype)?;
        // Before the rendezvous: a member with an empty block would otherwise never check it.
        reduce::check_op(dtype, op)?;
        let mine = Bufs {
            send: send.as_ptr() as usize,
            send_len: send.len(),
            extra: counts.as_ptr() as usize,
            args: Args::reduce(dtype, op).packed(),
            ..Bufs::default()
        };
        self.rendezvous(OP, group, mine, |all, me| {
            same_counts(OP, all, counts, group, me)?;
            let at = offsets(counts)[me];
            let r = at..at + counts[me];
            // Block `me` of every member's send, which nobody writes, folded in group order.
            let acc = recv.init_from(peer(OP, &all[0], Side::Send, r.clone())?);
            for b in &all[1..] {
                reduce::accumulate(dtype, op, acc, peer(OP, b, Side::Send, r.clone())?)?;
            }
            reduce::finish(dtype, op, acc, n);
            Ok(())
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
        group::index_of(OP, self.rank, group)?;
        variable::check_all_to_all(n, send.len(), rows, runs, recv.len(), recv_counts)?;
        // Every member's layout travels as one slice: rows, runs, recv counts.
        let layout: Vec<usize> =
            std::iter::once(rows).chain(runs.iter().copied()).chain(recv_counts.iter().copied()).collect();
        let out = recv.as_mut_ptr();
        let mine = Bufs {
            send: send.as_ptr() as usize,
            send_len: send.len(),
            recv: out as usize,
            recv_len: recv.len(),
            extra: layout.as_ptr() as usize,
            ..Bufs::default()
        };
        self.rendezvous(OP, group, mine, |all, me| {
            let lay: Vec<&[usize]> = all.iter().map(|b| peer_counts(b, 1 + 2 * n)).collect();
            // Member i sends member j `rows_i × runs_i[j]` bytes, which j must expect: checked
            // for every pair, so that every member sees the same verdict.
            for (i, li) in lay.iter().enumerate() {
                for (j, lj) in lay.iter().enumerate() {
                    let sent = li[0].checked_mul(li[1 + j]);
                    if sent != Some(lj[1 + n + i]) {
                        return Err(check::mismatch(
                            OP,
                            format!(
                                "rank {} sends rank {} {} rows of {} bytes, which expects {} bytes from it",
                                group[i],
                                group[j],
                                li[0],
                                li[1 + j],
                                lj[1 + n + i]
                            ),
                        ));
                    }
                }
            }
            // Our runs for member j fill block `me` of j's recv, which starts after what the
            // members before us send it. We push our rows front to back (as the strided
            // all-to-all does), so our send buffer streams through the prefetcher; only we
            // write block `me` of any output, and nobody reads an output in this phase.
            let to: Vec<(*mut MaybeUninit<u8>, usize, usize)> = all
                .iter()
                .zip(&lay)
                .map(|(b, l)| (b.recv as *mut MaybeUninit<u8>, b.recv_len, l[1 + n..1 + n + me].iter().sum()))
                .collect();
            let starts = offsets(runs);
            // Only the members we send bytes to, and no rows at all when we send nothing: the
            // loop is bounded by the bytes moved, never by `rows` alone (an empty shard may
            // have a huge leading dim and runs of 0 bytes).
            let targets: Vec<usize> = (0..n).filter(|&j| runs[j] > 0).collect();
            for (r, row) in send.chunks_exact(variable::total(OP, runs)?.max(1)).enumerate() {
                for &j in &targets {
                    let ((dst, len, at), run) = (to[j], runs[j]);
                    let src = &row[starts[j]..starts[j] + run];
                    // SAFETY: member j published `len` bytes at `dst` and keeps them alive until
                    // it departs; its block from us (`rows × run` bytes at `at`, checked above
                    // against its recv counts, whose sum is its `len`) is written by us alone.
                    unsafe { own_mut(dst, len, at + r * run..at + (r + 1) * run) }.write_copy_of_slice(src);
                }
            }
            Ok(())
        })
    }

    fn broadcast(&self, group: &[usize], buf: &mut [u8], root: usize) -> Result<()> {
        check::root(root, group.len())?;
        let len = buf.len();
        let me = group::index_of("broadcast", self.rank, group)?;
        // Only the root's buffer is read by peers (and the root does not write it); the others
        // publish just their length.
        let args = Args::root(root).packed();
        let mine = if me == root {
            Bufs { send: buf.as_ptr() as usize, send_len: len, args, ..Bufs::default() }
        } else {
            Bufs { send_len: len, args, ..Bufs::default() }
        };
        self.rendezvous("broadcast", group, mine, |all, me| {
            same_len("broadcast", all, Side::Send, len, group)?;
            if me != root {
                buf.copy_from_slice(peer("broadcast", &all[root], Side::Send, 0..len)?);
            }
            Ok(())
        })
    }

    fn scatter(&self, group: &[usize], send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        let n = group.len();
        check::root(root, n)?;
        let me = group::index_of("scatter", self.rank, group)?;
        let l = recv.len();
        if me == root {
            check::blocks("scatter", "root send", send.len(), n, l)?;
        }
        let args = Args::root(root).packed();
        let mine = if me == root {
            Bufs { send: send.as_ptr() as usize, send_len: send.len(), recv_len: l, args, ..Bufs::default() }
        } else {
            Bufs { recv_len: l, args, ..Bufs::default() }
        };
        self.rendezvous("scatter", group, mine, |all, me| {
            same_len("scatter", all, Side::Recv, l, group)?;
            recv.copy_from_slice(peer("scatter", &all[root], Side::Send, me * l..(me + 1) * l)?);
            Ok(())
        })
    }

    fn barrier(&self, group: &[usize]) -> Result<()> {
        self.rendezvous("barrier", group, Bufs::default(), |_, _| Ok(()))
    }
}
