//! matmul (2-D and batched), forward and backward, against the single-rank result on the
//! layouts of its sharding rule (`ops/matmul.rs`) and on disagreeing ones, uneven shapes
//! included.

mod ops_util;

use dtensor_runtime::{Partial, Placement, ReduceOp, Replicate as R, Shard as S};
use ops_util::{case, check_op, inp};

fn p() -> Placement {
    Partial(ReduceOp::Sum)
}

#[test]
fn matmul_2d() {
    let cases = vec![
        // (S(m), R) -> S(m), uneven m
        case(&[2, 2], vec![inp(&[5, 4], &[S(0), R]), inp(&[4, 3], &[R, R])], Some(&[S(0), R])),
        // (R, S(n)) -> S(n)
        case(&[2, 2], vec![inp(&[5, 4], &[R, R]), inp(&[4, 3], &[R, S(1)])], Some(&[R, S(1)])),
        // (S(k), S(k)) -> Partial(sum)
        case(&[2, 2], vec![inp(&[4, 6], &[S(1), R]), inp(&[6, 3], &[S(0), R])], Some(&[p(), R])),
        // Megatron row-parallel: (S(m), R) on dp, (S(k), S(k)) on tp -> (S(0), P)
        case(&[2, 2], vec![inp(&[4, 6], &[S(0), S(1)]), inp(&[6, 3], &[R, S(0)])], Some(&[S(0), p()])),
        // uneven k over 3 ranks -> P
        case(&[3], vec![inp(&[3, 5], &[S(1)]), inp(&[5, 2], &[S(0)])], Some(&[p()])),
        // (P, R) -> P and (R, P) -> P
        case(&[3], vec![inp(&[3, 4], &[p()]), inp(&[4, 2], &[R])], Some(&[p()])),
        case(&[3], vec![inp(&[3, 4], &[R]), inp(&[4, 2], &[p()])], Some(&[p()])),
        // disagreeing layouts: redistributed to the cheapest strategy
        case(&[3], vec![inp(&[4, 5], &[S(1)]), inp(&[5, 3], &[R])], None),
        case(&[2, 2], vec![inp(&[4, 6], &[S(0), S(0)]), inp(&[6, 3], &[S(1), S(0)])], None),
    ];
    check_op("matmul", &cases, true, &|x| x[0].matmul(&x[1]));
}

#[test]
fn matmul_batched() {
    let cases = vec![
        // batch dim sharded, 2-D right operand
        case(&[2, 2], vec![inp(&[3, 2, 4], &[S(0), R]), inp(&[4, 5], &[R, R])], Some(&[S(0), R])),
        // batch dims shard through on both sides (uneven batch)
        case(&[3], vec![inp(&[5, 3, 4], &[S(0)]), inp(&[5, 4, 2], &[S(0)])], Some(&[S(0)])),
        // m sharded, batched right operand replicated; k sharded on the other mesh dim
        case(&[2, 2], vec![inp(&[2, 5, 4], &[S(1), S(2)]), inp(&[2, 4, 3], &[R, S(1)])], Some(&[S(1), p()])),
        // disagreeing batch shards
        case(&[2, 2], vec![inp(&[2, 3, 4], &[S(0), R]), inp(&[2, 4, 3], &[R, S(0)])], None),
    ];
    check_op("matmul(batched)", &cases, true, &|x| x[0].matmul(&x[1]));
}

/// `matmul_t` over every pair of transpose flags: the layouts of the rule with the swapped
/// operand's row and column dims traded, 2-D and batched (a 2-D right operand included, whose
/// transposed-left backward takes the copying path).
#[test]
fn matmul_transposed() {
    for (ta, tb) in [(false, true), (true, false), (true, true)] {
        // Stored shapes of `op(a) [m=5, k=4]` and `op(b) [k=4, n=3]`.
        let (a2, b2): (&[usize], &[usize]) = (if ta { &[4, 5] } else { &[5, 4] }, if tb { &[3, 4] } else { &[4, 3] });
        let (am, ak) = if ta { (1, 0) } else { (0, 1) };
        let (bk, bn) = if tb { (1, 0) } else { (0, 1) };
        let (a3, b3): (&[usize], &[usize]) =
            (if ta { &[3, 4, 5] } else { &[3, 5, 4] }, if tb { &[3, 3, 4] } else { &[3, 4, 3] });
        let cases = vec![
            // (S(m), R) -> S(m), uneven m
            case(&[2, 2], vec![inp(a2, &[S(am), R]), inp(b2, &[R, R])], Some(&[S(0), R])),
            // (R, S(n)) -> S(n), uneven n
            case(&[2, 2], vec![inp(a2, &[R, R]), inp(b2, &[R, S(bn)])], Some(&[R, S(1)])),
            // (S(k), S(k)) -> Partial(sum), combined with S(m) on dp
            case(&[2, 2], vec![inp(a2, &[S(am), S(ak)]), inp(b2, &[R, S(bk)])], Some(&[S(0), p()])),
            // batched, batch dim sharded through both sides (uneven batch)
            case(&[2], vec![inp(a3, &[S(0)]), inp(b3, &[S(0)])], Some(&[S(0)])),
            // batched left, shared 2-D right
            case(&[2], vec![inp(a3, &[S(0)]), inp(b2, &[R])], Some(&[S(0)])),
            // disagreeing layouts: redistributed to the cheapest strategy
            case(&[3], vec![inp(a2, &[S(am)]), inp(b2, &[S(bn)])], None),
        ];
        check_op(&format!("matmul_t({ta}, {tb})"), &cases, true, &move |x| x[0].matmul_t(&x[1], ta, tb));
    }
}

/// `matmul_t` computes what `matmul` of explicitly transposed operands does.
#[test]
fn matmul_transposed_equals_explicit_transpose() {
    let r = dtensor_runtime::run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let t = |shape: &[usize], seed: f64| {
            let mut c = 0.0;
            let a = ndarray::ArrayD::from_shape_fn(shape, |_| {
                c += 1.0;
                (c * seed + 0.1).sin()
            });
            dtensor_runtime::distribute_tensor(&a, &mesh, &[R], None)
        };
        let mut worst = 0.0f64;
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            for batched_b in [false, true] {
                let a = t(if ta { &[2, 4, 5] } else { &[2, 5, 4] }, 0.5)?;
                let bs: &[usize] = match (tb, batched_b) {
                    (true, true) => &[2, 3, 4],
                    (true, false) => &[3, 4],
                    (false, true) => &[2, 4, 3],
                    (false, false) => &[4, 3],
                };
                let b = t(bs, 0.25)?;
                let op =
                    |x: &dtensor_runtime::DTensor<f64>, f: bool| if f { x.transpose(-1, -2) } else { Ok(x.clone()) };
                let want = op(&a, ta)?.matmul(&op(&b, tb)?)?.full_tensor()?;
                let got = a.matmul_t(&b, ta, tb)?.full_tensor()?;
                assert_eq!(got.shape(), want.shape());
                worst = got.iter().zip(want.iter()).map(|(g, w)| (g - w).abs()).fold(worst, f64::max);
            }
        }
        Ok(worst)
    })
    .unwrap();
    assert!(r[0] < 1e-12, "matmul_t differs from matmul of transposes by {}", r[0]);
}

#[test]
fn shape_errors_are_typed() {
    let r = dtensor_runtime::run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let a = dtensor_runtime::zeros::<f32>(&[2, 3], &dtensor_runtime::TensorOptions::new().mesh(&mesh))?;
        Ok(a.matmul(&a).err())
    })
    .unwrap();
    assert!(matches!(r[0], Some(dtensor_runtime::Error::ShapeMismatch { .. })), "{:?}", r[0]);
}

/// `linear` (x·Wᵀ + b, weights `[out, in]`): column-parallel, row-parallel, batch-sharded and
/// disagreeing layouts, with and without bias, against the single-rank result.
#[test]
fn linear() {
    let cases = vec![
        // column-parallel: W S(0) -> output features sharded (uneven: 5 over 2)
        case(
            &[2, 2],
            vec![inp(&[3, 4], &[S(0), R]), inp(&[5, 4], &[R, S(0)]), inp(&[5], &[R, S(0)])],
            Some(&[S(0), S(1)]),
        ),
        // row-parallel: x S(last), W S(1) -> Partial(sum)
        case(&[2, 2], vec![inp(&[2, 3, 6], &[S(0), S(2)]), inp(&[4, 6], &[R, S(1)]), inp(&[4], &[R, R])], None),
        // batch sharded, uneven over 3 with an empty shard
        case(&[3], vec![inp(&[2, 4], &[S(0)]), inp(&[3, 4], &[R]), inp(&[3], &[R])], Some(&[S(0)])),
        // disagreeing: W sharded on its input features with a replicated input
        case(&[2], vec![inp(&[3, 4], &[R]), inp(&[5, 4], &[S(1)]), inp(&[5], &[S(0)])], None),
    ];
    check_op("linear(bias)", &cases, true, &|x| x[0].linear(&x[1], Some(&x[2])));
    let no_bias: Vec<_> = cases
        .into_iter()
        .map(|mut c| {
            c.inputs.pop();
            c
        })
        .collect();
    check_op("linear", &no_bias, true, &|x| x[0].linear(&x[1], None));
}
