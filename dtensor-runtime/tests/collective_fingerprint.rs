//! The collective fingerprint check: ranks that issue different collectives (swapped order
//! with equal sizes, different roots, reduce ops, element types, counts or placements) all get
//! `CollectiveMismatch` naming the field, instead of silently diverging.

use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::{from_local, run, Along, Error, FromLocal, Partial, Placement, RankCtx, ReduceOp, Shard};

/// Runs `f` on two ranks with the check on and returns what each rank's call gave.
fn each_rank<R: Send>(
    f: impl Fn(&RankCtx, &dtensor_runtime::DeviceMesh) -> Result<R, Error> + Sync,
) -> Vec<Result<R, Error>> {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        mesh.set_collective_checks(true);
        Ok(f(&ctx, &mesh))
    })
    .unwrap()
}

/// Every rank got a `CollectiveMismatch` on `field`.
fn all_mismatch<R: std::fmt::Debug>(out: Vec<Result<R, Error>>, field: &str) {
    for (rank, r) in out.into_iter().enumerate() {
        match r {
            Err(Error::CollectiveMismatch { rank: r, field: f, ref detail, .. }) if r == rank && f == field => {
                assert!(detail.contains("rank 1 issued") && detail.contains("rank 0 issued"), "{detail}");
            }
            other => panic!("rank {rank}: expected a {field} mismatch, got {other:?}"),
        }
    }
}

#[test]
fn swapped_collectives_with_equal_sizes() {
    // 4 floats each: all-gather on one rank, all-to-all on the other.
    all_mismatch(
        each_rank(|ctx, mesh| {
            let x = [ctx.rank() as f32; 4];
            if ctx.rank() == 0 {
                mesh.all_gather(Along::Dim(0), &x)
            } else {
                mesh.all_to_all(Along::Dim(0), &x)
            }
        }),
        "kind",
    );
    // Two all-reduces of equal size issued in opposite order (sum then max vs max then sum).
    all_mismatch(
        each_rank(|ctx, mesh| {
            let ops = if ctx.rank() == 0 { [ReduceOp::Sum, ReduceOp::Max] } else { [ReduceOp::Max, ReduceOp::Sum] };
            for op in ops {
                mesh.all_reduce(Along::All, &mut [1.0f64; 3], op)?;
            }
            Ok(())
        }),
        "reduce op",
    );
}

#[test]
fn different_roots() {
    all_mismatch(each_rank(|ctx, mesh| mesh.broadcast(Along::Dim(0), &mut [1.0f32; 4], ctx.rank())), "root");
}

#[test]
fn different_dtypes_and_counts_of_equal_bytes() {
    all_mismatch(
        each_rank(|ctx, mesh| {
            if ctx.rank() == 0 {
                mesh.all_reduce(Along::Dim(0), &mut [1.0f32; 2], ReduceOp::Sum)
            } else {
                mesh.all_reduce(Along::Dim(0), &mut [1.0f64; 1], ReduceOp::Sum)
            }
        }),
        "dtype",
    );
    all_mismatch(each_rank(|ctx, mesh| mesh.all_gather(Along::Dim(0), &vec![1.0f32; 2 + ctx.rank()])), "element count");
}

#[test]
fn one_extra_collective_shifts_the_sequence() {
    // Rank 0 issues a barrier more than rank 1; their next broadcasts are different calls.
    let out = each_rank(|ctx, mesh| {
        if ctx.rank() == 0 {
            mesh.barrier(Along::All)?;
        }
        mesh.broadcast(Along::All, &mut [0.0f32; 1], 0)
    });
    // Rank 0's barrier meets rank 1's broadcast: the kind differs (the sequence numbers agree
    // there: both are call #0 on the group).
    all_mismatch(out, "kind");
}

#[test]
fn different_placements_per_rank() {
    // Each rank believes the tensor is Partial with a different reduce op: the redistribution
    // to Replicate issues all-reduces with different ops.
    let g = ArrayD::<f64>::from_elem(vec![2, 2], 1.0);
    all_mismatch(
        each_rank(|ctx, mesh| {
            let op = if ctx.rank() == 0 { ReduceOp::Sum } else { ReduceOp::Max };
            let dt = from_local(g.clone(), mesh, &[Partial(op)], FromLocal::default())?;
            dt.redistribute(&[Placement::Replicate]).map(|_| ())
        }),
        "reduce op",
    );
    // Different target placements: S(0) -> S(1) on one rank (an all-to-all) against
    // S(0) -> R on the other (an all-gather).
    all_mismatch(
        each_rank(|ctx, mesh| {
            let dt = from_local(g.clone(), mesh, &[Shard(0)], FromLocal::default())?;
            let to = if ctx.rank() == 0 { Shard(1) } else { Placement::Replicate };
            dt.redistribute(&[to]).map(|_| ())
        }),
        "kind",
    );
}

#[test]
fn from_local_run_check_compares_partial_reduce_ops() {
    let g = ArrayD::<f64>::from_elem(vec![2, 2], 1.0);
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let op = if ctx.rank() == 0 { ReduceOp::Sum } else { ReduceOp::Avg };
        Ok(from_local(g.clone(), &mesh, &[Partial(op)], FromLocal::checked()).map(|_| ()))
    })
    .unwrap();
    for (rank, r) in out.into_iter().enumerate() {
        match r {
            Err(Error::InconsistentAcrossRanks { ref context, .. }) => {
                assert!(context.contains("placements") && context.contains("P("), "rank {rank}: {context}")
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    // The same op on every rank passes.
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        from_local(g.clone(), &mesh, &[Partial(ReduceOp::Max)], FromLocal::checked()).map(|_| ())
    })
    .unwrap();
}

#[test]
fn matching_collectives_pass_with_the_check_on_and_results_are_unchanged() {
    let out = each_rank(|ctx, mesh| {
        let mut b = [ctx.rank() as f32 + 1.0; 3];
        mesh.all_reduce(Along::All, &mut b, ReduceOp::Sum)?;
        mesh.broadcast(Along::All, &mut b, 1)?;
        let gathered = mesh.all_gather(Along::All, &[ctx.rank() as f64])?;
        let sub = mesh.submesh("x")?;
        assert!(sub.collective_checks());
        sub.barrier(Along::All)?;
        Ok((b, gathered))
    });
    for r in out {
        assert_eq!(r.unwrap(), ([3.0; 3], vec![0.0, 1.0]));
    }
}
