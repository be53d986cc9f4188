//! The rendezvous of one group: the synchronisation every thread-backend collective is built on.
//!
//! A [`Slot`] serves one group (one list of ranks) for the life of the world. A collective on
//! it is two phases of one counter word, `state = phase << 32 | parked << 31 | arrived`:
//!
//! 1. *arrival*: each member publishes its buffers in its own cell, then increments `arrived`
//!    (release). The member that makes it `n` starts phase `p + 1` with `arrived = 0`; the
//!    others wait for that phase (acquire), so every member then sees every cell.
//! 2. *departure*: each member copies what it needs out of its peers' buffers, then counts
//!    itself in `departed`. The last one clears every cell and starts phase `p + 2`; the others
//!    wait for it, so nobody returns (and frees its buffers) while a peer may still read them.
//!
//! A member is in at most one collective per slot at a time: [`Slot::enter`] claims its seat,
//! and a second thread of the same rank is refused instead of being counted twice. A member
//! that gives up during arrival (timeout, failed peer) withdraws with a compare-and-swap that
//! only succeeds while the arrival is incomplete, so its buffers are never read after it left.
//!
//! Waiting spins briefly, then yields the core, then parks on a condition variable: a few-byte
//! collective completes in microseconds when every member runs, and a world with more ranks
//! than cores hands the cores over quickly instead of burning them. A waiter sets the `parked`
//! bit (under the condition variable's lock) before it sleeps, and starting a phase swaps the
//! word, so the member that starts it sees the bit and wakes the sleepers: both are
//! read-modify-writes of one atomic, so no wake-up is lost and nothing relies on `SeqCst`.

use super::sync::{spin_hint, yield_now, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

/// Buffers one member published, as integers (pointers and lengths), plus a tag naming the
/// collective it called, a layout parameter (`extra`) and the other arguments every member
/// must pass alike (`args`: element type, reduction, root, packed by `check::Args`).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Bufs {
    pub send: usize,
    pub send_len: usize,
    pub recv: usize,
    pub recv_len: usize,
    pub tag: usize,
    pub extra: usize,
    pub args: usize,
}

/// One member's published buffers; written only by that member, read by all after arrival.
#[derive(Default)]
struct Cell {
    send: AtomicUsize,
    send_len: AtomicUsize,
    recv: AtomicUsize,
    recv_len: AtomicUsize,
    tag: AtomicUsize,
    extra: AtomicUsize,
    args: AtomicUsize,
}

impl Cell {
    fn store(&self, b: Bufs) {
        self.send.store(b.send, Relaxed);
        self.send_len.store(b.send_len, Relaxed);
        self.recv.store(b.recv, Relaxed);
        self.recv_len.store(b.recv_len, Relaxed);
        self.tag.store(b.tag, Relaxed);
        self.extra.store(b.extra, Relaxed);
        self.args.store(b.args, Relaxed);
    }
    fn load(&self) -> Bufs {
        Bufs {
            send: self.send.load(Relaxed),
            send_len: self.send_len.load(Relaxed),
            recv: self.recv.load(Relaxed),
            recv_len: self.recv_len.load(Relaxed),
            tag: self.tag.load(Relaxed),
            extra: self.extra.load(Relaxed),
            args: self.args.load(Relaxed),
        }
    }
}

const COUNT_BITS: u32 = 32;
/// Somebody sleeps on the condition variable waiting for the next phase.
const PARKED: u64 = 1 << (COUNT_BITS - 1);
const COUNT_MASK: u64 = PARKED - 1;
/// How long a parked waiter sleeps before it polls its give-up check again.
const PARK_SLICE: Duration = Duration::from_millis(20);
/// Spin iterations before yielding, when every member can have its own core.
const SPINS: u32 = if cfg!(loom) { 0 } else { 200 };
/// How long to keep yielding before parking.
const YIELD_FOR: Duration = Duration::from_micros(if cfg!(loom) { 0 } else { 200 });

fn phase(state: u64) -> u64 {
    state >> COUNT_BITS
}

/// The rendezvous state of one group (see the [module docs](self)).
pub(super) struct Slot {
    n: usize,
    spins: u32,
    state: AtomicU64,
    departed: AtomicUsize,
    seats: Vec<AtomicBool>,
    cells: Vec<Cell>,
    lock: Mutex<()>,
    cv: Condvar,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slot(n = {}, state = {:#x})", self.n, self.state.load(Relaxed))
    }
}

impl Slot {
    /// The slot of a group of `n` members (`n < 2^31`); `cores` decides whether spinning pays.
    pub fn new(n: usize, cores: usize) -> Slot {
        Slot {
            n,
            spins: if n <= cores { SPINS } else { 0 },
            state: AtomicU64::new(0),
            departed: AtomicUsize::new(0),
            seats: (0..n).map(|_| AtomicBool::new(false)).collect(),
            cells: (0..n).map(|_| Cell::default()).collect(),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Claims member `me`'s seat; `false` when that member is already inside a collective on
    /// this group (another thread of the same rank).
    pub fn enter(&self, me: usize) -> bool {
        !self.seats[me].swap(true, Acquire)
    }

    /// Frees member `me`'s seat (after [`depart`](Self::depart) or a withdrawal).
    pub fn leave(&self, me: usize) {
        self.seats[me].store(false, Release);
    }

    /// Publishes `mine` and waits until every member has arrived; returns the collective's
    /// phase and every member's buffers. When `give_up` fails while the arrival is still
    /// incomplete, this member withdraws (nobody will read its buffers) and the error is
    /// returned; once the arrival is complete the member is committed and waits it out.
    pub fn arrive<E>(
        &self,
        me: usize,
        mine: Bufs,
        give_up: &mut dyn FnMut() -> Result<(), E>,
    ) -> Result<(u64, Vec<Bufs>), E> {
        self.cells[me].store(mine);
        let prev = self.state.fetch_add(1, AcqRel);
        let p = phase(prev);
        if (prev & COUNT_MASK) as usize + 1 == self.n {
            self.advance(p + 1);
        } else if let Err(e) = self.wait_phase(p + 1, give_up) {
            if self.withdraw(me, p) {
                return Err(e);
            }
            // Everyone arrived meanwhile: peers are about to read our buffers.
            let _ = self.wait_phase::<()>(p + 1, &mut || Ok(()));
        }
        Ok((p, self.cells.iter().map(Cell::load).collect()))
    }

    /// Takes this member back out of an incomplete arrival of phase `p`; `false` when the
    /// arrival completed first.
    fn withdraw(&self, me: usize, p: u64) -> bool {
        let mut s = self.state.load(Acquire);
        loop {
            if phase(s) != p || (s & COUNT_MASK) as usize == self.n {
                return false;
            }
            match self.state.compare_exchange_weak(s, s - 1, AcqRel, Acquire) {
                Ok(_) => {
                    self.cells[me].store(Bufs::default());
                    return true;
                }
                Err(now) => s = now,
            }
        }
    }

    /// Counts this member out of the collective of phase `p` and waits until every member has
    /// finished reading. `give_up` may fail (a timeout): the wait still goes on until the peers
    /// are done with this member's buffers (they only copy, which ends), then the error is
    /// returned.
    pub fn depart<E>(&self, p: u64, give_up: &mut dyn FnMut() -> Result<(), E>) -> Result<(), E> {
        if self.departed.fetch_add(1, AcqRel) + 1 == self.n {
            self.departed.store(0, Relaxed);
            for c in &self.cells {
                c.store(Bufs::default());
            }
            self.advance(p + 2);
            return Ok(());
        }
        match self.wait_phase(p + 2, give_up) {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = self.wait_phase::<()>(p + 2, &mut || Ok(()));
                Err(e)
            }
        }
    }

    /// Starts `phase` (with no member arrived) and wakes the parked waiters.
    fn advance(&self, phase: u64) {
        if self.state.swap(phase << COUNT_BITS, AcqRel) & PARKED != 0 {
            // The sleeper set the bit under the lock and releases it only inside `wait`.
            drop(self.guard());
            self.cv.notify_all();
        }
    }

    /// Wakes every parked waiter so that it polls its give-up check now.
    pub fn wake(&self) {
        drop(self.guard());
        self.cv.notify_all();
    }

    fn guard(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reached(&self, target: u64) -> bool {
        phase(self.state.load(Acquire)) >= target
    }

    /// Waits until the phase reaches `target`: spins, yields, then parks; `give_up` is polled
    /// on the yielding and parked paths.
    fn wait_phase<E>(&self, target: u64, give_up: &mut dyn FnMut() -> Result<(), E>) -> Result<(), E> {
        for _ in 0..self.spins {
            if self.reached(target) {
                return Ok(());
            }
            spin_hint();
        }
        let start = Instant::now();
        loop {
            if self.reached(target) {
                return Ok(());
            }
            if start.elapsed() >= YIELD_FOR {
                break;
            }
            yield_now();
        }
        loop {
            if self.reached(target) {
                return Ok(());
            }
            give_up()?;
            let g = self.guard();
            let mut s = self.state.load(Acquire);
            while phase(s) < target {
                if s & PARKED == 0 {
                    if let Err(now) = self.state.compare_exchange_weak(s, s | PARKED, AcqRel, Acquire) {
                        s = now;
                        continue;
                    }
                }
                drop(self.cv.wait_timeout(g, PARK_SLICE).unwrap_or_else(|e| e.into_inner()).0);
                break;
            }
        }
    }
}
