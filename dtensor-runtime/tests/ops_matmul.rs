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
