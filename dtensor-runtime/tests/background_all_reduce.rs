//! `DeviceMesh::all_reduce_start`: an all-reduce that runs in the background (the thread
//! backend's per-rank worker). Its result must equal the blocking all-reduce's, bit for bit,
//! for every dtype, op and size; a later collective on the same group must not overtake it;
//! collectives on other groups run alongside; bad input and failed peers end in typed errors,
//! never a hang.

use dtensor_runtime::{bf16, run, Along, DType, DeviceMesh, Error, LocalWorld, ReduceOp, Result, Scalar};
use std::time::{Duration, Instant};

/// Rank `r`'s input of `n` elements (distinct per rank and element, NaN-free).
fn input<T: Scalar>(r: usize, n: usize) -> Vec<T> {
    (0..n).map(|i| T::of_f64((((r * 7919 + i * 104729) % 2003) as f64 - 1000.0) / 64.0)).collect()
}

fn started_equals_blocking<T: Scalar>(ops: &[ReduceOp]) {
    // Sizes across the thread backend's 64 KiB reduction blocks, an empty one, and one
    // element (fewer elements than members).
    let sizes = [0, 1, 5, 16_384, 40_001];
    for &op in ops {
        let out = run(6, |ctx| {
            let mesh = ctx.init_device_mesh(&[2, 3], &["dp", "tp"])?;
            let mut got = Vec::new();
            for dim in 0..2 {
                for &n in &sizes {
                    let mut want = input::<T>(ctx.rank(), n);
                    mesh.all_reduce(Along::Dim(dim), &mut want, op)?;
                    let started = mesh.all_reduce_start(Along::Dim(dim), input::<T>(ctx.rank(), n), op)?.wait()?;
                    got.push((dim, n, started == want));
                }
            }
            Ok(got)
        })
        .unwrap();
        for (rank, got) in out.iter().enumerate() {
            for (dim, n, same) in got {
                assert!(same, "{} {op:?} rank {rank} dim {dim} n {n}: started ≠ blocking", T::DTYPE);
            }
        }
    }
}

#[test]
fn a_started_all_reduce_equals_the_blocking_one_for_every_dtype_and_op() {
    let float_ops = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product];
    started_equals_blocking::<f32>(&float_ops);
    started_equals_blocking::<f64>(&float_ops);
    started_equals_blocking::<bf16>(&float_ops);
    started_equals_blocking::<i64>(&[ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min]);
}

/// Sum over the members of `mesh`'s group along `dim` of `input(r, n)`.
fn expected(mesh: &DeviceMesh, dim: usize, n: usize, salt: usize) -> Vec<f64> {
    let mut sum = vec![0.0; n];
    for &r in mesh.group(dim) {
        for (s, v) in sum.iter_mut().zip(input::<f64>(r + salt, n)) {
            *s += v;
        }
    }
    sum
}

#[test]
fn later_collectives_on_the_group_wait_and_other_groups_run_alongside() {
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let r = ctx.rank();
        let n = 50_000;
        // Two started on dp, one on tp; a blocking dp all-reduce in between; waits in reverse.
        let a = mesh.all_reduce_start(Along::Dim(0), input::<f64>(r, n), ReduceOp::Sum)?;
        let b = mesh.all_reduce_start(Along::Dim(0), input::<f64>(r + 10, n), ReduceOp::Sum)?;
        let mut c = input::<f64>(r + 20, n);
        mesh.all_reduce(Along::Dim(0), &mut c, ReduceOp::Sum)?;
        let d = mesh.all_reduce_start(Along::Dim(1), input::<f64>(r + 30, n), ReduceOp::Sum)?;
        let mut e = input::<f64>(r + 40, n);
        mesh.all_reduce(Along::Dim(1), &mut e, ReduceOp::Sum)?;
        // A dropped one is still completed before the next dp collective.
        drop(mesh.all_reduce_start(Along::Dim(0), input::<f64>(r + 50, n), ReduceOp::Sum)?);
        let mut f = input::<f64>(r + 60, n);
        mesh.all_reduce(Along::Dim(0), &mut f, ReduceOp::Sum)?;
        let (d, b, a) = (d.wait()?, b.wait()?, a.wait()?);
        let want = [(0, 0), (0, 10), (0, 20), (1, 30), (1, 40), (0, 60)].map(|(dim, s)| expected(&mesh, dim, n, s));
        let got = [a, b, c, d, e, f];
        Ok(got.iter().zip(&want).map(|(g, w)| g.iter().zip(w).all(|(x, y)| (x - y).abs() < 1e-9)).collect::<Vec<_>>())
    })
    .unwrap();
    for (rank, ok) in out.iter().enumerate() {
        assert!(ok.iter().all(|&b| b), "rank {rank}: {ok:?} (a, b, c, d, e, f)");
    }
}

#[test]
fn an_unsupported_reduction_fails_at_start_on_every_rank() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        Ok(mesh.all_reduce_start(Along::Dim(0), vec![1i64; 3], ReduceOp::Avg).map(|_| ()))
    })
    .unwrap();
    for r in out {
        assert!(matches!(r, Err(Error::Unsupported { .. })), "{r:?}");
    }
    let e = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        mesh.all_reduce_start(Along::Dim(3), vec![1.0f32; 3], ReduceOp::Sum).map(|_| ())
    })
    .unwrap_err();
    assert!(matches!(e, Error::MeshDimOutOfRange { .. }), "{e}");
}

#[test]
fn a_failed_peer_ends_the_wait_with_a_typed_error_not_a_hang() {
    let timeout = Duration::from_secs(20);
    let t0 = Instant::now();
    let r: Result<Vec<()>> = LocalWorld::new(2).timeout(timeout).run(|ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        if ctx.rank() == 1 {
            return Err(Error::InvalidArgument { context: "test".into(), reason: "rank 1 gives up".into() });
        }
        let p = mesh.all_reduce_start(Along::Dim(0), vec![1.0f32; 1000], ReduceOp::Sum)?;
        match p.wait() {
            Err(Error::PeerFailed { .. }) => Ok(()),
            other => panic!("rank 0 expected PeerFailed, got {other:?}"),
        }
    });
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    assert!(t0.elapsed() < timeout, "took {:?}: waited for the timeout instead of the failure", t0.elapsed());
}

#[test]
fn results_come_back_in_the_dtype_they_went_in() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        let p = mesh.all_reduce_start(Along::Dim(0), vec![bf16::from_f32(1.5); 4], ReduceOp::Sum)?;
        Ok(p.wait()?.iter().map(|v| v.to_f32()).collect::<Vec<_>>())
    })
    .unwrap();
    assert_eq!(out, vec![vec![3.0f32; 4]; 2]);
    assert_eq!(DType::BF16, <bf16 as Scalar>::DTYPE);
}

// ----------------------------------------------------------------------------------------
// `Communicator::all_reduce_start` on owned buffers that are not one host block (as device
// memory is; issue 32: the started collective takes device buffers).

use dtensor_runtime::comm::pending::{reduce_now, OwnedBytes};
use dtensor_runtime::comm::{Buf, BufMut};
use dtensor_runtime::{Communicator, ThreadWorld};
use std::any::Any;

/// Owned bytes that are not one host block (as device memory is): a started all-reduce
/// must reduce them through [`OwnedBytes::replace_by`] and the communicator's
/// out-of-place `all_reduce_into` on buffers, never ask for a host block (issue 32: the started collective takes
/// device buffers; the thread backend reduces them at once, staged through the host).
struct NotHost(Vec<f32>);

impl OwnedBytes for NotHost {
    fn host_mut(&mut self) -> Option<&mut [u8]> {
        None
    }
    fn replace_by(&mut self, run: &mut dyn FnMut(Buf<'_>, BufMut<'_>) -> Result<()>) -> Result<()> {
        self.0.replace_by(run)
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Rank `r`'s values: uneven, so a wrong order or a missed rank shows.
fn values(r: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| (r * 7 + i) as f32 * 0.25 - 1.0).collect()
}

/// A started all-reduce of host bytes and of non-host bytes both give the blocking
/// all-reduce's result, bit for bit, on the thread backend (whose worker runs host bytes)
/// and through the default (`pending::reduce_now`), for every reduce op, over 3 ranks.
#[test]
fn started_all_reduce_of_host_and_non_host_bytes_matches_the_blocking_one() {
    let world = ThreadWorld::new(3, Duration::from_secs(30));
    let rank = |r: usize| -> Result<()> {
        let c = world.communicator(r)?;
        let g = [0usize, 1, 2];
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product] {
            let mut want = values(r, 5);
            c.all_reduce(&g, bytemuck::cast_slice_mut(&mut want).into(), DType::F32, op)?;
            let host = c.all_reduce_start(&g, Box::new(values(r, 5)), DType::F32, op)?.wait()?;
            let host = host.into_any().downcast::<Vec<f32>>().map_err(|_| Error::Autograd("type".into()))?;
            assert_eq!(*host, want, "{op:?}: host bytes on the worker");
            let other = c.all_reduce_start(&g, Box::new(NotHost(values(r, 5))), DType::F32, op)?.wait()?;
            let other = other.into_any().downcast::<NotHost>().map_err(|_| Error::Autograd("type".into()))?;
            assert_eq!(other.0, want, "{op:?}: non-host bytes through all_reduce_into");
            let mut dflt: Box<dyn OwnedBytes> = Box::new(NotHost(values(r, 5)));
            reduce_now(&c, &g, dflt.as_mut(), DType::F32, op)?;
            let dflt = dflt.into_any().downcast::<NotHost>().map_err(|_| Error::Autograd("type".into()))?;
            assert_eq!(dflt.0, want, "{op:?}: the default");
        }
        // A bad call is a typed error on the caller, not a hang: a group without this rank.
        let e = c.all_reduce_start(&[(r + 1) % 3], Box::new(NotHost(values(r, 2))), DType::F32, ReduceOp::Sum);
        assert!(e.is_err(), "rank {r}: a group without this rank must fail");
        Ok(())
    };
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..3).map(|r| s.spawn(move || rank(r))).collect();
        for h in ranks {
            h.join().unwrap().unwrap();
        }
    });
}

/// `DeviceMesh::all_gather_v_start` (FSDP's prefetch): every member's elements in group order,
/// equal to the blocking `all_gather_v`, with uneven and empty blocks, on both dims of a mesh
/// and the whole world; queued behind a started all-reduce of the same group, alongside a
/// blocking collective of the other.
#[test]
fn a_started_all_gather_equals_the_blocking_one() {
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let me = ctx.rank();
        for along in [Along::Dim(0), Along::Dim(1), Along::All] {
            let n = match along {
                Along::Dim(d) => mesh.size(d),
                _ => 4,
            };
            for base in [0usize, 1, 3, 10_000] {
                // member k sends base + k elements (member 0 of a 1-element base: one, of 0: none)
                let counts: Vec<usize> = (0..n).map(|k| base * k / 2 + k % 2).collect();
                let k = match along {
                    Along::Dim(d) => mesh.coordinate()[d],
                    _ => me,
                };
                let mine: Vec<f64> = input(me, counts[k]);
                let want = mesh.all_gather_v(along, &mine, &counts)?;
                let got = mesh.all_gather_v_start(along, mine, &counts)?.wait()?;
                assert_eq!(got, want, "{along:?} counts {counts:?}");
            }
        }
        // ordering: a started all-reduce and a started all-gather on dp, a blocking tp
        // collective alongside, waited for in reverse
        let reduce = mesh.all_reduce_start(Along::Dim(0), vec![me as f64; 3], ReduceOp::Sum)?;
        let gather = mesh.all_gather_v_start(Along::Dim(0), vec![me as f64; 2], &[2, 2])?;
        let mut t = vec![1.0f64];
        mesh.all_reduce(Along::Dim(1), &mut t, ReduceOp::Sum)?;
        let g = gather.wait()?;
        let r = reduce.wait()?;
        Ok((g, r, t))
    })
    .unwrap();
    for (rank, (g, r, t)) in out.into_iter().enumerate() {
        // the dp group of rank (dp, tp) = 2·dp + tp: the ranks of its tp coordinate
        let dp = [rank % 2, rank % 2 + 2];
        let want_g: Vec<f64> = dp.iter().flat_map(|&r| [r as f64; 2]).collect();
        assert_eq!(g, want_g, "rank {rank}");
        assert_eq!(r, vec![dp.iter().sum::<usize>() as f64; 3]);
        assert_eq!(t, vec![2.0]);
    }
}

/// A send that disagrees with its own count is refused on the caller's thread, before any
/// agreement, as a typed error.
#[test]
fn a_started_all_gather_refuses_a_send_that_is_not_its_count() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        Ok(mesh.all_gather_v_start(Along::Dim(0), vec![1.0f64; 3], &[1, 1]).err().map(|e| e.to_string()))
    })
    .unwrap();
    for e in out {
        let e = e.expect("refused");
        assert!(e.contains("sends 24 bytes") && e.contains("8"), "{e}");
    }
}
