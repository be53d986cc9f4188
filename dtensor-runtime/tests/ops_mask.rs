//! Masking and selection: comparison masks, where, masked_fill, tril/triu, the causal-mask
//! factory, min/min_dim, argmax/argmin, and NaN / empty-dim behaviour of max and min
//! (PyTorch: NaN propagates, an empty reduced dim is an error).

mod ops_util;

use dtensor_runtime::ndarray::{arr1, ArrayD, IxDyn};
use dtensor_runtime::{
    causal_mask, distribute_tensor, run, DTensor, Error, Partial, Placement, ReduceOp, Replicate as R, Shard as S,
    TensorOptions,
};
use ops_util::{case, check_op, ids, inp, Case};

fn p() -> Placement {
    Partial(ReduceOp::Sum)
}

fn pmin() -> Placement {
    Partial(ReduceOp::Min)
}

fn binary_cases() -> Vec<Case> {
    vec![
        case(&[2, 2], vec![inp(&[4, 6], &[S(0), S(1)]), inp(&[4, 6], &[S(0), S(1)])], Some(&[S(0), S(1)])),
        case(&[2, 2], vec![inp(&[5, 3], &[S(0), R]), inp(&[3], &[R, R])], Some(&[S(0), R])),
        case(&[3], vec![inp(&[5, 4], &[S(0)]), inp(&[5, 4], &[S(0)])], Some(&[S(0)])),
        case(&[2, 2], vec![inp(&[2, 3], &[S(1), S(1)]), inp(&[2, 3], &[S(1), S(1)])], Some(&[S(1), S(1)])),
        case(&[3], vec![inp(&[4, 5], &[S(0)]), inp(&[4, 5], &[S(1)])], None),
        // a Partial operand is reduced first (a comparison is not linear)
        case(&[2, 2], vec![inp(&[3, 5], &[p(), R]), inp(&[3, 5], &[R, R])], None),
    ]
}

#[test]
fn comparisons() {
    check_op("lt_mask", &binary_cases(), false, &|x| x[0].lt_mask(&x[1]));
    check_op("le_mask", &binary_cases(), false, &|x| x[0].le_mask(&x[1]));
    check_op("gt_mask", &binary_cases(), false, &|x| x[0].gt_mask(&x[1]));
    check_op("ge_mask", &binary_cases(), false, &|x| x[0].ge_mask(&x[1]));
    check_op("ne_mask", &binary_cases(), false, &|x| x[0].ne_mask(&x[0].mul(&x[1])?.add(&x[1])?));
    check_op("eq_mask", &binary_cases(), false, &|x| x[0].eq_mask(&x[0].relu()?));
}

fn where_cases() -> Vec<Case> {
    vec![
        case(
            &[2, 2],
            vec![ids(&[4, 6], &[S(0), S(1)], 2), inp(&[4, 6], &[S(0), S(1)]), inp(&[4, 6], &[S(0), S(1)])],
            Some(&[S(0), S(1)]),
        ),
        // broadcast mask (a row), broadcast other (a column); uneven rows
        case(
            &[2, 2],
            vec![ids(&[3], &[R, R], 2), inp(&[5, 3], &[S(0), R]), inp(&[5, 1], &[S(0), R])],
            Some(&[S(0), R]),
        ),
        case(&[3], vec![ids(&[7], &[S(0)], 2), inp(&[7], &[S(0)]), inp(&[7], &[S(0)])], Some(&[S(0)])),
        // empty shard and disagreeing layouts
        case(&[2, 2], vec![ids(&[2, 3], &[S(1), S(1)], 2), inp(&[2, 3], &[R, S(0)]), inp(&[2, 3], &[S(1), R])], None),
        case(&[2, 2], vec![ids(&[3, 4], &[R, R], 2), inp(&[3, 4], &[p(), R]), inp(&[3, 4], &[R, S(1)])], None),
    ]
}

#[test]
fn where_() {
    check_op("where", &where_cases(), true, &|x| x[1].where_(&x[0], &x[2]));
}

#[test]
fn masked_fill() {
    let cases = vec![
        case(&[2, 2], vec![inp(&[4, 6], &[S(0), S(1)]), ids(&[4, 6], &[S(0), S(1)], 2)], Some(&[S(0), S(1)])),
        case(&[2, 2], vec![inp(&[5, 3], &[S(0), R]), ids(&[3], &[R, R], 2)], Some(&[S(0), R])),
        case(&[3], vec![inp(&[2, 7], &[S(1)]), ids(&[2, 7], &[S(1)], 2)], Some(&[S(1)])),
        case(&[2, 2], vec![inp(&[2, 3], &[S(1), S(1)]), ids(&[2, 3], &[S(1), S(1)], 2)], Some(&[S(1), S(1)])),
        case(&[2, 2], vec![inp(&[3, 4], &[p(), R]), ids(&[3, 4], &[R, S(0)], 2)], None),
    ];
    check_op("masked_fill(2.5)", &cases, true, &|x| x[0].masked_fill(&x[1], 2.5));
}

fn tri_cases() -> Vec<Case> {
    vec![
        // both matrix dims sharded, uneven: the kernel uses the global offsets, no comm
        case(&[2, 2], vec![inp(&[5, 7], &[S(0), S(1)])], Some(&[S(0), S(1)])),
        case(&[2, 2], vec![inp(&[2, 5, 3], &[S(0), S(2)])], Some(&[S(0), S(2)])),
        case(&[3], vec![inp(&[7, 4], &[S(0)])], Some(&[S(0)])),
        // empty shard
        case(&[2, 2], vec![inp(&[3, 3], &[S(1), S(1)])], Some(&[S(1), S(1)])),
        // linear: Partial(sum) stays
        case(&[2, 2], vec![inp(&[4, 5], &[p(), S(1)])], Some(&[p(), S(1)])),
    ]
}

#[test]
fn tril_triu() {
    check_op("tril(0)", &tri_cases(), true, &|x| x[0].tril(0));
    check_op("tril(-1)", &tri_cases(), true, &|x| x[0].tril(-1));
    check_op("triu(1)", &tri_cases(), true, &|x| x[0].triu(1));
    check_op("triu(-2)", &tri_cases(), true, &|x| x[0].triu(-2));
}

#[test]
fn min() {
    let cases = vec![
        case(&[2, 2], vec![inp(&[5, 4], &[S(0), R])], Some(&[pmin(), R])),
        case(&[3], vec![inp(&[5, 4], &[S(1)])], Some(&[S(0)])),
        case(&[2, 2], vec![inp(&[3, 5], &[S(1), S(1)])], Some(&[S(0), S(0)])),
        case(&[2, 2], vec![inp(&[3, 5], &[S(0), S(0)])], Some(&[pmin(), pmin()])),
        case(&[2, 2], vec![inp(&[3, 5], &[p(), R])], None),
    ];
    check_op("min_dim(0)", &cases, true, &|x| x[0].min_dim(0, false));
    let all = vec![
        case(&[3], vec![inp(&[7], &[S(0)])], Some(&[pmin()])),
        case(&[2, 2], vec![inp(&[3, 5], &[S(0), S(1)])], Some(&[pmin(), pmin()])),
        case(&[2, 2], vec![inp(&[3, 5], &[R, R])], Some(&[R, R])),
    ];
    check_op("min", &all, true, &|x| x[0].min());
}

fn arg_cases() -> Vec<Case> {
    vec![
        // not sharded on the reduced dim: local
        case(&[2, 2], vec![inp(&[5, 4], &[S(0), R])], Some(&[S(0), R])),
        case(&[3], vec![inp(&[7, 3], &[S(0)])], Some(&[S(0)])),
        // sharded on it: replicated first
        case(&[2, 2], vec![inp(&[3, 5], &[S(1), S(0)])], None),
        case(&[2, 2], vec![inp(&[3, 5], &[p(), R])], None),
    ]
}

#[test]
fn argmax_argmin() {
    // The indices are i64 (PyTorch); compared as f64, exact at these sizes.
    check_op("argmax(-1)", &arg_cases(), false, &|x| x[0].argmax(-1, false)?.cast());
    check_op("argmin(-1, keepdim)", &arg_cases(), false, &|x| x[0].argmin(-1, true)?.cast());
}

/// Runs `f` on a 1-D tensor with NaN at index 1 on a 3-rank mesh for both placements.
fn on_nan_tensor<R: Send>(f: impl Fn(&DTensor<f64>) -> dtensor_runtime::Result<R> + Sync) -> Vec<Vec<R>> {
    let x = arr1(&[1.0, f64::NAN, 3.0, -2.0, 0.5]).into_dyn();
    run(3, |ctx| {
        let mesh = ctx.init_device_mesh(&[3], &["x"])?;
        [R, S(0)].iter().map(|pl| f(&distribute_tensor(&x, &mesh, &[*pl], None)?)).collect()
    })
    .unwrap()
}

#[test]
fn max_min_and_argmax_propagate_nan() {
    for per_rank in on_nan_tensor(|d| Ok(vec![d.max()?.full_tensor()?, d.min()?.full_tensor()?])) {
        for v in per_rank.iter().flatten() {
            assert!(v.iter().all(|x| x.is_nan()), "{v}");
        }
    }
    for per_rank in on_nan_tensor(|d| {
        let m = d.reshape(&[1, 5])?;
        Ok(vec![
            m.max_dim(1, false)?.full_tensor()?,
            m.argmax(1, false)?.cast()?.full_tensor()?,
            m.argmin(1, false)?.cast()?.full_tensor()?,
        ])
    }) {
        for v in per_rank {
            assert!(v[0][0].is_nan());
            assert_eq!((v[1][0], v[2][0]), (1.0, 1.0), "a NaN is both argmax and argmin (PyTorch)");
        }
    }
}

#[test]
fn empty_reductions_without_identity_are_errors() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let e = distribute_tensor(ArrayD::<f64>::zeros(IxDyn(&[3, 0])), &mesh, &[S(0)], None)?;
        let errs = vec![
            e.max().err(),
            e.min().err(),
            e.max_dim(1, false).err(),
            e.argmax(1, false).err(),
            e.argmin(-1, true).err(),
        ];
        // Reducing a non-empty dim of a tensor with an empty dim is fine (an empty result).
        let ok = e.max_dim(0, false)?.shape().to_vec();
        Ok((errs, ok))
    })
    .unwrap();
    for (errs, ok) in out {
        for e in errs {
            assert!(matches!(e, Some(Error::InvalidArgument { .. })), "{e:?}");
        }
        assert_eq!(ok, vec![0]);
    }
}

#[test]
fn causal_mask_builds_only_the_local_shard() {
    let full: ArrayD<f64> = ArrayD::from_shape_fn(IxDyn(&[5, 7]), |ix| if ix[1] <= ix[0] { 1.0 } else { 0.0 });
    for pl in [[S(0), S(1)], [S(1), R], [R, R], [S(0), S(0)]] {
        let out = run(4, |ctx| {
            let mesh = ctx.init_device_mesh(&[2, 2], &["a", "b"])?;
            let m = causal_mask::<f64>(5, 7, &TensorOptions::new().mesh(&mesh).placements(&pl))?;
            let want = distribute_tensor(&full, &mesh, &pl, None)?;
            Ok(m.to_host()? == want.to_host()? && m.full_tensor()? == full)
        })
        .unwrap();
        assert!(out.iter().all(|&b| b), "{pl:?}");
    }
}

/// Attention scores masked with -inf through the causal mask, then softmax: each row sums
/// to 1 over its visible keys, sharded or not.
#[test]
fn causal_softmax_with_negative_infinity() {
    let x = ops_util::values(&[4, 4], ops_util::Kind::Real, 3);
    let rows = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["a", "b"])?;
        let s = distribute_tensor(&x, &mesh, &[S(0), R], None)?;
        let keep = causal_mask::<f64>(4, 4, &TensorOptions::new().mesh(&mesh).placements(&[S(0), R]))?;
        let zero = distribute_tensor(ArrayD::<f64>::zeros(IxDyn(&[])), &mesh, &[R, R], None)?;
        let hidden = keep.eq_mask(&zero)?;
        s.masked_fill(&hidden, f64::NEG_INFINITY)?.softmax(-1)?.full_tensor()
    })
    .unwrap();
    let y = &rows[0];
    for i in 0..4 {
        let e: Vec<f64> = (0..=i).map(|j| x[[i, j]].exp()).collect();
        let z: f64 = e.iter().sum();
        for j in 0..4 {
            let want = if j <= i { e[j] / z } else { 0.0 };
            assert!((y[[i, j]] - want).abs() < 1e-12, "({i}, {j})");
        }
    }
}
