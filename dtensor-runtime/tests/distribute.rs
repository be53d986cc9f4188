//! distribute_tensor / from_local / to_local / full_tensor / redistribute: semantics and errors.

mod common;

use common::{check_layout, coord_of, expected_shard, global};
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::{
    distribute_tensor, from_local, plan_redistribute, run, CollectiveKind, CommDebugMode, Error, FromLocal, Placement,
    ReduceOp, Replicate, Shard,
};

#[test]
fn distribute_from_source_rank_uses_only_its_data() {
    // Every rank passes different data; with src_data_rank = Some(2) the result is rank 2's.
    for p in [vec![Shard(0), Shard(1)], vec![Replicate, Replicate], vec![Shard(1), Replicate], vec![Shard(0), Shard(0)]]
    {
        let out = run(4, |ctx| {
            let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
            let mine = global(&[5, 3], ctx.rank() as u64);
            let dt = distribute_tensor(&mine, &mesh, &p, Some(2))?;
            Ok((dt.to_host()?, dt.full_tensor()?))
        })
        .unwrap();
        let src = global(&[5, 3], 2);
        for (rank, (local, full)) in out.iter().enumerate() {
            assert_eq!(full, &src, "{p:?}");
            assert_eq!(local, &expected_shard(&src, &[2, 2], &coord_of(rank, &[2, 2]), &p), "{p:?} rank {rank}");
        }
    }
}

#[test]
fn distribute_without_source_slices_locally_without_communication() {
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["x"])?;
        let g = global(&[9, 2], 1);
        let mode = CommDebugMode::new();
        let dt = mode.scope(|| distribute_tensor(&g, &mesh, &[Shard(0)], None))?;
        assert_eq!(mode.total(), 0);
        assert_eq!(dt.local(), &expected_shard(&g, &[4], &[ctx.rank()], &[Shard(0)]));
        assert_eq!(dt.local_offset()[0], [0, 3, 6, 9][ctx.rank()]);
        Ok(())
    })
    .unwrap();
}

#[test]
fn distribute_errors() {
    let errs = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let g = global(&[4, 4], 0);
        let dt = distribute_tensor(&g, &mesh, &[Shard(0)], None)?;
        // Same layout again: returned as is.
        let same = distribute_tensor(&dt, &mesh, &[Shard(0)], None)?;
        assert_eq!(same.local(), dt.local());
        Ok(vec![
            distribute_tensor(&g, &mesh, &[Placement::PARTIAL_SUM], None).unwrap_err(),
            distribute_tensor(&g, &mesh, &[Shard(2)], None).unwrap_err(),
            distribute_tensor(&g, &mesh, &[Shard(0), Replicate], None).unwrap_err(),
            distribute_tensor(&g, &mesh, &[Shard(0)], Some(7)).unwrap_err(),
            distribute_tensor(&dt, &mesh, &[Replicate], None).unwrap_err(),
        ])
    })
    .unwrap();
    let e = &errs[0];
    assert!(matches!(e[0], Error::PartialNotAllowed { .. }), "{}", e[0]);
    assert!(matches!(e[1], Error::ShardDimOutOfRange { dim: 2, ndim: 2 }), "{}", e[1]);
    assert!(matches!(e[2], Error::PlacementCountMismatch { given: 2, mesh_ndim: 1 }), "{}", e[2]);
    assert!(matches!(e[3], Error::RankOutOfRange { rank: 7, .. }), "{}", e[3]);
    assert!(matches!(e[4], Error::AlreadyDistributed { .. }), "{}", e[4]);
    assert!(e[4].to_string().contains("redistribute"));

    // Ranks disagree about the shape: the disagreeing rank gets a typed error.
    let err = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let g = global(&[4 + ctx.rank(), 2], 0);
        distribute_tensor(&g, &mesh, &[Shard(0)], Some(0)).map(|_| ())
    })
    .unwrap_err();
    assert!(matches!(&err, Error::InconsistentAcrossRanks { rank: 1, reference_rank: 0, .. }), "{err}");

    let err = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let g = ArrayD::<f32>::zeros(IxDyn(&[1; 17]));
        distribute_tensor(&g, &mesh, &[Replicate], Some(0)).map(|_| ())
    })
    .unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

#[test]
fn from_local_even_and_uneven() {
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        // Even: global shape inferred as local x mesh size on sharded dims.
        let even = from_local(ArrayD::<f64>::zeros(vec![2, 3]), &mesh, &[Shard(0), Shard(1)], FromLocal::checked())?;
        // Uneven: 5 rows over dp=2 -> 3, 2; run_check verifies every rank's shard.
        let g = global(&[5, 4], 3);
        let local = expected_shard(&g, &[2, 2], mesh.coordinate(), &[Shard(0), Replicate]);
        let uneven = from_local(
            local,
            &mesh,
            &[Shard(0), Replicate],
            FromLocal { run_check: true, ..FromLocal::with_shape(&[5, 4]) },
        )?;
        // Default placements: replicate everywhere.
        let repl = from_local(ArrayD::<f64>::ones(vec![2]), &mesh, &[], FromLocal::default())?;
        Ok((even.shape().to_vec(), even.stride().to_vec(), uneven.full_tensor()?, repl.placements().to_vec()))
    })
    .unwrap();
    for (shape, stride, full, repl) in out {
        assert_eq!(shape, vec![4, 6]);
        assert_eq!(stride, vec![6, 1]);
        assert_eq!(full, global(&[5, 4], 3));
        assert_eq!(repl, vec![Replicate, Replicate]);
    }
}

#[test]
fn from_local_run_check_broadcasts_replicated_data() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let local = ArrayD::from_elem(vec![3], ctx.rank() as f32 + 1.0);
        let dt = from_local(local, &mesh, &[Replicate], FromLocal::checked())?;
        dt.to_host()
    })
    .unwrap();
    assert_eq!(out[1], ArrayD::from_elem(vec![3], 1.0));
}

#[test]
fn from_local_errors() {
    let errs = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let l = ArrayD::<f32>::zeros(vec![2, 2]);
        Ok(vec![
            from_local(l.clone(), &mesh, &[Shard(0)], FromLocal { shape: Some(vec![4, 2]), ..Default::default() })
                .unwrap_err(),
            from_local(l.clone(), &mesh, &[Shard(0)], FromLocal::with_shape(&[9, 2])).unwrap_err(),
            from_local(l.clone(), &mesh, &[Shard(0)], FromLocal::with_shape(&[4])).unwrap_err(),
        ])
    })
    .unwrap();
    assert!(matches!(errs[0][0], Error::ShapeStrideTogether { shape_given: true, stride_given: false }));
    assert!(matches!(errs[0][1], Error::ShapeMismatch { .. }), "{}", errs[0][1]);
    assert!(matches!(errs[0][2], Error::ShapeMismatch { .. }), "{}", errs[0][2]);

    // run_check catches ranks whose local shapes do not fit one global tensor.
    let err = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let l = ArrayD::<f32>::zeros(vec![2 + ctx.rank(), 2]);
        from_local(l, &mesh, &[Shard(0)], FromLocal::checked()).map(|_| ())
    })
    .unwrap_err();
    assert!(matches!(err, Error::InconsistentAcrossRanks { .. }), "{err}");
}

#[test]
fn partial_sources_reduce_to_their_global_value() {
    // Each rank holds a different partial value; the logical tensor is their reduction.
    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product] {
        for target in [vec![Replicate], vec![Shard(0)], vec![Shard(1)]] {
            let shape = [5usize, 3];
            let out = run(3, |ctx| {
                let mesh = ctx.init_device_mesh(&[3], &["x"])?;
                let local = global(&shape, 10 + ctx.rank() as u64).mapv(|x| x / 8.0);
                let dt = from_local(local.clone(), &mesh, &[Placement::Partial(op)], FromLocal::default())?;
                let r = dt.redistribute(&target)?;
                Ok((local, r.to_host()?, r.full_tensor()?))
            })
            .unwrap();
            // Reference reduction over the ranks' partial values.
            let mut want = out[0].0.clone();
            for (l, _, _) in &out[1..] {
                want.zip_mut_with(l, |a, b| {
                    *a = match op {
                        ReduceOp::Sum | ReduceOp::Avg => *a + *b,
                        ReduceOp::Max => a.max(*b),
                        ReduceOp::Min => a.min(*b),
                        ReduceOp::Product => *a * *b,
                    }
                });
            }
            if op == ReduceOp::Avg {
                want.mapv_inplace(|x| x / 3.0);
            }
            let locals: Vec<ArrayD<f64>> = out.iter().map(|(_, l, _)| l.clone()).collect();
            check_layout(&want, &[3], &target, &locals, 1e-12).unwrap();
            for (_, _, full) in &out {
                assert!(full.iter().zip(want.iter()).all(|(a, b)| (a - b).abs() < 1e-12), "{op:?} {target:?}");
            }
        }
    }
}

#[test]
fn redistribute_errors() {
    let errs = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let dt = distribute_tensor(global(&[4], 0), &mesh, &[Shard(0)], None)?;
        let p = from_local(ArrayD::<f64>::zeros(vec![4]), &mesh, &[Placement::PARTIAL_SUM], FromLocal::default())?;
        Ok(vec![
            // Shard -> Partial(sum) is legal (PyTorch 2.15); other reduce ops are not.
            dt.redistribute(&[Placement::Partial(ReduceOp::Avg)]).unwrap_err(),
            p.redistribute(&[Placement::Partial(ReduceOp::Max)]).unwrap_err(),
            dt.redistribute(&[Shard(1)]).unwrap_err(),
            dt.redistribute(&[Replicate, Replicate]).unwrap_err(),
        ])
    })
    .unwrap();
    let e = &errs[0];
    assert!(matches!(e[0], Error::InvalidRedistribute { mesh_dim: 0, .. }), "{}", e[0]);
    assert!(matches!(e[1], Error::InvalidRedistribute { .. }), "{}", e[1]);
    assert!(matches!(e[2], Error::ShardDimOutOfRange { .. }), "{}", e[2]);
    assert!(matches!(e[3], Error::PlacementCountMismatch { .. }), "{}", e[3]);
}

#[test]
fn plans_take_the_cheap_collective() {
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let kinds = |from: &[Placement], to: &[Placement]| -> Vec<(usize, Option<CollectiveKind>)> {
            plan_redistribute::<f32>(&[8, 8], &mesh, from, to)
                .unwrap()
                .steps
                .iter()
                .map(|s| (s.mesh_dim, s.collective))
                .collect()
        };
        let p = Placement::PARTIAL_SUM;
        // Shard(0) -> Shard(1): one all-to-all, not all-gather + chunk.
        assert_eq!(kinds(&[Replicate, Shard(0)], &[Replicate, Shard(1)]), vec![(1, Some(CollectiveKind::AllToAll))]);
        // Partial -> Shard: one reduce-scatter, not all-reduce + chunk.
        assert_eq!(kinds(&[Replicate, p], &[Replicate, Shard(0)]), vec![(1, Some(CollectiveKind::ReduceScatter))]);
        // Replicate -> Shard: local.
        assert_eq!(kinds(&[Replicate, Replicate], &[Shard(0), Shard(1)]), vec![(0, None), (1, None)]);
        // Nested: (S0,S0) -> (S0,R) only undoes the inner split.
        assert_eq!(kinds(&[Shard(0), Shard(0)], &[Shard(0), Replicate]), vec![(1, Some(CollectiveKind::AllGather))]);
        // (R,S0) -> (S0,S0): the inner split must be redone under the new outer one. Gathering
        // it (32 elements on the wire per rank) costs more than moving it aside with an
        // all-to-all (16) and back under the new outer split (8): the planner takes the latter.
        assert_eq!(
            kinds(&[Replicate, Shard(0)], &[Shard(0), Shard(0)]),
            vec![(1, Some(CollectiveKind::AllToAll)), (0, None), (1, Some(CollectiveKind::AllToAll))]
        );
        let wire = |from: &[Placement], to: &[Placement]| {
            plan_redistribute::<f32>(&[8, 8], &mesh, from, to).unwrap().wire_bytes()
        };
        assert_eq!(wire(&[Replicate, Shard(0)], &[Shard(0), Shard(0)]), (16 + 8) * 4);
        assert_eq!(wire(&[Replicate, Shard(0)], &[Replicate, Replicate]), 32 * 4);
        // Uneven Partial -> Shard still takes the reduce-scatter (an all-reduce costs twice).
        let uneven = plan_redistribute::<f32>(&[5, 4], &mesh, &[Replicate, p], &[Replicate, Shard(0)])?;
        assert_eq!(uneven.steps.len(), 1);
        assert_eq!(uneven.steps[0].collective, Some(CollectiveKind::ReduceScatter));
        // Identity: nothing.
        assert!(kinds(&[Shard(0), p], &[Shard(0), p]).is_empty());
        // The bytes a plan reports are what the collectives record.
        let g = global(&[8, 8], 0).mapv(|x| x as f32);
        let dt = distribute_tensor(&g, &mesh, &[Shard(0), Shard(1)], None)?;
        let plan = dt.plan_redistribute(&[Replicate, Replicate])?;
        let mode = CommDebugMode::new();
        mode.scope(|| dt.redistribute(&[Replicate, Replicate]))?;
        assert_eq!(mode.total_bytes(), plan.bytes());
        assert_eq!(mode.count(CollectiveKind::AllGather), 2);
        assert_eq!(plan.to_string().matches("all_gather").count(), 2);
        Ok(())
    })
    .unwrap();
}

#[test]
fn plans_agree_across_ranks_and_beat_gather_everything() {
    let layouts = [
        vec![Shard(0), Shard(1)],
        vec![Shard(1), Shard(0)],
        vec![Shard(0), Shard(0)],
        vec![Replicate, Shard(1)],
        vec![Placement::PARTIAL_SUM, Shard(0)],
    ];
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let mut res = vec![];
        for from in &layouts {
            for to in &layouts {
                if to.iter().any(|p| p.is_partial()) && from != to {
                    continue;
                }
                // 7 x 5: uneven on both mesh dims.
                let plan = plan_redistribute::<f32>(&[7, 5], &mesh, from, to)?;
                let naive_gather = plan_redistribute::<f32>(&[7, 5], &mesh, from, &[Replicate, Replicate])?;
                let shape: Vec<_> = plan.steps.iter().map(|s| (s.mesh_dim, s.from, s.to, s.collective)).collect();
                res.push((from.clone(), to.clone(), shape, plan.wire_bytes(), naive_gather.wire_bytes()));
            }
        }
        Ok(res)
    })
    .unwrap();
    for other in &out[1..] {
        for (a, b) in out[0].iter().zip(other) {
            // Same steps on every rank (sizes may differ with uneven shards).
            assert_eq!(a.2, b.2, "{:?} -> {:?}", a.0, a.1);
        }
    }
    for (from, to, _, bytes, gather_all) in &out[0] {
        // Never more than gathering everything (after which the target is a local chunk).
        assert!(bytes <= gather_all, "{from:?} -> {to:?}: {bytes} > {gather_all}");
    }
}
