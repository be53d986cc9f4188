//! embedding / one_hot, forward and the table's gradient, on several layouts.

mod ops_util;

use dtensor_runtime::{Partial, Placement, ReduceOp, Replicate as R, Shard as S};
use ops_util::{case, check_op, ids, inp};

fn p() -> Placement {
    Partial(ReduceOp::Sum)
}

#[test]
fn embedding() {
    let cases = vec![
        // vocab-parallel table: masked lookup, Partial(sum) output
        case(&[2, 2], vec![inp(&[7, 4], &[S(0), R]), ids(&[5], &[R, R], 7)], Some(&[p(), R])),
        // dim-sharded table, batch-sharded ids
        case(&[2, 2], vec![inp(&[7, 4], &[R, S(1)]), ids(&[5], &[S(0), R], 7)], Some(&[S(0), S(1)])),
        // uneven vocab over 3 ranks, 2-d ids
        case(&[3], vec![inp(&[7, 3], &[S(0)]), ids(&[2, 3], &[R], 7)], Some(&[p()])),
        // replicated table, ids sharded on their second dim
        case(&[2, 2], vec![inp(&[6, 2], &[R, R]), ids(&[2, 5], &[R, S(1)], 6)], Some(&[R, S(1)])),
    ];
    check_op("embedding", &cases, true, &|x| x[0].embedding(&x[1]));
}

#[test]
fn out_of_range_ids_are_an_error() {
    let r = dtensor_runtime::run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let w = dtensor_runtime::zeros::<f32>(&[4, 2], &dtensor_runtime::TensorOptions::new().mesh(&mesh))?;
        let bad = dtensor_runtime::full::<f32>(&[3], 4.0, &dtensor_runtime::TensorOptions::new().mesh(&mesh))?;
        Ok(w.embedding(&bad).err())
    })
    .unwrap();
    assert!(matches!(r[0], Some(dtensor_runtime::Error::InvalidArgument { .. })), "{:?}", r[0]);
}
