//! `ThreadComm::rendezvous` under the `*_buf` tags of the `cuda-threads` device path, checked on
//! the host: its own tags against the host collectives, and departure only after every
//! member's body has returned.

use super::{Bufs, ThreadWorld};
use crate::comm::Communicator;
use crate::error::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn world(n: usize) -> Arc<ThreadWorld> {
    ThreadWorld::new(n, Duration::from_secs(10))
}

/// A member in a device collective and one in a host all-gather whose 24-byte send could be
/// read as a device record both get a `BufferMismatch` naming both calls, and nothing is copied.
#[test]
fn device_and_host_collectives_never_match() {
    let w = world(2);
    let (c0, c1) = (w.communicator(0).unwrap(), w.communicator(1).unwrap());
    let t = std::thread::spawn(move || {
        let mut recv = [7u8; 48];
        let r = c1.all_gather(&[0, 1], (&[1u8; 24]).into(), (&mut recv[..]).into());
        (r, recv)
    });
    let ran = AtomicBool::new(false);
    let mine = Bufs { send: 0x1000, send_len: 24, ..Bufs::default() };
    let r0 = c0.rendezvous("all_gather_buf", &[0, 1], mine, |_, _| {
        ran.store(true, Ordering::SeqCst);
        Ok(())
    });
    let (r1, recv) = t.join().unwrap();
    for r in [r0, r1] {
        match r {
            Err(Error::BufferMismatch { reason, .. }) => {
                assert!(reason.contains("all_gather_buf") && reason.contains("`all_gather`"), "{reason}")
            }
            other => panic!("expected BufferMismatch, got {other:?}"),
        }
    }
    assert!(!ran.load(Ordering::SeqCst), "the body ran although the tags differ");
    assert_eq!(recv, [7u8; 48], "the host all-gather wrote its output");
}

/// Every member sees every member's record, in group order; a member whose body fails at once
/// still returns only after the slow member's body has returned (so what its record points to
/// outlives every peer's use of it), and only it reports the error.
#[test]
fn members_leave_only_after_every_body_returned() {
    let w = world(3);
    let done = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..3)
        .map(|rank| {
            let c = w.communicator(rank).unwrap();
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                let mine = Bufs { send: 100 + rank, send_len: rank, ..Bufs::default() };
                let r = c.rendezvous("all_reduce_buf", &[0, 1, 2], mine, |all, me| {
                    assert_eq!(me, rank);
                    let seen: Vec<(usize, usize)> = all.iter().map(|b| (b.send, b.send_len)).collect();
                    assert_eq!(seen, [(100, 0), (101, 1), (102, 2)]);
                    match rank {
                        0 => {
                            std::thread::sleep(Duration::from_millis(200));
                            done.store(true, Ordering::SeqCst);
                            Ok(())
                        }
                        1 => Err(Error::Unsupported { op: "test".into(), reason: "rank 1 fails in its body".into() }),
                        _ => Ok(()),
                    }
                });
                (r, done.load(Ordering::SeqCst))
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let (r, slow_body_done) = h.join().unwrap();
        assert!(slow_body_done, "rank {rank} left before rank 0's body returned");
        assert_eq!(r.is_err(), rank == 1, "rank {rank}: {r:?}");
    }
}
