//! The embedded default backend: every rank is an OS thread of one process and collectives
//! exchange data through shared memory.
//!
//! A collective is a rendezvous on the group: each member publishes pointers to its buffers,
//! waits until every member has arrived, copies what it needs straight out of its peers'
//! buffers (one copy, like shared-memory MPI), then waits until every member is done reading
//! before it returns (so no buffer is freed while a peer still reads it).
//!
//! Arrival waits are bounded by a timeout and abort at once when a peer has failed or exited;
//! a rank that gives up withdraws its pointers under the lock, so nobody reads them later.

use super::reduce;
use super::Communicator;
use crate::element::DType;
use crate::error::{Error, Result};
use crate::placement::ReduceOp;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Published buffer of one member: (send ptr, send len, recv ptr, recv len) as integers.
#[derive(Clone, Copy, Default, Debug)]
struct Bufs {
    send: usize,
    send_len: usize,
    recv: usize,
    recv_len: usize,
}

#[derive(Debug, Default)]
struct Slot {
    generation: u64,
    arrived: usize,
    departed: usize,
    bufs: Vec<Bufs>,
    op: Vec<&'static str>,
}

#[derive(Debug, Default)]
struct State {
    slots: HashMap<Vec<usize>, Slot>,
    failed: Option<(usize, String)>,
    exited: Vec<bool>,
}

/// Shared state of all ranks of one in-process world.
#[derive(Debug)]
pub struct ThreadWorld {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

impl ThreadWorld {
    /// A world of `size` ranks whose collectives give up after `timeout`.
    pub fn new(size: usize, timeout: Duration) -> Arc<ThreadWorld> {
        Arc::new(ThreadWorld {
            size,
            timeout,
            state: Mutex::new(State { exited: vec![false; size], ..State::default() }),
            cv: Condvar::new(),
        })
    }

    /// Communicator handle of `rank`.
    pub fn communicator(self: &Arc<Self>, rank: usize) -> Result<ThreadComm> {
        if rank >= self.size {
            return Err(Error::RankOutOfRange { rank, world_size: self.size });
        }
        Ok(ThreadComm { world: Arc::clone(self), rank })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-updated in a way we
        // rely on (every update is a few integer writes), so recover from poisoning.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks `rank` as failed: every pending and future collective aborts with `PeerFailed`.
    pub fn fail(&self, rank: usize, reason: String) {
        let mut st = self.lock();
        if st.failed.is_none() {
            st.failed = Some((rank, reason));
        }
        drop(st);
        self.cv.notify_all();
    }

    /// Marks `rank` as finished: collectives that wait for it abort instead of timing out.
    pub fn exit(&self, rank: usize) {
        let mut st = self.lock();
        if let Some(e) = st.exited.get_mut(rank) {
            *e = true;
        }
        drop(st);
        self.cv.notify_all();
    }
}

/// One rank's handle on a [`ThreadWorld`].
#[derive(Debug, Clone)]
pub struct ThreadComm {
    world: Arc<ThreadWorld>,
    rank: usize,
}

impl ThreadComm {
    fn my_index(&self, op: &str, group: &[usize]) -> Result<usize> {
        group.iter().position(|&r| r == self.rank).ok_or_else(|| Error::BufferMismatch {
            op: op.to_string(),
            reason: format!("rank {} is not a member of group {group:?}", self.rank),
        })
    }

    /// The rendezvous. `body` runs once every member has published its buffers; it gets
    /// every member's buffers and this rank's index. The call returns after every member
    /// has finished its body.
    fn rendezvous<R>(
        &self,
        op: &'static str,
        group: &[usize],
        mine: Bufs,
        body: impl FnOnce(&[Bufs], usize) -> Result<R>,
    ) -> Result<R> {
        let me = self.my_index(op, group)?;
        let n = group.len();
        let w = &*self.world;
        let deadline = Instant::now() + w.timeout;
        let mut st = w.lock();
        // Wait until the previous use of this group has drained.
        loop {
            check_alive(&st, self.rank, group)?;
            let slot = st.slots.entry(group.to_vec()).or_default();
            if slot.departed == 0 && slot.arrived < n {
                break;
            }
            st = wait(w, st, deadline, op, group, self.rank)?;
        }
        let slot = st.slots.get_mut(group).expect("slot inserted above");
        if slot.bufs.len() != n {
            slot.bufs = vec![Bufs::default(); n];
            slot.op = vec![""; n];
        }
        slot.bufs[me] = mine;
        slot.op[me] = op;
        slot.arrived += 1;
        let generation = slot.generation;
        if slot.arrived == n {
            w.cv.notify_all();
        }
        // Wait for every member to arrive.
        loop {
            let slot = &st.slots[group];
            if slot.generation != generation || slot.arrived == n {
                break;
            }
            let alive = check_alive(&st, self.rank, group);
            let res = alive.and_then(|_| {
                if Instant::now() >= deadline {
                    Err(Error::CollectiveTimeout {
                        op: op.into(),
                        group: group.to_vec(),
                        rank: self.rank,
                        timeout_ms: w.timeout.as_millis() as u64,
                    })
                } else {
                    Ok(())
                }
            });
            if let Err(e) = res {
                // Withdraw: nobody has read our pointers, since not everyone arrived.
                let slot = st.slots.get_mut(group).expect("slot exists");
                slot.arrived -= 1;
                slot.bufs[me] = Bufs::default();
                return Err(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            st = w.cv.wait_timeout(st, left.min(Duration::from_millis(200))).unwrap_or_else(|e| e.into_inner()).0;
        }
        let slot = &st.slots[group];
        let bufs = slot.bufs.clone();
        let mismatch = slot.op.iter().enumerate().find(|(_, o)| **o != op).map(|(i, o)| (i, *o));
        drop(st);

        let result = match mismatch {
            Some((i, other)) => Err(Error::BufferMismatch {
                op: op.into(),
                reason: format!("rank {} called `{other}` while rank {} called `{op}`", group[i], self.rank),
            }),
            None => body(&bufs, me),
        };

        // Depart: wait until every member has finished reading (bounded: bodies only copy).
        let mut st = w.lock();
        let slot = st.slots.get_mut(group).expect("slot exists");
        slot.departed += 1;
        if slot.departed == n {
            slot.departed = 0;
            slot.arrived = 0;
            slot.generation += 1;
            w.cv.notify_all();
        } else {
            while st.slots[group].generation == generation {
                st = w.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
        result
    }
}

fn check_alive(st: &State, rank: usize, group: &[usize]) -> Result<()> {
    if let Some((failed_rank, reason)) = &st.failed {
        return Err(Error::PeerFailed { rank, failed_rank: *failed_rank, reason: reason.clone() });
    }
    if let Some(&gone) = group.iter().find(|&&r| r != rank && st.exited.get(r).copied().unwrap_or(false)) {
        return Err(Error::PeerFailed {
            rank,
            failed_rank: gone,
            reason: "it returned from its closure while this rank still waits in a collective".into(),
        });
    }
    Ok(())
}

fn wait<'a>(
    w: &'a ThreadWorld,
    st: MutexGuard<'a, State>,
    deadline: Instant,
    op: &str,
    group: &[usize],
    rank: usize,
) -> Result<MutexGuard<'a, State>> {
    let now = Instant::now();
    if now >= deadline {
        return Err(Error::CollectiveTimeout {
            op: op.into(),
            group: group.to_vec(),
            rank,
            timeout_ms: w.timeout.as_millis() as u64,
        });
    }
    let left = (deadline - now).min(Duration::from_millis(200));
    Ok(w.cv.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0)
}

/// Reads a peer's published send buffer.
///
/// SAFETY: the pointer was published by a member that is blocked in the same rendezvous
/// until every member has departed, and it only reads its own send buffer meanwhile.
unsafe fn peer_send<'a>(b: &Bufs) -> &'a [u8] {
    if b.send_len == 0 {
        return &[];
    }
    std::slice::from_raw_parts(b.send as *const u8, b.send_len)
}

/// Reads a peer's published receive buffer (only regions that nobody writes in that phase).
unsafe fn peer_recv<'a>(b: &Bufs) -> &'a [u8] {
    if b.recv_len == 0 {
        return &[];
    }
    std::slice::from_raw_parts(b.recv as *const u8, b.recv_len)
}

fn bufs(send: &[u8], recv: &mut [u8]) -> Bufs {
    Bufs { send: send.as_ptr() as usize, send_len: send.len(), recv: recv.as_mut_ptr() as usize, recv_len: recv.len() }
}

fn size_err(op: &str, reason: String) -> Error {
    Error::BufferMismatch { op: op.into(), reason }
}

fn same_len(op: &str, all: &[Bufs], group: &[usize]) -> Result<usize> {
    let l = all[0].send_len;
    if let Some(i) = all.iter().position(|b| b.send_len != l) {
        return Err(size_err(
            op,
            format!("rank {} sent {} bytes but rank {} sent {l}", group[i], all[i].send_len, group[0]),
        ));
    }
    Ok(l)
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world.size
    }
    fn backend(&self) -> &'static str {
        "threads"
    }

    fn all_gather(&self, group: &[usize], send: &[u8], recv: &mut [u8]) -> Result<()> {
        let n = group.len();
        if recv.len() != send.len() * n {
            return Err(size_err(
                "all_gather",
                format!("recv has {} bytes, expected {n} x {}", recv.len(), send.len()),
            ));
        }
        let mine = bufs(send, recv);
        self.rendezvous("all_gather", group, mine, |all, _| {
            let l = same_len("all_gather", all, group)?;
            for (j, b) in all.iter().enumerate() {
                // SAFETY: see `peer_send`.
                recv[j * l..(j + 1) * l].copy_from_slice(unsafe { peer_send(b) });
            }
            Ok(())
        })
    }

    fn all_reduce(&self, group: &[usize], buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        let n = group.len();
        let es = dtype.size_of();
        if !buf.len().is_multiple_of(es) {
            return Err(size_err("all_reduce", format!("{} bytes is not a whole number of {dtype}", buf.len())));
        }
        let elems = buf.len() / es;
        // Member i reduces element range i of everyone's buffer in place (nobody else reads
        // range i of member i's buffer in this phase), then everyone copies the other ranges
        // from their owners. One member computes each range, so the result is bit-identical
        // on every member.
        let range = |i: usize| {
            let (sz, off) = crate::layout::chunk_size_and_offset(elems, n, i);
            off * es..(off + sz) * es
        };
        let ptr = buf.as_mut_ptr() as usize;
        let len = buf.len();
        let mine = Bufs { send: ptr, send_len: len, recv: ptr, recv_len: len };
        self.rendezvous("all_reduce", group, mine, |all, me| {
            same_len("all_reduce", all, group)?;
            let r = range(me);
            // SAFETY: our own buffer; in this phase we alone touch its range `r`, and peers only
            // read their own ranges of it.
            let acc = unsafe { &mut std::slice::from_raw_parts_mut(ptr as *mut u8, len)[r.clone()] };
            for (j, b) in all.iter().enumerate() {
                if j != me {
                    // SAFETY: range `r` of a peer's buffer is only written by that peer in phase 2.
                    reduce::accumulate(dtype, op, acc, &unsafe { peer_send(b) }[r.clone()])?;
                }
            }
            reduce::finish(dtype, op, acc, n);
            Ok(())
        })?;
        let ptr = buf.as_mut_ptr() as usize;
        let mine = Bufs { send: ptr, send_len: buf.len(), recv: ptr, recv_len: buf.len() };
        self.rendezvous("all_reduce", group, mine, |all, me| {
            for (j, b) in all.iter().enumerate() {
                if j != me {
                    let r = range(j);
                    // SAFETY: range j of member j's buffer is written by nobody in this phase.
                    let src = unsafe { &peer_recv(b)[r.clone()] };
                    // SAFETY: `ptr` is our own buffer; we write only ranges we do not own.
                    let dst = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, all[me].recv_len) };
                    dst[r].copy_from_slice(src);
                }
            }
            Ok(())
        })
    }

    fn reduce_scatter(&self, group: &[usize], send: &[u8], recv: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        let n = group.len();
        if send.len() != recv.len() * n {
            return Err(size_err(
                "reduce_scatter",
                format!("send has {} bytes, expected {n} x {}", send.len(), recv.len()),
            ));
        }
        let l = recv.len();
        let mine = bufs(send, recv);
        self.rendezvous("reduce_scatter", group, mine, |all, me| {
            same_len("reduce_scatter", all, group)?;
            let r = me * l..(me + 1) * l;
            recv.copy_from_slice(&unsafe { peer_send(&all[0]) }[r.clone()]);
            for b in &all[1..] {
                reduce::accumulate(dtype, op, recv, &unsafe { peer_send(b) }[r.clone()])?;
            }
            reduce::finish(dtype, op, recv, n);
            Ok(())
        })
    }

    fn all_to_all(&self, group: &[usize], send: &[u8], recv: &mut [u8]) -> Result<()> {
        let n = group.len();
        if send.len() != recv.len() || !send.len().is_multiple_of(n) {
            return Err(size_err(
                "all_to_all",
                format!("send ({}) and recv ({}) must be equal and divisible by {n}", send.len(), recv.len()),
            ));
        }
        let l = send.len() / n;
        let mine = bufs(send, recv);
        self.rendezvous("all_to_all", group, mine, |all, me| {
            same_len("all_to_all", all, group)?;
            for (j, b) in all.iter().enumerate() {
                recv[j * l..(j + 1) * l].copy_from_slice(&unsafe { peer_send(b) }[me * l..(me + 1) * l]);
            }
            Ok(())
        })
    }

    fn broadcast(&self, group: &[usize], buf: &mut [u8], root: usize) -> Result<()> {
        if root >= group.len() {
            return Err(Error::RankOutOfRange { rank: root, world_size: group.len() });
        }
        let ptr = buf.as_mut_ptr() as usize;
        let mine = Bufs { send: ptr, send_len: buf.len(), recv: ptr, recv_len: buf.len() };
        self.rendezvous("broadcast", group, mine, |all, me| {
            same_len("broadcast", all, group)?;
            if me != root {
                let src = unsafe { peer_send(&all[root]) };
                // SAFETY: our own buffer; the root only reads its own.
                let dst = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, all[me].recv_len) };
                dst.copy_from_slice(src);
            }
            Ok(())
        })
    }

    fn scatter(&self, group: &[usize], send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        let n = group.len();
        if root >= n {
            return Err(Error::RankOutOfRange { rank: root, world_size: n });
        }
        let me = self.my_index("scatter", group)?;
        if me == root && send.len() != recv.len() * n {
            return Err(size_err(
                "scatter",
                format!("root send has {} bytes, expected {n} x {}", send.len(), recv.len()),
            ));
        }
        let l = recv.len();
        let mine = bufs(send, recv);
        self.rendezvous("scatter", group, mine, |all, me| {
            let src = unsafe { peer_send(&all[root]) };
            if src.len() != l * n {
                return Err(size_err("scatter", format!("root sent {} bytes, rank expects {n} x {l}", src.len())));
            }
            recv.copy_from_slice(&src[me * l..(me + 1) * l]);
            Ok(())
        })
    }

    fn barrier(&self, group: &[usize]) -> Result<()> {
        self.rendezvous("barrier", group, Bufs::default(), |_, _| Ok(()))
    }
}
