//! Hostile use of the thread backend: several threads of one rank in collectives on the same
//! group at once, mismatched buffer sizes, timeouts, NaN in max/min reductions. Every case
//! must end in a correct result or a typed error, never a crash, an out-of-bounds write or a hang.

use dtensor_runtime::{Communicator, DType, Error, LocalWorld, ReduceOp, ThreadComm, ThreadWorld};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn f32s(b: &[u8]) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(b)
}

fn bytes(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// What a collective of the racing threads may legitimately end in.
fn ok_or_typed(r: &Result<(), Error>) {
    match r {
        Ok(())
        | Err(Error::ConcurrentCollective { .. })
        | Err(Error::BufferMismatch { .. })
        | Err(Error::CollectiveTimeout { .. }) => {}
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[test]
fn a_second_thread_of_a_rank_in_the_same_group_gets_a_typed_error() {
    let world = ThreadWorld::new(2, Duration::from_secs(30));
    let c0 = world.communicator(0).unwrap();
    let c0b = c0.clone();
    // Thread A of rank 0 waits in a barrier for rank 1 ...
    let a = std::thread::spawn(move || c0.barrier(&[0, 1]));
    std::thread::sleep(Duration::from_millis(100));
    // ... so thread B of rank 0 finds rank 0's seat taken, at once.
    let start = Instant::now();
    let mut buf = bytes(&[1.0; 4]);
    let e = c0b.all_reduce(&[0, 1], (&mut buf).into(), DType::F32, ReduceOp::Sum).unwrap_err();
    assert!(matches!(&e, Error::ConcurrentCollective { rank: 0, group, .. } if group == &[0, 1]), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(f32s(&buf), vec![1.0; 4], "the refused call must not touch its buffer");
    let e = c0b.broadcast(&[0, 1], (&mut buf).into(), 0).unwrap_err();
    assert!(matches!(e, Error::ConcurrentCollective { .. }), "{e}");
    // Rank 1 arrives: thread A completes normally, and the seat is free again afterwards.
    let c1 = world.communicator(1).unwrap();
    c1.barrier(&[0, 1]).unwrap();
    a.join().unwrap().unwrap();
    let h = std::thread::spawn(move || c1.barrier(&[0, 1]));
    c0b.barrier(&[0, 1]).unwrap();
    h.join().unwrap().unwrap();
}

/// Two threads of rank 0 race into `call` on the same group while rank 1 makes the call twice;
/// repeated so that every interleaving of entry and departure shows up.
fn race(rounds: usize, call: impl Fn(&ThreadComm, usize) -> Result<(), Error> + Sync) {
    for _ in 0..rounds {
        let world = ThreadWorld::new(2, Duration::from_millis(100));
        let c0 = world.communicator(0).unwrap();
        let c1 = world.communicator(1).unwrap();
        let start = Barrier::new(3);
        std::thread::scope(|s| {
            let a = s.spawn(|| {
                start.wait();
                call(&c0, 0)
            });
            let b = s.spawn(|| {
                start.wait();
                call(&c0, 1)
            });
            let peer = s.spawn(|| {
                start.wait();
                let first = call(&c1, 2);
                let second = call(&c1, 3);
                (first, second)
            });
            ok_or_typed(&a.join().unwrap());
            ok_or_typed(&b.join().unwrap());
            let (p1, p2) = peer.join().unwrap();
            ok_or_typed(&p1);
            ok_or_typed(&p2);
        });
    }
}

#[test]
fn racing_broadcasts_of_one_rank_never_write_out_of_bounds() {
    // Thread 0 of rank 0 broadcasts 4 floats, thread 1 of rank 0 4096 floats; rank 1 receives
    // into 4 floats then 4096. Whatever pairs up, a receiver writes only its own buffer's
    // length (the old rendezvous wrote another member's length into a 4-float slice).
    race(60, |c, who| {
        let len = if who % 2 == 0 { 4 } else { 4096 };
        // A guard word after the buffer catches writes past its end.
        let mut v = vec![who as f32; len + 1];
        v[len] = -7.0;
        let mut b = bytes(&v);
        let r = c.broadcast(&[0, 1], (&mut b[..len * 4]).into(), 0);
        let v = f32s(&b);
        assert_eq!(v[len], -7.0, "write past the end of the buffer");
        if r.is_ok() && who >= 2 {
            // Rank 1 received what a thread of rank 0 broadcast, of its own length.
            assert!(v[..len].iter().all(|&x| x == v[0]) && (v[0] == 0.0 || v[0] == 1.0), "{:?}", &v[..4]);
        }
        r
    });
}

#[test]
fn racing_all_reduces_of_one_rank_give_sums_or_typed_errors() {
    // Small (private copies) and large (split over the members) all-reduces, all racing.
    for len in [4usize, 40_000] {
        race(25, |c, who| {
            let mut v = vec![1.0f32; len + 1];
            v[len] = -7.0;
            let mut b = bytes(&v);
            let r = c.all_reduce(&[0, 1], (&mut b[..len * 4]).into(), DType::F32, ReduceOp::Sum);
            let v = f32s(&b);
            assert_eq!(v[len], -7.0, "write past the end of the buffer");
            if r.is_ok() {
                assert!(v[..len].iter().all(|&x| x == 2.0), "rank thread {who}: {:?}", &v[..4]);
            }
            r
        });
    }
}

#[test]
fn racing_all_gathers_of_different_sizes_are_typed_errors() {
    race(30, |c, who| {
        let l = if who % 2 == 0 { 8 } else { 800 };
        let mut recv = vec![0u8; 2 * l + 4];
        let r = c.all_gather(&[0, 1], (&vec![who as u8 + 1; l]).into(), (&mut recv[..2 * l]).into());
        assert_eq!(&recv[2 * l..], &[0, 0, 0, 0], "write past the end of the buffer");
        if r.is_ok() {
            assert!(recv[..l].iter().all(|&x| x == recv[0]) && recv[l..2 * l].iter().all(|&x| x == recv[l]));
        }
        r
    });
}

#[test]
fn zero_timeout_is_rejected() {
    let e = LocalWorld::new(2).timeout(Duration::ZERO).run(|_| Ok(())).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}

#[test]
fn max_and_min_reductions_propagate_nan_like_pytorch() {
    let out = LocalWorld::new(3)
        .run(|ctx| {
            let comm = ctx.comm();
            let g = [0, 1, 2];
            // Rank 1 holds a NaN in element 0; element 1 is finite everywhere.
            let mine = [if ctx.rank() == 1 { f32::NAN } else { ctx.rank() as f32 }, ctx.rank() as f32];
            let mut mx = bytes(&mine);
            comm.all_reduce(&g, (&mut mx).into(), DType::F32, ReduceOp::Max)?;
            let mut mn = bytes(&mine);
            comm.all_reduce(&g, (&mut mn).into(), DType::F32, ReduceOp::Min)?;
            // Large enough for the split path: NaN at one position on rank 2.
            let mut big = vec![ctx.rank() as f64; 20_000];
            if ctx.rank() == 2 {
                big[12_345] = f64::NAN;
            }
            let mut bb: Vec<u8> = bytemuck::cast_slice(&big).to_vec();
            comm.all_reduce(&g, (&mut bb).into(), DType::F64, ReduceOp::Max)?;
            let big: Vec<f64> = bytemuck::pod_collect_to_vec(&bb);
            let mut rs = vec![0u8; 8];
            let send = bytes(&[mine[0], mine[1], 1.0, 2.0, 3.0, 4.0]);
            comm.reduce_scatter(&g, (&send).into(), (&mut rs).into(), DType::F32, ReduceOp::Max)?;
            Ok((f32s(&mx), f32s(&mn), big[12_345].is_nan(), big[0], f32s(&rs)))
        })
        .unwrap();
    for (rank, (mx, mn, big_nan, big0, rs)) in out.into_iter().enumerate() {
        assert!(mx[0].is_nan() && mn[0].is_nan(), "rank {rank}: {mx:?} {mn:?}");
        assert_eq!((mx[1], mn[1]), (2.0, 0.0));
        assert!(big_nan);
        assert_eq!(big0, 2.0);
        if rank == 0 {
            assert!(rs[0].is_nan() && rs[1] == 2.0, "{rs:?}");
        } else {
            assert!(!rs[0].is_nan(), "{rs:?}");
        }
    }
}

#[test]
fn a_rank_outside_the_group_gets_not_in_group() {
    let world = ThreadWorld::new(3, Duration::from_secs(5));
    let c = world.communicator(2).unwrap();
    let e = c.barrier(&[0, 1]).unwrap_err();
    assert!(matches!(&e, Error::NotInGroup { rank: 2, group, .. } if group == &[0, 1]), "{e}");
    let e = c.barrier(&[2, 2]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let world: Arc<ThreadWorld> = ThreadWorld::new(1, Duration::from_secs(5));
    let e = world.communicator(0).unwrap().barrier(&[0, 3]).unwrap_err();
    assert!(matches!(e, Error::RankOutOfRange { rank: 3, world_size: 1 }), "{e}");
}

/// The split all-reduce (each member reduces its range block by block and writes it into every
/// member's output) against a sequential fold: every op, in place and into a separate output,
/// groups of 1–5 (uneven ranges), sizes around the block boundaries.
#[test]
fn large_all_reduces_equal_a_sequential_fold_on_every_member() {
    // Elements of 4 bytes: 16384 per 64 KiB block; ranges of one, several and partial blocks.
    for n in 1..=5usize {
        for len in [16_385usize, 3 * 16_384 + 7, 5 * 2 * 16_384 + 3] {
            let input = |rank: usize| -> Vec<f32> {
                // Small integers and halves: sums, maxima and products are exact in f32.
                (0..len).map(|i| [1.0, 2.0, 0.5, -1.0, 3.0][(i * 7 + rank * 3) % 5]).collect()
            };
            let inputs: Vec<Vec<f32>> = (0..n).map(input).collect();
            for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product] {
                let fold = |a: f32, b: f32| match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                    _ => a * b,
                };
                let want: Vec<f32> = (0..len)
                    .map(|i| {
                        let v = inputs[1..].iter().fold(inputs[0][i], |acc, x| fold(acc, x[i]));
                        if op == ReduceOp::Avg {
                            v / n as f32
                        } else {
                            v
                        }
                    })
                    .collect();
                let out = LocalWorld::new(n)
                    .run(|ctx| {
                        let comm = ctx.comm();
                        let g: Vec<usize> = (0..n).collect();
                        let send = bytes(&inputs[ctx.rank()]);
                        let mut in_place = send.clone();
                        comm.all_reduce(&g, (&mut in_place).into(), DType::F32, op)?;
                        let mut recv = vec![0xAAu8; send.len() + 4];
                        comm.all_reduce_into(&g, (&send).into(), (&mut recv[..send.len()]).into(), DType::F32, op)?;
                        assert_eq!(&recv[send.len()..], &[0xAA; 4], "write past the end of the output");
                        recv.truncate(send.len());
                        Ok((f32s(&in_place), f32s(&recv)))
                    })
                    .unwrap();
                for (rank, (a, b)) in out.iter().enumerate() {
                    assert!(a == &want && b == &want, "{n} ranks, {len} elements, {op:?}: rank {rank} differs");
                }
            }
        }
    }
}

/// The average of integers is refused by every member of a large (split) all-reduce alike,
/// in place and out of place, before anyone reduces a block.
#[test]
fn large_integer_averages_fail_on_every_member() {
    let outs = LocalWorld::new(3)
        .run(|ctx| {
            let comm = ctx.comm();
            let g = [0, 1, 2];
            let send = vec![7u8; 8 * 20_000];
            let mut in_place = send.clone();
            let a = comm.all_reduce(&g, (&mut in_place).into(), DType::I64, ReduceOp::Avg).unwrap_err();
            let mut recv = vec![0u8; send.len()];
            let b = comm
                .all_reduce_into(&g, (&send).into(), (&mut recv[..]).into(), DType::I64, ReduceOp::Avg)
                .unwrap_err();
            Ok((a, b))
        })
        .unwrap();
    for (a, b) in outs {
        for e in [a, b] {
            assert!(matches!(&e, Error::Unsupported { reason, .. } if reason.contains("i64")), "{e:?}");
        }
    }
}
