//! layer_norm and rms_norm as ops (weight and bias gradients included), forward and every
//! input gradient against the single-rank result on every layout case; finite differences in
//! f64 on each op's first case.

mod ops_util;

use dtensor_runtime::{Partial, Placement, ReduceOp, Replicate as R, Shard as S};
use ops_util::{case, check_op, inp, Case};

fn p() -> Placement {
    Partial(ReduceOp::Sum)
}

/// (x, weight, bias) layouts; the normalised shape is `norm`.
fn cases(with_bias: bool) -> Vec<Case> {
    let c =
        |mesh: &[usize], x: &[usize], xp: &[Placement], w: &[usize], wp: &[Placement], expect: Option<&[Placement]>| {
            let mut ins = vec![inp(x, xp), inp(w, wp)];
            if with_bias {
                ins.push(inp(w, wp));
            }
            case(mesh, ins, expect)
        };
    vec![
        // batch-sharded input: local
        c(&[2, 2], &[5, 4], &[S(0), R], &[4], &[R, R], Some(&[S(0), R])),
        c(&[2, 2], &[3, 5, 4], &[S(0), S(1)], &[4], &[R, R], Some(&[S(0), S(1)])),
        c(&[3], &[7, 3], &[S(0)], &[3], &[R], Some(&[S(0)])),
        // empty shard on a batch dim
        c(&[2, 2], &[3, 2, 4], &[S(0), S(0)], &[4], &[R, R], Some(&[S(0), S(0)])),
        // sharded on the normalised dim, or a sharded weight: Replicate first
        c(&[2, 2], &[4, 6], &[S(1), S(0)], &[6], &[R, R], None),
        c(&[3], &[4, 5], &[S(0)], &[5], &[S(0)], None),
        // Partial input: reduced first
        c(&[2, 2], &[4, 3], &[p(), S(0)], &[3], &[R, R], None),
    ]
}

#[test]
fn layer_norm() {
    check_op("layer_norm(weight, bias)", &cases(true), true, &|x| {
        x[0].layer_norm(&[x[1].shape()[0]], Some(&x[1]), Some(&x[2]), 1e-5)
    });
    check_op("layer_norm(weight)", &cases(false), true, &|x| {
        x[0].layer_norm(&[x[1].shape()[0]], Some(&x[1]), None, 1e-5)
    });
    let two = vec![
        case(
            &[2, 2],
            vec![inp(&[3, 2, 4], &[S(0), R]), inp(&[2, 4], &[R, R]), inp(&[2, 4], &[R, R])],
            Some(&[S(0), R]),
        ),
        case(&[2, 2], vec![inp(&[3, 2, 4], &[S(1), S(2)]), inp(&[2, 4], &[R, S(1)]), inp(&[2, 4], &[R, R])], None),
    ];
    check_op("layer_norm([2, 4])", &two, true, &|x| x[0].layer_norm(&[2, 4], Some(&x[1]), Some(&x[2]), 1e-5));
    let plain = vec![case(&[2, 2], vec![inp(&[5, 4], &[S(0), S(0)])], Some(&[S(0), S(0)]))];
    check_op("layer_norm(no affine)", &plain, true, &|x| x[0].layer_norm(&[4], None, None, 1e-5));
}

#[test]
fn rms_norm() {
    check_op("rms_norm(weight)", &cases(false), true, &|x| x[0].rms_norm(&[x[1].shape()[0]], Some(&x[1]), 1e-6));
}

/// The modules are built on the ops: the same numbers as the formula on one rank.
#[test]
fn modules_match_the_formula() {
    use dtensor_runtime::module::{Forward, LayerNorm, RmsNorm};
    use dtensor_runtime::{distribute_module, distribute_tensor, run};
    let x = ops_util::values(&[3, 4], ops_util::Kind::Real, 5);
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        let xd = distribute_tensor(&x, &mesh, &[S(0)], None)?;
        let ln = distribute_module(LayerNorm::<f64>::new(4)?, &mesh, None, None, None)?;
        let rms = distribute_module(RmsNorm::<f64>::new(4)?, &mesh, None, None, None)?;
        Ok((ln.forward(&xd)?.full_tensor()?, rms.forward(&xd)?.full_tensor()?))
    })
    .unwrap();
    let (ln, rms) = &out[0];
    for r in 0..3 {
        let row: Vec<f64> = (0..4).map(|j| x[[r, j]]).collect();
        let mean = row.iter().sum::<f64>() / 4.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 4.0;
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 4.0;
        for j in 0..4 {
            assert!((ln[[r, j]] - (row[j] - mean) / (var + 1e-5).sqrt()).abs() < 1e-12);
            assert!((rms[[r, j]] - row[j] / (ms + 1e-6).sqrt()).abs() < 1e-12);
        }
    }
}

/// Megatron's column-parallel input: `layer_norm` of a replicated input feeding a
/// column-parallel matmul. The input gradient arrives Partial over tp; the norm reduces it
/// once (one all-reduce in the whole backward), so its weight and bias gradients come out
/// replicated, not Partial. Gradients equal the 1-rank ones.
#[test]
fn layer_norm_reduces_a_partial_gradient_once() {
    use dtensor_runtime::ndarray::{ArrayD, Dimension, IxDyn};
    use dtensor_runtime::{distribute_tensor, run, CollectiveKind, CommDebugMode};
    let g = |shape: &[usize], k: usize| {
        ArrayD::from_shape_fn(IxDyn(shape), |ix| ((ix.slice().iter().sum::<usize>() * 7 + k) % 11) as f64 / 5.0 - 1.0)
    };
    let (x, w, b, m) = (g(&[3, 6], 1), g(&[6], 2), g(&[6], 3), g(&[6, 5], 4));
    let train = |n: usize| {
        let (x, w, b, m) = (x.clone(), w.clone(), b.clone(), m.clone());
        run(n, move |ctx| {
            let mesh = ctx.init_device_mesh(&[n], &["tp"])?;
            let leaf = |a: &ArrayD<f64>, p: Placement| -> dtensor_runtime::Result<_> {
                Ok(distribute_tensor(a.clone(), &mesh, &[p], Some(0))?.requires_grad_(true))
            };
            let (x, w, b, m) = (leaf(&x, R)?, leaf(&w, R)?, leaf(&b, R)?, leaf(&m, S(1))?);
            let loss = x.layer_norm(&[6], Some(&w), Some(&b), 1e-5)?.matmul(&m)?.sum()?;
            let comm = CommDebugMode::new();
            comm.scope(|| loss.backward())?;
            let grads = [&x, &w, &b, &m]
                .iter()
                .map(|t| t.grad().expect("every leaf gets a gradient").full_tensor())
                .collect::<dtensor_runtime::Result<Vec<_>>>()?;
            Ok((comm.count_on(CollectiveKind::AllReduce, "tp"), comm.total(), grads))
        })
        .unwrap()
    };
    let want = train(1).remove(0).2;
    for (all_reduces, total, grads) in train(2) {
        assert_eq!((all_reduces, total), (1, 1), "one all-reduce over tp in the backward");
        for (got, want) in grads.iter().zip(&want) {
            for (a, b) in got.iter().zip(want) {
                assert!((a - b).abs() < 1e-12, "{a} vs {b}");
            }
        }
    }
}
