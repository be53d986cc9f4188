//! The embedded backend never hangs when a rank fails: peers get an error.

use dtensor_runtime::{run, Along, Communicator, DType, Error, LocalWorld, ReduceOp, ThreadWorld};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn failing_rank_poisons_pending_collectives() {
    let start = Instant::now();
    let err = LocalWorld::new(4)
        .timeout(Duration::from_secs(60))
        .run(|ctx| {
            let mesh = ctx.init_device_mesh(&[4], &["x"])?;
            if ctx.rank() == 2 {
                return Err(Error::InvalidArgument { context: "test".into(), reason: "rank 2 gives up".into() });
            }
            mesh.all_gather(Along::All, &[1.0f32; 4])?;
            Ok(())
        })
        .unwrap_err();
    // The root cause is reported, not the PeerFailed errors it caused, and nobody waited
    // for the 60 s timeout.
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn panicking_rank_is_reported_and_peers_abort() {
    let start = Instant::now();
    let err = LocalWorld::new(3)
        .timeout(Duration::from_secs(60))
        .run(|ctx| {
            let mesh = ctx.init_device_mesh(&[3], &["x"])?;
            if ctx.rank() == 1 {
                panic!("boom on rank 1");
            }
            let mut v = [1.0f64; 8];
            mesh.all_reduce(Along::All, &mut v, ReduceOp::Sum)?;
            Ok(())
        })
        .unwrap_err();
    match err {
        Error::RankPanicked { rank, message } => {
            assert_eq!(rank, 1);
            assert!(message.contains("boom"));
        }
        e => panic!("unexpected {e}"),
    }
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn peers_see_peer_failed() {
    // Look at what the surviving ranks got.
    let world = ThreadWorld::new(2, Duration::from_secs(30));
    let w1 = Arc::clone(&world);
    let h = std::thread::spawn(move || {
        let c = w1.communicator(1).unwrap();
        let mut buf = [0u8; 8];
        c.all_gather(&[0, 1], (&[1, 2, 3, 4]).into(), (&mut buf).into())
    });
    std::thread::sleep(Duration::from_millis(50));
    world.fail(0, "rank 0 died".into());
    match h.join().unwrap() {
        Err(Error::PeerFailed { rank: 1, failed_rank: 0, reason }) => assert!(reason.contains("died")),
        r => panic!("unexpected {r:?}"),
    }
}

#[test]
fn a_rank_that_never_arrives_times_out() {
    let start = Instant::now();
    let errs = LocalWorld::new(2)
        .timeout(Duration::from_millis(200))
        .run(|ctx| {
            let mesh = ctx.init_device_mesh(&[2], &["x"])?;
            if ctx.rank() == 1 {
                std::thread::sleep(Duration::from_millis(800));
            }
            mesh.barrier(Along::All)?;
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(errs, Error::CollectiveTimeout { rank: 0, timeout_ms: 200, .. }), "{errs}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn rank_that_returned_early_does_not_hang_peers() {
    let err = LocalWorld::new(2)
        .timeout(Duration::from_secs(60))
        .run(|ctx| {
            let mesh = ctx.init_device_mesh(&[2], &["x"])?;
            if ctx.rank() == 0 {
                return Ok(());
            }
            mesh.barrier(Along::All)
        })
        .unwrap_err();
    assert!(matches!(err, Error::PeerFailed { rank: 1, failed_rank: 0, .. }), "{err}");
}

#[test]
fn mismatched_collectives_and_sizes_are_errors() {
    let err = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        if ctx.rank() == 0 {
            mesh.all_gather(Along::All, &[1.0f32; 2])?;
        } else {
            mesh.all_gather(Along::All, &[1.0f32; 3])?;
        }
        Ok(())
    })
    .unwrap_err();
    assert!(matches!(&err, Error::BufferMismatch { op, .. } if op == "all_gather"), "{err}");

    let err = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        if ctx.rank() == 0 {
            mesh.barrier(Along::All)?;
        } else {
            mesh.all_gather(Along::All, &[1.0f32; 3])?;
        }
        Ok(())
    })
    .unwrap_err();
    assert!(err.to_string().contains("called"), "{err}");

    // Wrong buffer sizes are caught before any rendezvous.
    let world = ThreadWorld::new(1, Duration::from_secs(1));
    let c = world.communicator(0).unwrap();
    let mut small = [0u8; 2];
    assert!(matches!(
        c.all_gather(&[0], (&[1, 2, 3, 4]).into(), (&mut small).into()),
        Err(Error::BufferMismatch { .. })
    ));
    assert!(matches!(
        c.all_reduce(&[0], (&mut [0u8; 3]).into(), DType::F32, ReduceOp::Sum),
        Err(Error::BufferMismatch { .. })
    ));
    assert!(matches!(c.broadcast(&[0], (&mut [0u8; 4]).into(), 3), Err(Error::RankOutOfRange { .. })));
    assert!(matches!(c.barrier(&[5]), Err(Error::NotInGroup { rank: 0, .. })));
    assert!(matches!(world.communicator(7), Err(Error::RankOutOfRange { rank: 7, world_size: 1 })));
    assert!(matches!(LocalWorld::new(0).run(|_| Ok(())), Err(Error::InvalidArgument { .. })));
}

#[test]
fn every_collective_matches_its_definition() {
    for n in [1usize, 2, 3, 5] {
        let out = run(n, |ctx| {
            let mesh = ctx.init_device_mesh(&[n], &["x"])?;
            let r = ctx.rank() as f64;
            let send: Vec<f64> = (0..2 * n).map(|i| r * 100.0 + i as f64).collect();
            let gathered = mesh.all_gather(Along::All, &send[..2])?;
            let mut summed = send.clone();
            mesh.all_reduce(Along::All, &mut summed, ReduceOp::Sum)?;
            let mut maxed = send.clone();
            mesh.all_reduce(Along::All, &mut maxed, ReduceOp::Max)?;
            let mut avg = send.clone();
            mesh.all_reduce(Along::All, &mut avg, ReduceOp::Avg)?;
            let mut prod = send.clone();
            mesh.all_reduce(Along::All, &mut prod, ReduceOp::Product)?;
            let mut min = send.clone();
            mesh.all_reduce(Along::All, &mut min, ReduceOp::Min)?;
            let rs = mesh.reduce_scatter(Along::All, &send, ReduceOp::Sum)?;
            let a2a = mesh.all_to_all(Along::All, &send)?;
            let mut b = send.clone();
            mesh.broadcast(Along::All, &mut b, n - 1)?;
            let sc = mesh.scatter(Along::All, &send, 2, 0)?;
            Ok((gathered, summed, maxed, avg, prod, min, rs, a2a, b, sc))
        })
        .unwrap();
        let send = |r: usize| -> Vec<f64> { (0..2 * n).map(|i| r as f64 * 100.0 + i as f64).collect() };
        for (me, (g, s, mx, avg, prod, mn, rs, a2a, b, sc)) in out.into_iter().enumerate() {
            let want_g: Vec<f64> = (0..n).flat_map(|r| send(r)[..2].to_vec()).collect();
            assert_eq!(g, want_g);
            for i in 0..2 * n {
                let col: Vec<f64> = (0..n).map(|r| send(r)[i]).collect();
                assert_eq!(s[i], col.iter().sum::<f64>());
                assert_eq!(mx[i], col.iter().cloned().fold(f64::MIN, f64::max));
                assert_eq!(mn[i], col.iter().cloned().fold(f64::MAX, f64::min));
                assert!((avg[i] - col.iter().sum::<f64>() / n as f64).abs() < 1e-9);
                assert_eq!(prod[i], col.iter().product::<f64>());
            }
            assert_eq!(rs, s[2 * me..2 * me + 2].to_vec());
            let want_a2a: Vec<f64> = (0..n).flat_map(|r| send(r)[2 * me..2 * me + 2].to_vec()).collect();
            assert_eq!(a2a, want_a2a);
            assert_eq!(b, send(n - 1));
            assert_eq!(sc, send(0)[2 * me..2 * me + 2].to_vec());
        }
    }
}
