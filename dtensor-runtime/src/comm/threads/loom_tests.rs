//! Model checking of the rendezvous with `loom`: every interleaving (up to the preemption
//! bound) of small worlds. Each member's buffer is a loom `UnsafeCell`, so loom reports any
//! read of a peer's buffer that is not ordered after the owner's write, and any write of the
//! owner (its next collective, or freeing it) that is not ordered after every peer's read.
//!
//! Run (about 10 s in release mode, after a build of its own; the interleavings are printed;
//! `scripts/ci-extra.sh` runs it):
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p dtensor-runtime --lib --release loom -- --nocapture`

use super::rendezvous::{Bufs, Slot};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use std::sync::atomic::AtomicUsize as StdAtomicUsize;

/// One buffer per member; member `i` writes only its own, peers read it between arrival and
/// departure.
struct World {
    slot: Slot,
    bufs: Vec<UnsafeCell<u64>>,
}

fn world(n: usize) -> Arc<World> {
    Arc::new(World { slot: Slot::new(n, 1), bufs: (0..n).map(|_| UnsafeCell::new(0)).collect() })
}

fn value(member: usize, round: u64) -> u64 {
    member as u64 * 100 + round + 1
}

/// Member `me`'s part in `rounds` collectives: write its buffer, arrive, read every peer's
/// buffer, depart. Returns the values it read.
fn member(w: &World, me: usize, rounds: u64) -> Vec<u64> {
    let mut seen = Vec::new();
    for round in 0..rounds {
        w.bufs[me].with_mut(|p| unsafe { *p = value(me, round) });
        assert!(w.slot.enter(me));
        let mine = Bufs { send: value(me, round) as usize, ..Bufs::default() };
        let (p, all) = w.slot.arrive::<()>(me, mine, &mut || Ok(())).unwrap();
        for (j, b) in all.iter().enumerate() {
            assert_eq!(b.send as u64, value(j, round), "published buffers of round {round}");
            seen.push(w.bufs[j].with(|p| unsafe { *p }));
        }
        w.slot.depart::<()>(p, &mut || Ok(())).unwrap();
        w.slot.leave(me);
    }
    seen
}

fn run(name: &str, preemption_bound: usize, f: impl Fn() + Sync + Send + 'static) {
    static ITERATIONS: StdAtomicUsize = StdAtomicUsize::new(0);
    ITERATIONS.store(0, std::sync::atomic::Ordering::SeqCst);
    let start = std::time::Instant::now();
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemption_bound);
    b.check(move || {
        ITERATIONS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        f();
    });
    println!(
        "loom {name}: {} interleavings (preemption bound {preemption_bound}) in {:.1} s",
        ITERATIONS.load(std::sync::atomic::Ordering::SeqCst),
        start.elapsed().as_secs_f64()
    );
}

fn expected(n: usize, rounds: u64) -> Vec<u64> {
    (0..rounds).flat_map(|r| (0..n).map(move |j| value(j, r))).collect()
}

#[test]
fn loom_two_members_two_rounds() {
    run("2 members x 2 rounds", 3, || {
        let w = world(2);
        let w1 = Arc::clone(&w);
        let h = loom::thread::spawn(move || member(&w1, 1, 2));
        assert_eq!(member(&w, 0, 2), expected(2, 2));
        assert_eq!(h.join().unwrap(), expected(2, 2));
    });
}

#[test]
fn loom_three_members_one_round() {
    run("3 members x 1 round", 2, || {
        let w = world(3);
        let hs: Vec<_> = (1..3)
            .map(|i| {
                let w = Arc::clone(&w);
                loom::thread::spawn(move || member(&w, i, 1))
            })
            .collect();
        assert_eq!(member(&w, 0, 1), expected(3, 1));
        for h in hs {
            assert_eq!(h.join().unwrap(), expected(3, 1));
        }
    });
}

#[test]
fn loom_a_seat_admits_one_thread_of_a_member() {
    // Two threads of member 0 compete for its seat while member 1 runs one collective with
    // whichever wins; the loser takes no part (it would be counted twice otherwise).
    run("seat: 2 threads of member 0 + member 1", 3, || {
        let w = world(2);
        let won = Arc::new(AtomicBool::new(false));
        let contender = |w: Arc<World>, won: Arc<AtomicBool>| {
            move || {
                if !w.slot.enter(0) {
                    return;
                }
                if won.swap(true, Ordering::Relaxed) {
                    // The other thread already did member 0's collective; this one only holds
                    // the seat, exclusively.
                    w.bufs[0].with_mut(|p| unsafe { *p += 1000 });
                    w.slot.leave(0);
                    return;
                }
                w.bufs[0].with_mut(|p| unsafe { *p = value(0, 0) });
                let mine = Bufs { send: value(0, 0) as usize, ..Bufs::default() };
                let (p, all) = w.slot.arrive::<()>(0, mine, &mut || Ok(())).unwrap();
                assert_eq!(all[1].send as u64, value(1, 0));
                assert_eq!(w.bufs[1].with(|p| unsafe { *p }), value(1, 0));
                w.slot.depart::<()>(p, &mut || Ok(())).unwrap();
                w.slot.leave(0);
            }
        };
        let a = loom::thread::spawn(contender(Arc::clone(&w), Arc::clone(&won)));
        let b = loom::thread::spawn(contender(Arc::clone(&w), Arc::clone(&won)));
        // Member 1 runs one collective; it must pair with exactly one thread of member 0.
        w.bufs[1].with_mut(|p| unsafe { *p = value(1, 0) });
        assert!(w.slot.enter(1));
        let mine = Bufs { send: value(1, 0) as usize, ..Bufs::default() };
        let (p, all) = w.slot.arrive::<()>(1, mine, &mut || Ok(())).unwrap();
        assert_eq!(all[0].send as u64, value(0, 0));
        assert!(matches!(w.bufs[0].with(|p| unsafe { *p }), v if v == value(0, 0)));
        w.slot.depart::<()>(p, &mut || Ok(())).unwrap();
        w.slot.leave(1);
        a.join().unwrap();
        b.join().unwrap();
    });
}

#[test]
fn loom_withdrawal_races_the_last_arrival() {
    // Both members give up as soon as they would park: either both withdraw, or the arrival
    // completes first and both go through with the collective. A member that withdrew writes
    // its buffer at once, so loom flags any peer that still reads it.
    run("withdrawal vs last arrival", 3, || {
        let w = world(2);
        let go = |w: Arc<World>, me: usize| {
            move || {
                w.bufs[me].with_mut(|p| unsafe { *p = value(me, 0) });
                assert!(w.slot.enter(me));
                let mine = Bufs { send: value(me, 0) as usize, ..Bufs::default() };
                let r = w.slot.arrive(me, mine, &mut || Err(()));
                let ok = match r {
                    Ok((p, all)) => {
                        let peer = 1 - me;
                        assert_eq!(all[peer].send as u64, value(peer, 0));
                        assert_eq!(w.bufs[peer].with(|p| unsafe { *p }), value(peer, 0));
                        w.slot.depart::<()>(p, &mut || Ok(())).unwrap();
                        true
                    }
                    Err(()) => false,
                };
                w.slot.leave(me);
                // The buffer is ours again (freed, reused): no peer may read it now.
                w.bufs[me].with_mut(|p| unsafe { *p = 0 });
                ok
            }
        };
        let h = loom::thread::spawn(go(Arc::clone(&w), 1));
        let a = go(Arc::clone(&w), 0)();
        let b = h.join().unwrap();
        assert_eq!(a, b, "one member went through while the other withdrew");
    });
}
