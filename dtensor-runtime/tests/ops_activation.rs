//! Activations and element-wise math (silu, sigmoid, softplus, pow, rsqrt, abs, clamp, both
//! GELU forms, swiglu), forward and every input gradient against the single-rank result on
//! every layout case (uneven and empty shards, Partial inputs reduced first); finite
//! differences in f64 on each op's first case.

mod ops_util;

use dtensor_runtime::ops::GeluApproximate;
use dtensor_runtime::{Partial, ReduceOp, Replicate as R, Shard as S};
use ops_util::{case, check_op, inp, unary_cases};

#[test]
fn silu() {
    check_op("silu", &unary_cases(false, false), true, &|x| x[0].silu());
}

#[test]
fn sigmoid() {
    check_op("sigmoid", &unary_cases(false, false), true, &|x| x[0].sigmoid());
}

#[test]
fn softplus() {
    check_op("softplus", &unary_cases(false, false), true, &|x| x[0].softplus());
    // beta·x above the threshold is the identity branch (inputs in [-2, 2], beta 3 → some > 1).
    check_op("softplus(beta=3, threshold=1)", &unary_cases(false, false), true, &|x| x[0].softplus_with(3.0, 1.0));
}

#[test]
fn pow() {
    check_op("pow(2)", &unary_cases(false, false), true, &|x| x[0].pow(2.0));
    check_op("pow(3)", &unary_cases(false, false), true, &|x| x[0].pow(3.0));
    check_op("pow(-1.5)", &unary_cases(true, false), true, &|x| x[0].pow(-1.5));
}

#[test]
fn rsqrt() {
    check_op("rsqrt", &unary_cases(true, false), true, &|x| x[0].rsqrt());
}

#[test]
fn abs() {
    check_op("abs", &unary_cases(false, false), true, &|x| x[0].abs());
}

#[test]
fn clamp() {
    check_op("clamp(-1, 0.5)", &unary_cases(false, false), true, &|x| x[0].clamp(Some(-1.0), Some(0.5)));
    check_op("clamp(min=0.3)", &unary_cases(false, false), true, &|x| x[0].clamp(Some(0.3), None));
    check_op("clamp(max=-0.2)", &unary_cases(false, false), true, &|x| x[0].clamp(None, Some(-0.2)));
}

#[test]
fn gelu_both_forms() {
    check_op("gelu(approximate=none)", &unary_cases(false, false), true, &|x| x[0].gelu_with(GeluApproximate::None));
    check_op("gelu(approximate=tanh)", &unary_cases(false, false), true, &|x| {
        x[0].gelu_with("tanh".parse::<GeluApproximate>()?)
    });
}

#[test]
fn swiglu() {
    let p = Partial(ReduceOp::Sum);
    let cases = vec![
        // Megatron layout: both projections column-sharded on the hidden dim.
        case(&[2, 2], vec![inp(&[5, 6], &[S(0), S(1)]), inp(&[5, 6], &[S(0), S(1)])], Some(&[S(0), S(1)])),
        case(&[3], vec![inp(&[7, 2], &[S(0)]), inp(&[7, 2], &[S(0)])], Some(&[S(0)])),
        // empty shard: 3 columns over 4 ranks on one dim
        case(&[2, 2], vec![inp(&[2, 3], &[S(1), S(1)]), inp(&[2, 3], &[S(1), S(1)])], Some(&[S(1), S(1)])),
        // Partial gate: reduced before the silu; the product with a Replicate `up` stays local
        case(&[2, 2], vec![inp(&[4, 3], &[p, R]), inp(&[4, 3], &[R, R])], None),
        case(&[2, 2], vec![inp(&[4, 3], &[S(1), R]), inp(&[4, 3], &[R, S(0)])], None),
    ];
    check_op("swiglu", &cases, true, &|x| x[0].swiglu(&x[1]));
}

/// Values of the reference formulas computed outside this crate (f64).
#[test]
fn values_match_pytorch() {
    use dtensor_runtime::ndarray::{arr1, ArrayD};
    use dtensor_runtime::{distribute_tensor, run};
    let x = arr1(&[-2.0f64, -0.5, 0.0, 1.0, 3.0]).into_dyn();
    let got = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let d = distribute_tensor(&x, &mesh, &[R], None)?;
        let f = |y: dtensor_runtime::DTensor<f64>| y.full_tensor();
        Ok(vec![
            f(d.silu()?)?,
            f(d.sigmoid()?)?,
            f(d.softplus()?)?,
            f(d.gelu_with(GeluApproximate::None)?)?,
            f(d.gelu_with(GeluApproximate::Tanh)?)?,
        ])
    })
    .unwrap()
    .remove(0);
    // Python's `math` module (math.exp, math.log1p, math.erf, math.tanh) on the textbook
    // formulas of PyTorch's silu, sigmoid, softplus, gelu and gelu(approximate="tanh").
    let want: [[f64; 5]; 5] = [
        [-0.2384058440442351, -0.1887703343990727, 0.0, 0.7310585786300049, 2.8577223804673],
        [0.11920292202211755, 0.3775406687981454, 0.5, 0.7310585786300049, 0.9525741268224334],
        [0.1269280110429725, 0.4740769841801067, std::f64::consts::LN_2, 1.3132616875182228, 3.048587351573742],
        [-0.04550026389635842, -0.15426876936299344, 0.0, 0.8413447460685429, 2.99595030590511],
        [-0.04540230591222494, -0.15428599017485606, 0.0, 0.8411919906082768, 2.996362607918227],
    ];
    for (g, w) in got.iter().zip(want) {
        let w = ArrayD::from_shape_vec(vec![5], w.to_vec()).unwrap();
        assert!(g.iter().zip(&w).all(|(a, b)| (a - b).abs() < 1e-12), "{g} vs {w}");
    }
}

#[test]
fn bad_arguments_are_typed_errors() {
    use dtensor_runtime::{distribute_tensor, run, Error};
    let out = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let d = distribute_tensor(dtensor_runtime::ndarray::ArrayD::<f64>::zeros(vec![3]), &mesh, &[R], None)?;
        Ok((d.clamp(None, None).err(), d.softplus_with(0.0, 20.0).err(), "erf".parse::<GeluApproximate>().err()))
    })
    .unwrap();
    let (a, b, c) = &out[0];
    assert!(matches!(a, Some(Error::InvalidArgument { .. })), "{a:?}");
    assert!(matches!(b, Some(Error::InvalidArgument { .. })), "{b:?}");
    assert!(matches!(c, Some(Error::InvalidArgument { .. })), "{c:?}");
}
