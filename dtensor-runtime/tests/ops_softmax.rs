//! softmax / log_softmax and the losses, forward and backward, on several layouts.

mod ops_util;

use dtensor_runtime::{Replicate as R, Shard as S};
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
