//! Reductions (sum/mean/max over dims and all), forward and backward, on several layouts.

mod ops_util;

use dtensor_runtime::{Partial, Placement, ReduceOp, Replicate as R, Shard as S};
use ops_util::{case, check_op, inp};

fn p() -> Placement {
    Partial(ReduceOp::Sum)
}

fn pmax() -> Placement {
    Partial(ReduceOp::Max)
}

#[test]
fn sum_dim() {
    let cases = [
        case(&[2, 2], vec![inp(&[5, 4], &[S(0), R])], Some(&[p(), R])),
        case(&[2, 2], vec![inp(&[5, 4], &[S(0), S(1)])], Some(&[S(0), p()])),
        case(&[3], vec![inp(&[7, 2], &[S(0)])], Some(&[p()])),
        case(&[2, 2], vec![inp(&[3, 5], &[p(), S(0)])], Some(&[p(), S(0)])),
    ];
    check_op("sum_dim(0)", &cases[..1], true, &|x| x[0].sum_dim(0, false));
    check_op("sum_dim(1, keepdim)", &cases[1..2], true, &|x| x[0].sum_dim(1, true));
    check_op("sum_dim(-2)", &cases[2..3], true, &|x| x[0].sum_dim(-2, false));
    check_op("sum_dim(1) of P", &cases[3..], true, &|x| x[0].sum_dim(1, false));
    let more = vec![
        case(&[2, 2], vec![inp(&[3, 4, 5], &[S(1), S(2)])], Some(&[S(1), p()])),
        case(&[2, 2], vec![inp(&[3, 4, 5], &[S(2), S(2)])], None),
    ];
    check_op("sum_dim(2) 3-d", &more, true, &|x| x[0].sum_dim(2, false));
}

#[test]
fn sum_all_and_mean() {
    let cases = vec![
        case(&[2, 2], vec![inp(&[5, 3], &[S(0), S(1)])], Some(&[p(), p()])),
        case(&[3], vec![inp(&[2, 5], &[S(1)])], Some(&[p()])),
        case(&[2, 2], vec![inp(&[4], &[R, R])], Some(&[R, R])),
    ];
    check_op("sum", &cases, true, &|x| x[0].sum());
    check_op("mean", &cases, true, &|x| x[0].mean());
    let dims = [
        case(&[2, 2], vec![inp(&[5, 3], &[S(0), R])], Some(&[p(), R])),
        case(&[3], vec![inp(&[5, 3], &[S(1)])], Some(&[S(0)])),
        case(&[2, 2], vec![inp(&[5, 3], &[p(), S(0)])], Some(&[p(), p()])),
    ];
    check_op("mean_dim(0)", &dims[..1], true, &|x| x[0].mean_dim(0, false));
    check_op("mean_dim(0) uneven", &dims[1..], true, &|x| x[0].mean_dim(0, false));
}

#[test]
fn max() {
    let cases = vec![
        case(&[2, 2], vec![inp(&[5, 4], &[S(0), R])], Some(&[pmax(), R])),
        case(&[3], vec![inp(&[5, 4], &[S(1)])], Some(&[S(0)])),
        case(&[2, 2], vec![inp(&[3, 5], &[S(1), S(1)])], Some(&[S(0), S(0)])),
        case(&[2, 2], vec![inp(&[3, 5], &[S(0), S(0)])], Some(&[pmax(), pmax()])),
        // max of a Partial(sum) is not a rule: the input is reduced first
        case(&[2, 2], vec![inp(&[3, 5], &[p(), R])], None),
    ];
    check_op("max_dim(0)", &cases, true, &|x| x[0].max_dim(0, false));
    let all = vec![
        case(&[3], vec![inp(&[7], &[S(0)])], Some(&[pmax()])),
        case(&[2, 2], vec![inp(&[3, 5], &[S(0), S(1)])], Some(&[pmax(), pmax()])),
        case(&[2, 2], vec![inp(&[3, 5], &[R, R])], Some(&[R, R])),
    ];
    check_op("max", &all, true, &|x| x[0].max());
}
