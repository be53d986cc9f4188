//! softmax / log_softmax and the losses, forward and backward, on several layouts.

mod ops_util;

use dtensor_runtime::{CrossEntropyOptions, DTensor, LossReduction, Replicate as R, Result, Shard as S};
use ops_util::{case, check_op, ids, inp, Case};

fn cases() -> Vec<Case> {
    vec![
        case(&[2, 2], vec![inp(&[5, 4], &[S(0), R])], Some(&[S(0), R])),
        case(&[2, 2], vec![inp(&[2, 3, 5], &[S(0), S(1)])], Some(&[S(0), S(1)])),
        case(&[3], vec![inp(&[7, 3], &[S(0)])], Some(&[S(0)])),
        // sharded on the softmax dim: two-pass (max and sum statistics all-reduced)
        case(&[3], vec![inp(&[4, 5], &[S(1)])], None),
        case(&[2, 2], vec![inp(&[3, 7], &[S(1), S(1)])], None),
    ]
}

#[test]
fn softmax() {
    check_op("softmax(-1)", &cases(), true, &|x| x[0].softmax(-1));
}

#[test]
fn log_softmax() {
    check_op("log_softmax(-1)", &cases(), true, &|x| x[0].log_softmax(-1));
}

#[test]
fn cross_entropy() {
    let cases = vec![
        // batch-sharded logits and targets
        case(&[2, 2], vec![inp(&[5, 4], &[S(0), R]), ids(&[5], &[S(0), R], 4)], None),
        // class-sharded logits (vocab parallel)
        case(&[2, 2], vec![inp(&[4, 6], &[R, S(1)]), ids(&[4], &[R, R], 6)], None),
        case(&[3], vec![inp(&[7, 3], &[S(0)]), ids(&[7], &[R], 3)], None),
        case(&[2, 2], vec![inp(&[2, 3, 4], &[S(0), S(1)]), ids(&[2, 3], &[S(0), S(1)], 4)], None),
    ];
    check_op("cross_entropy", &cases, true, &|x| x[0].cross_entropy(&x[1]));
}

fn loss_cases() -> Vec<Case> {
    vec![
        // batch-sharded logits and targets (uneven: 5 over 2)
        case(&[2, 2], vec![inp(&[5, 4], &[S(0), R]), ids(&[5], &[S(0), R], 4)], None),
        // class-sharded logits (vocab parallel), replicated targets
        case(&[2, 2], vec![inp(&[4, 6], &[R, S(1)]), ids(&[4], &[R, R], 6)], None),
        // batch-sharded logits, replicated targets (uneven: 7 over 3)
        case(&[3], vec![inp(&[7, 3], &[S(0)]), ids(&[7], &[R], 3)], None),
        // both batch dims sharded, one with an empty shard (1 sequence over 2 ranks)
        case(&[2, 2], vec![inp(&[1, 3, 4], &[S(0), S(1)]), ids(&[1, 3], &[S(0), S(1)], 4)], None),
    ]
}

/// The targets with every id 0 replaced by -100 (Hugging Face's "no target"), so that each
/// case ignores some positions.
fn with_ignored(t: &DTensor<f64>) -> Result<DTensor<f64>> {
    t.masked_fill(&t.eq_mask(&t.mul_scalar(0.0)?)?, -100.0)
}

#[test]
fn cross_entropy_with_options() {
    let ignore = CrossEntropyOptions::new().ignore_index(-100);
    for (name, opts) in [
        ("cross_entropy(ignore_index, mean)", ignore),
        ("cross_entropy(ignore_index, sum)", ignore.reduction(LossReduction::Sum)),
        ("cross_entropy(ignore_index, none)", ignore.reduction(LossReduction::None)),
        ("cross_entropy(label_smoothing 0.1, mean)", CrossEntropyOptions::new().label_smoothing(0.1)),
        ("cross_entropy(ignore_index, label_smoothing 0.2, mean)", ignore.label_smoothing(0.2)),
    ] {
        check_op(name, &loss_cases(), true, &move |x| match opts.ignore_index {
            Some(_) => x[0].cross_entropy_with(&with_ignored(&x[1])?, &opts),
            None => x[0].cross_entropy_with(&x[1], &opts),
        });
    }
}

#[test]
fn mse_loss() {
    let cases = vec![
        case(&[2, 2], vec![inp(&[5, 4], &[S(0), R]), inp(&[5, 4], &[S(0), R])], None),
        case(&[3], vec![inp(&[4, 5], &[S(1)]), inp(&[4, 5], &[R])], None),
        case(&[2, 2], vec![inp(&[3, 3], &[S(0), S(1)]), inp(&[3, 3], &[S(1), S(0)])], None),
    ];
    check_op("mse_loss", &cases, true, &|x| x[0].mse_loss(&x[1]));
}

/// Softmax over the sharded dim moves only per-row statistics: two all-reduces of `[rows, 1]`
/// and no all-gather of the input.
#[test]
fn softmax_on_sharded_dim_reduces_statistics_only() {
    use dtensor_runtime::{distribute_tensor, run, CollectiveKind, CommDebugMode};
    let x = ops_util::values(&[4, 9], ops_util::Kind::Real, 1);
    let out = run(3, |ctx| {
        let mesh = ctx.init_device_mesh(&[3], &["tp"])?;
        let xd = distribute_tensor(&x, &mesh, &[S(1)], None)?;
        let mode = CommDebugMode::new();
        let y = mode.scope(|| xd.softmax(1))?;
        Ok((y.placements().to_vec(), mode.count(CollectiveKind::AllReduce), mode.total(), mode.total_bytes()))
    })
    .unwrap();
    for (pl, ar, total, bytes) in out {
        assert_eq!(pl, vec![S(1)]);
        assert_eq!((ar, total), (2, 2));
        assert_eq!(bytes, 2 * 4 * 8, "two [4, 1] f64 statistics");
    }
}

/// The two-pass softmax keeps the input's layout on every mesh dim: a Replicate mesh dim next
/// to the sharded softmax dim stays Replicate (the typed layer's promise).
#[test]
fn softmax_on_sharded_dim_keeps_the_layout() {
    use dtensor_runtime::{distribute_tensor, run};
    let x = ops_util::values(&[5, 4], ops_util::Kind::Real, 2);
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let mut got = vec![];
        for pl in [[R, S(1)], [S(1), R], [S(0), S(1)]] {
            let xd = distribute_tensor(&x, &mesh, &pl, None)?;
            got.push((pl.to_vec(), xd.softmax(1)?.placements().to_vec()));
            got.push((pl.to_vec(), xd.log_softmax(1)?.placements().to_vec()));
        }
        Ok(got)
    })
    .unwrap();
    for (want, got) in out.into_iter().flatten() {
        assert_eq!(got, want);
    }
}

/// Partial ids, a label smoothing outside [0, 1] and an ignored id without `ignore_index` are
/// typed errors naming the op.
#[test]
fn cross_entropy_option_errors() {
    use dtensor_runtime::{distribute_tensor, ndarray::ArrayD, run, Error, Partial, ReduceOp};
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        let x = distribute_tensor(ArrayD::<f64>::zeros(vec![4, 3]), &mesh, &[R], None)?;
        let ids = ArrayD::from_shape_vec(vec![4], vec![0i64, -100, 2, 1]).unwrap();
        let t = distribute_tensor(&ids, &mesh, &[R], None)?;
        let partial = t.redistribute(&[Partial(ReduceOp::Sum)])?;
        let e1 =
            x.cross_entropy_with(&partial, &CrossEntropyOptions::new().ignore_index(-100)).unwrap_err().to_string();
        let e2 = x.cross_entropy_with(&t, &CrossEntropyOptions::new().label_smoothing(1.5)).unwrap_err();
        let e3 = x.cross_entropy(&t).unwrap_err();
        Ok((e1, matches!(e2, Error::InvalidArgument { .. }), e2.to_string(), e3.to_string()))
    })
    .unwrap();
    for (e1, typed, e2, e3) in out {
        assert!(e1.contains("cross_entropy") && e1.contains("Partial"), "{e1}");
        assert!(typed && e2.contains("label_smoothing 1.5"), "{e2}");
        assert!(e3.contains("-100"), "{e3}");
    }
}

/// A `-inf` logit at a class the target does not weigh (a masked or padded vocabulary entry)
/// leaves the loss and its gradient finite, as PyTorch's gather does: the same as a very
/// negative finite logit there, on one rank and loss-parallel.
#[test]
fn masked_classes_keep_the_loss_finite() {
    use dtensor_runtime::{distribute_tensor, ndarray::ArrayD, run};
    let logits = |masked: f64| {
        ArrayD::from_shape_vec(
            vec![3, 4],
            vec![0.5, masked, 1.0, -0.5, 2.0, 0.1, masked, 0.3, masked, masked, 0.2, 0.9],
        )
        .unwrap()
    };
    let ids = ArrayD::from_shape_vec(vec![3], vec![0i64, 3, -100]).unwrap();
    for mesh_shape in [[1usize, 1], [1, 2]] {
        let out = run(mesh_shape[1], |ctx| {
            let mesh = ctx.init_device_mesh(&mesh_shape, &["dp", "tp"])?;
            let t = distribute_tensor(ids.clone(), &mesh, &[R, R], None)?;
            let mut res = Vec::new();
            for m in [f64::NEG_INFINITY, -1e300] {
                let x = distribute_tensor(logits(m), &mesh, &[R, S(1)], None)?.requires_grad_(true);
                let loss = x.cross_entropy_with(&t, &CrossEntropyOptions::new().ignore_index(-100))?;
                loss.backward()?;
                res.push((loss.full_tensor()?.sum(), x.grad().unwrap().full_tensor()?));
            }
            Ok(res)
        })
        .unwrap();
        for res in out {
            let ((inf_loss, inf_grad), (big_loss, big_grad)) = (&res[0], &res[1]);
            assert!(inf_loss.is_finite() && (inf_loss - big_loss).abs() < 1e-12, "{inf_loss} vs {big_loss}");
            assert!(inf_grad.iter().zip(big_grad.iter()).all(|(a, b)| a.is_finite() && (a - b).abs() < 1e-12));
        }
    }
}
