//! transpose / reshape / unsqueeze / expand, forward and backward, on several layouts.

mod ops_util;

use dtensor_runtime::{Partial, Placement, ReduceOp, Replicate as R, Shard as S};
use ops_util::{case, check_op, inp};

fn p() -> Placement {
    Partial(ReduceOp::Sum)
}

#[test]
fn transpose() {
    let cases = vec![
        case(&[2, 2], vec![inp(&[5, 3], &[S(0), S(1)])], Some(&[S(1), S(0)])),
        case(&[2, 2], vec![inp(&[3, 4, 5], &[S(2), p()])], Some(&[S(0), p()])),
        case(&[3], vec![inp(&[7, 2], &[S(0)])], Some(&[S(1)])),
        case(&[2, 2], vec![inp(&[2, 5, 3], &[R, S(1)])], Some(&[R, S(1)])),
    ];
    check_op("transpose(0, -1)", &cases, true, &|x| x[0].transpose(0, -1));
}

#[test]
fn reshape() {
    // merge with an evenly divisible leading dim keeps the shard
    check_op("reshape [4,6]->[24]", &[case(&[2, 2], vec![inp(&[4, 6], &[S(0), R])], Some(&[S(0), R]))], true, &|x| {
        x[0].reshape(&[-1])
    });
    // split of the sharded trailing dim
    check_op(
        "reshape [3,6]->[3,2,3]",
        &[case(&[2, 2], vec![inp(&[3, 6], &[R, S(1)])], Some(&[R, S(1)]))],
        true,
        &|x| x[0].reshape(&[3, 2, 3]),
    );
    // a 1-to-1 group keeps an uneven shard
    check_op("reshape [2,3,5]->[6,5]", &[case(&[3], vec![inp(&[2, 3, 5], &[S(2)])], Some(&[S(1)]))], true, &|x| {
        x[0].reshape(&[6, 5])
    });
    // uneven merge cannot keep the shard: redistributed
    check_op("reshape [5,6]->[30]", &[case(&[2, 2], vec![inp(&[5, 6], &[S(0), R])], None)], true, &|x| {
        x[0].reshape(&[30])
    });
    // Partial passes through
    check_op("reshape P", &[case(&[3], vec![inp(&[2, 6], &[p()])], Some(&[p()]))], true, &|x| x[0].reshape(&[3, 4]));
}

#[test]
fn unsqueeze_and_expand() {
    let cases = vec![
        case(&[3], vec![inp(&[5, 2], &[S(0)])], Some(&[S(0)])),
        case(&[2, 2], vec![inp(&[3, 5], &[S(1), S(0)])], Some(&[S(2), S(0)])),
        case(&[2, 2], vec![inp(&[3, 5], &[p(), R])], Some(&[p(), R])),
    ];
    check_op("unsqueeze(1)", &cases, true, &|x| x[0].unsqueeze(1));
    let ex = [
        case(&[2, 2], vec![inp(&[1, 4], &[R, S(1)])], Some(&[R, S(1)])),
        case(&[3], vec![inp(&[5, 1], &[S(0)])], Some(&[S(1)])),
        case(&[2, 2], vec![inp(&[1, 4], &[p(), R])], Some(&[p(), R])),
    ];
    check_op("expand", &ex[..1], true, &|x| x[0].expand(&[3, 4]));
    check_op("expand", &ex[1..2], true, &|x| x[0].expand(&[2, 5, 3]));
    check_op("expand", &ex[2..], true, &|x| x[0].expand(&[3, 4]));
}
