//! Backward of redistribute and of the local-tensor boundary (to_local / from_local /
//! full_tensor with grad_placements), backward_dtype, no_grad, and autograd errors.

mod ops_util;

use dtensor_runtime::autograd::no_grad;
use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::{
    distribute_tensor, from_local_grad, run, CollectiveKind, CommDebugMode, DTensor, DType, Error, FromLocal, Partial,
    Placement, ReduceOp, Replicate as R, Shard as S,
};
use ops_util::{values, Kind};

fn p() -> Placement {
    Partial(ReduceOp::Sum)
}

/// (mesh shape, tensor shape, from, to).
type RedistCase = (Vec<usize>, Vec<usize>, Vec<Placement>, Vec<Placement>);

/// For each (from, to): leaf with `from` (Partial reached from a Replicate leaf), `y =
/// x.redistribute(to)`, loss `sum(y * W)`: the leaf's gradient is W, laid out as the leaf.
#[test]
fn redistribute_backward_gives_the_identity_gradient_in_the_source_layout() {
    let pairs: Vec<RedistCase> = vec![
        (vec![2, 2], vec![5, 3], vec![S(0), S(1)], vec![R, R]),
        (vec![2, 2], vec![5, 3], vec![S(0), R], vec![S(1), S(0)]),
        (vec![2, 2], vec![5, 3], vec![R, S(1)], vec![S(0), S(0)]),
        (vec![2, 2], vec![5, 3], vec![p(), S(0)], vec![R, S(1)]),
        (vec![3], vec![7, 2], vec![S(0)], vec![S(1)]),
        (vec![3], vec![7, 2], vec![p()], vec![S(0)]),
        (vec![3], vec![4], vec![R], vec![p()]),
        // Shard -> Partial(sum) (PyTorch 2.15): uneven, nested, and with an empty shard.
        (vec![3], vec![7, 2], vec![S(0)], vec![p()]),
        (vec![2, 2], vec![5, 3], vec![S(0), S(1)], vec![p(), S(1)]),
        (vec![2, 2], vec![5, 3], vec![S(0), S(0)], vec![S(0), p()]),
        (vec![4], vec![3, 2], vec![S(0)], vec![p()]),
    ];
    for (mesh_shape, shape, from, to) in pairs {
        let x = values(&shape, Kind::Real, 1);
        let w = values(&shape, Kind::Real, 2);
        let world: usize = mesh_shape.iter().product();
        let out = run(world, |ctx| {
            let mesh = ctx.init_device_mesh(&mesh_shape, &[])?;
            let leaf_pl: Vec<Placement> = from.iter().map(|p| if p.is_partial() { R } else { *p }).collect();
            let leaf = distribute_tensor(&x, &mesh, &leaf_pl, None)?.requires_grad_(true);
            let xs = if from.iter().any(|p| p.is_partial()) { leaf.redistribute(&from)? } else { leaf.clone() };
            let y = xs.redistribute(&to)?;
            let wd = distribute_tensor(&w, &mesh, &vec![R; mesh_shape.len()], None)?;
            y.mul(&wd)?.sum()?.backward()?;
            let g = leaf.grad().expect("leaf gradient");
            Ok((g.placements().to_vec(), leaf_pl, g.full_tensor()?))
        })
        .unwrap();
        for (gp, lp, g) in out {
            assert_eq!(gp, lp, "{from:?} -> {to:?}");
            assert!(g.iter().zip(w.iter()).all(|(a, b)| (a - b).abs() < 1e-12), "{from:?} -> {to:?}: {g} vs {w}");
        }
    }
}

/// Backward of an all-gather (S(0) → R) is a reduce-scatter when the gradient is Partial (even
/// shape: with uneven padding the planner may find all-reduce + chunk cheaper),
/// and a local chunk when it is Replicate.
#[test]
fn backward_of_all_gather_is_reduce_scatter_for_partial_gradients() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let x = distribute_tensor(values(&[6, 3], Kind::Real, 3), &mesh, &[S(0)], None)?.requires_grad_(true);
        let y = x.redistribute(&[R])?;
        // Each rank's local loss differs; grad_placements = Partial says "sum them".
        let l = y.to_local_grad(Some(&[p()]))?;
        let scale = DTensor::local_tensor(ArrayD::from_elem(vec![6, 3], (ctx.rank() + 1) as f64));
        let loss = l.mul(&scale)?.sum()?;
        let mode = CommDebugMode::new();
        mode.scope(|| loss.backward())?;
        let rs = mode.count_on(CollectiveKind::ReduceScatter, "tp");
        let ar = mode.count(CollectiveKind::AllReduce);
        let g = x.grad().expect("grad");
        Ok((rs, ar, g.placements().to_vec(), g.full_tensor()?))
    })
    .unwrap();
    for (rs, ar, pl, g) in out {
        assert_eq!((rs, ar), (1, 0));
        assert_eq!(pl, vec![S(0)]);
        assert!(g.iter().all(|&v| v == 3.0), "1 + 2 from the two ranks: {g}");
    }
}

#[test]
fn to_local_grad_placements_replicate_vs_partial() {
    for (gp, expect) in [(None, 1.0), (Some(vec![p()]), 2.0)] {
        let out = run(2, |ctx| {
            let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
            let x = distribute_tensor(ArrayD::<f64>::zeros(vec![3]), &mesh, &[R], None)?.requires_grad_(true);
            x.to_local_grad(gp.as_deref())?.sum()?.backward()?;
            let g = x.grad().expect("grad");
            Ok((g.placements().to_vec(), g.full_tensor()?))
        })
        .unwrap();
        for (pl, g) in out {
            assert_eq!(pl, vec![R]);
            assert!(g.iter().all(|&v| v == expect), "{gp:?}: {g}");
        }
    }
}

#[test]
fn from_local_grad_returns_the_local_shard_of_the_gradient() {
    let w = values(&[5, 2], Kind::Real, 4);
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let rows = if ctx.rank() == 0 { 3 } else { 2 };
        let l = DTensor::local_tensor(ArrayD::<f64>::ones(vec![rows, 2])).requires_grad_(true);
        let x = from_local_grad(&l, &mesh, &[S(0)], FromLocal::with_shape(&[5, 2]))?;
        let wd = distribute_tensor(&w, &mesh, &[R], None)?;
        x.mul(&wd)?.sum()?.backward()?;
        // Partial from_local: every rank's local gets the whole (replicated) gradient.
        let lp = DTensor::local_tensor(ArrayD::<f64>::ones(vec![2])).requires_grad_(true);
        from_local_grad(&lp, &mesh, &[p()], FromLocal::default())?.sum()?.backward()?;
        // Partial(avg): each local term counts 1/2.
        let la = DTensor::local_tensor(ArrayD::<f64>::ones(vec![2])).requires_grad_(true);
        from_local_grad(&la, &mesh, &[Partial(ReduceOp::Avg)], FromLocal::default())?.sum()?.backward()?;
        let ga = la.grad().expect("grad").to_host()?;
        Ok((ctx.rank(), l.grad().expect("grad").to_host()?, lp.grad().expect("grad").to_host()?, ga))
    })
    .unwrap();
    for (rank, g, gp, ga) in out {
        assert!(ga.iter().all(|&v| v == 0.5), "{ga}");
        let off = if rank == 0 { 0 } else { 3 };
        let rows = if rank == 0 { 3 } else { 2 };
        for i in 0..rows {
            for j in 0..2 {
                assert_eq!(g[[i, j]], w[[off + i, j]]);
            }
        }
        assert!(gp.iter().all(|&v| v == 1.0));
    }
}

#[test]
fn full_tensor_grad_with_partial_grad_placements_sums_rank_contributions() {
    let w = values(&[5, 3], Kind::Real, 5);
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let x = distribute_tensor(values(&[5, 3], Kind::Real, 6), &mesh, &[S(0)], None)?.requires_grad_(true);
        let f = x.full_tensor_grad(Some(&[p()]))?;
        let scale = DTensor::local_tensor(w.mapv(|v| v * (ctx.rank() + 1) as f64));
        f.mul(&scale)?.sum()?.backward()?;
        let g = x.grad().expect("grad");
        Ok((g.placements().to_vec(), g.full_tensor()?))
    })
    .unwrap();
    for (pl, g) in out {
        assert_eq!(pl, vec![S(0)]);
        assert!(g.iter().zip(w.iter()).all(|(a, b)| (a - 3.0 * b).abs() < 1e-12));
    }
}

#[test]
fn backward_dtype_runs_gradient_collectives_in_f64() {
    let bytes = |dtype: Option<DType>| {
        run(2, move |ctx| {
            let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
            let x = distribute_tensor(ArrayD::<f32>::ones(vec![6, 4]), &mesh, &[S(0)], None)?.requires_grad_(true);
            let y = x.redistribute_with_dtype(&[R], dtype)?;
            let loss = y.to_local_grad(Some(&[p()]))?.sum()?;
            let mode = CommDebugMode::new();
            mode.scope(|| loss.backward())?;
            Ok((mode.total_bytes(), x.grad().expect("grad").full_tensor()?))
        })
        .unwrap()
    };
    let (b32, g32) = bytes(None)[0].clone();
    let (b64, g64) = bytes(Some(DType::F64))[0].clone();
    assert_eq!(b64, 2 * b32, "f64 gradient collective moves twice the bytes");
    assert_eq!(g32, g64);
    assert!(g32.iter().all(|&v| v == 2.0));
}

/// Shard -> Partial(sum) keeps each shard in place and zeros elsewhere: no collective, the
/// same logical tensor, and only Partial(sum) is a legal target (as in PyTorch 2.15).
#[test]
fn shard_to_partial_sum_is_local_zero_fill() {
    let x = values(&[5, 3], Kind::Real, 4);
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let s = distribute_tensor(&x, &mesh, &[S(0)], None)?;
        let plan = s.plan_redistribute(&[p()])?;
        let mode = CommDebugMode::new();
        let y = mode.scope(|| s.redistribute(&[p()]))?;
        let local = y.to_host()?;
        let avg = s.redistribute(&[Partial(ReduceOp::Avg)]).err();
        let max = s.redistribute(&[Partial(ReduceOp::Max)]).err();
        Ok((plan.steps.len(), plan.steps[0].collective, mode.total(), local, y.full_tensor()?, avg, max))
    })
    .unwrap();
    for (rank, (steps, coll, total, local, full, avg, max)) in out.into_iter().enumerate() {
        assert_eq!((steps, coll, total), (1, None, 0), "rank {rank}");
        assert_eq!(local.shape(), &[5, 3]);
        // torch.chunk(5, 2): rank 0 owns rows 0..3, rank 1 rows 3..5.
        let mine = if rank == 0 { 0..3 } else { 3..5 };
        for ((row, col), v) in
            local.clone().into_dimensionality::<dtensor_runtime::ndarray::Ix2>().unwrap().indexed_iter()
        {
            let want = if mine.contains(&row) { x[[row, col]] } else { 0.0 };
            assert_eq!(*v, want, "rank {rank} [{row}, {col}]");
        }
        assert_eq!(full, x);
        assert!(matches!(avg, Some(Error::InvalidRedistribute { .. })), "{avg:?}");
        assert!(matches!(max, Some(Error::InvalidRedistribute { .. })), "{max:?}");
    }
}

#[test]
fn no_grad_and_errors() {
    let out = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let x = distribute_tensor(ArrayD::<f64>::ones(vec![3]), &mesh, &[R], None)?.requires_grad_(true);
        let y = no_grad(|| x.mul(&x))?;
        let under_no_grad = y.requires_grad();
        let no_history = y.sum()?.backward().err();
        let not_scalar = x.mul(&x)?.backward().err();
        // gradients accumulate over two backward calls
        x.sum()?.backward()?;
        x.sum()?.backward()?;
        let acc = x.grad().expect("grad").to_host()?;
        x.zero_grad();
        Ok((under_no_grad, no_history, not_scalar, acc, x.grad().is_none()))
    })
    .unwrap();
    let (under, nh, ns, acc, cleared) = out[0].clone();
    assert!(!under);
    assert!(matches!(nh, Some(Error::Autograd(_))), "{nh:?}");
    assert!(matches!(ns, Some(Error::Autograd(_))), "{ns:?}");
    assert!(acc.iter().all(|&v| v == 2.0));
    assert!(cleared);
}

#[test]
fn dtensor_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<DTensor<f32>>();
    check::<DTensor<f64>>();
}

#[test]
fn disagreeing_partials_are_reduced_first_and_recorded() {
    // Partial(max) + Partial(sum) has no Partial rule: both sides are reduced (the cheapest
    // target under the ring model is a reduce-scatter to Shard(0), half an all-reduce).
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let a = distribute_tensor(ArrayD::<f64>::ones(vec![2, 2]), &mesh, &[R], None)?;
        let m = a.redistribute(&[Partial(ReduceOp::Max)])?;
        let s = a.mul_scalar(2.0)?.redistribute(&[p()])?;
        let before = dtensor_runtime::implicit_redistribution_count();
        let _ = dtensor_runtime::implicit_redistributions();
        let mode = CommDebugMode::new();
        let y = mode.scope(|| m.add(&s))?;
        let log = dtensor_runtime::implicit_redistributions();
        Ok((
            y.placements().to_vec(),
            y.full_tensor()?,
            mode.count(CollectiveKind::ReduceScatter),
            dtensor_runtime::implicit_redistribution_count() - before,
            log.iter().map(|r| (r.op, r.input)).collect::<Vec<_>>(),
            mode.records().iter().all(|r| r.op == "add"),
        ))
    })
    .unwrap();
    let (pl, y, ar, count, log, attributed) = out[0].clone();
    assert_eq!(pl, vec![S(0)]);
    assert!(y.iter().all(|&v| v == 3.0));
    assert_eq!((ar, count), (2, 2));
    assert_eq!(log, vec![("add", 0), ("add", 1)]);
    assert!(attributed, "collectives are attributed to the op");
}
