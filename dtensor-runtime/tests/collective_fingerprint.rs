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

/// An all-reduce (sum) of `count` elements of `dtype` through the typed mesh collective.
fn all_reduce_of(mesh: &dtensor_runtime::DeviceMesh, dtype: dtensor_runtime::DType, count: usize) -> Result<(), Error> {
    use dtensor_runtime::{bf16, f16, DType};
    let x = Along::Dim(0);
    match dtype {
        DType::F32 => mesh.all_reduce(x, &mut vec![0f32; count], ReduceOp::Sum),
        DType::F64 => mesh.all_reduce(x, &mut vec![0f64; count], ReduceOp::Sum),
        DType::BF16 => mesh.all_reduce(x, &mut vec![bf16::ZERO; count], ReduceOp::Sum),
        DType::F16 => mesh.all_reduce(x, &mut vec![f16::ZERO; count], ReduceOp::Sum),
        DType::I64 => mesh.all_reduce(x, &mut vec![0i64; count], ReduceOp::Sum),
        DType::I32 => mesh.all_reduce(x, &mut vec![0i32; count], ReduceOp::Sum),
        DType::U8 => mesh.all_reduce(x, &mut vec![0u8; count], ReduceOp::Sum),
    }
}

/// Issue 33, finding 5: the fingerprint knew only f32, f64 and u64, so a bf16 collective met
/// an f16 one (or i32 an f32 one) unnoticed. Every ordered pair of distinct element types is
/// now a dtype mismatch on every rank, whether or not the byte sizes match.
#[test]
fn every_pair_of_distinct_dtypes_is_told_apart() {
    use dtensor_runtime::DType;
    for a in DType::ALL {
        for b in DType::ALL.into_iter().filter(|&b| b != a) {
            all_mismatch(each_rank(|ctx, mesh| all_reduce_of(mesh, if ctx.rank() == 0 { a } else { b }, 4)), "dtype");
            // Equal bytes: 8 bytes of each.
            all_mismatch(
                each_rank(|ctx, mesh| {
                    let d = if ctx.rank() == 0 { a } else { b };
                    all_reduce_of(mesh, d, 8 / d.size_of())
                }),
                "dtype",
            );
        }
    }
    // The metadata collectives (u64 words) against an i64 one of the same count.
    all_mismatch(
        each_rank(|ctx, mesh| {
            if ctx.rank() == 0 {
                mesh.all_gather_u64(Along::Dim(0), &[1, 2]).map(|_| ())
            } else {
                mesh.all_gather(Along::Dim(0), &[1i64, 2]).map(|_| ())
            }
        }),
        "dtype",
    );
}

/// Issue 33, finding 5 (counts): the variable-size collectives' fingerprints carry their
/// counts, so counts that differ with equal totals are a mismatch of the call's arguments.
#[test]
fn variable_size_counts_that_differ_with_equal_totals() {
    all_mismatch(
        each_rank(|ctx, mesh| {
            let counts = if ctx.rank() == 0 { [2, 1] } else { [1, 2] };
            mesh.all_gather_v(Along::Dim(0), &[1.0f32; 2], &counts).map(|_| ())
        }),
        "arguments",
    );
    all_mismatch(
        each_rank(|ctx, mesh| {
            let counts = if ctx.rank() == 0 { [3, 1] } else { [1, 3] };
            mesh.reduce_scatter_v(Along::Dim(0), &[1.0f64; 4], &counts, ReduceOp::Sum).map(|_| ())
        }),
        "arguments",
    );
    // The strided all-to-all's layout: 2 rows of runs of 2 against 4 rows of runs of 1.
    all_mismatch(
        each_rank(|ctx, mesh| {
            let (rows, run) = if ctx.rank() == 0 { (2, 2) } else { (4, 1) };
            mesh.all_to_all_strided(Along::Dim(0), &[1.0f32; 8], rows, run).map(|_| ())
        }),
        "arguments",
    );
    // Agreeing counts pass, with the right data.
    for r in each_rank(|ctx, mesh| mesh.all_gather_v(Along::Dim(0), &vec![ctx.rank() as f32; 2 - ctx.rank()], &[2, 1]))
    {
        assert_eq!(r.unwrap(), vec![0.0, 0.0, 1.0]);
    }
}
