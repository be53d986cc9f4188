//! Pointwise ops, forward and backward, against the single-rank result on several layouts
//! (uneven shapes included); finite-difference gradient check in f64 on each op's first case.

mod ops_util;

use dtensor_runtime::{Partial, Placement, ReduceOp, Replicate as R, Shard as S};
use ops_util::{case, check_op, inp, pos, unary_cases, Case};

fn p() -> Placement {
    Partial(ReduceOp::Sum)
}

fn binary_cases(positive_rhs: bool, partial_rhs: bool) -> Vec<Case> {
    let rhs = |shape: &[usize], pl: &[Placement]| if positive_rhs { pos(shape, pl) } else { inp(shape, pl) };
    let mut v = vec![
        case(&[2, 2], vec![inp(&[4, 6], &[S(0), S(1)]), rhs(&[4, 6], &[S(0), S(1)])], Some(&[S(0), S(1)])),
        // uneven rows, broadcast row vector
        case(&[2, 2], vec![inp(&[5, 3], &[S(0), R]), rhs(&[3], &[R, R])], Some(&[S(0), R])),
        // uneven over 3 ranks
        case(&[3], vec![inp(&[5, 4], &[S(0)]), rhs(&[5, 4], &[S(0)])], Some(&[S(0)])),
        // disagreeing layouts: the op redistributes
        case(&[3], vec![inp(&[4, 5], &[S(0)]), rhs(&[4, 5], &[S(1)])], None),
        // broadcast column
        case(&[2, 2], vec![inp(&[5, 3], &[S(1), S(0)]), rhs(&[5, 1], &[R, S(0)])], Some(&[S(1), S(0)])),
    ];
    v.push(if partial_rhs {
        case(&[2, 2], vec![inp(&[5, 7], &[p(), S(1)]), rhs(&[5, 7], &[p(), S(1)])], Some(&[p(), S(1)]))
    } else {
        case(&[3], vec![inp(&[4, 5], &[p()]), rhs(&[4, 5], &[R])], Some(&[p()]))
    });
    v
}

#[test]
fn add() {
    check_op("add", &binary_cases(false, true), true, &|x| x[0].add(&x[1]));
}

#[test]
fn sub() {
    check_op("sub", &binary_cases(false, true), true, &|x| x[0].sub(&x[1]));
}

#[test]
fn mul() {
    let mut cases = binary_cases(false, false);
    // R * P -> P, P * P is illegal (one side is reduced first)
    cases.push(case(&[3], vec![inp(&[4, 5], &[R]), inp(&[4, 5], &[p()])], Some(&[p()])));
    cases.push(case(&[2, 2], vec![inp(&[3, 5], &[p(), R]), inp(&[3, 5], &[p(), R])], None));
    check_op("mul", &cases, true, &|x| x[0].mul(&x[1]));
}

#[test]
fn div() {
    let mut cases = binary_cases(true, false);
    // R / P is illegal: the divisor is reduced first
    cases.push(case(&[3], vec![inp(&[4, 5], &[R]), pos(&[4, 5], &[R])], Some(&[R])));
    check_op("div", &cases, true, &|x| x[0].div(&x[1]));
}

#[test]
fn neg() {
    check_op("neg", &unary_cases(false, true), true, &|x| x[0].neg());
}

#[test]
fn exp() {
    check_op("exp", &unary_cases(false, false), true, &|x| x[0].exp());
}

#[test]
fn log() {
    check_op("log", &unary_cases(true, false), true, &|x| x[0].log());
}

#[test]
fn relu() {
    check_op("relu", &unary_cases(false, false), true, &|x| x[0].relu());
}

#[test]
fn gelu() {
    check_op("gelu", &unary_cases(false, false), true, &|x| x[0].gelu());
}

#[test]
fn tanh() {
    check_op("tanh", &unary_cases(false, false), true, &|x| x[0].tanh());
}

#[test]
fn sqrt() {
    check_op("sqrt", &unary_cases(true, false), true, &|x| x[0].sqrt());
}

#[test]
fn scalar_ops() {
    check_op("mul_scalar", &unary_cases(false, true), true, &|x| x[0].mul_scalar(-1.5));
    check_op("div_scalar", &unary_cases(false, true), true, &|x| x[0].div_scalar(4.0));
    check_op("add_scalar", &unary_cases(false, false), true, &|x| x[0].add_scalar(0.25));
    check_op("sub_scalar", &unary_cases(false, false), true, &|x| x[0].sub_scalar(3.0));
}

#[test]
fn relu_of_partial_reduces_first() {
    // The dynamic op redistributes P -> R (all-reduce) before a nonlinear op; the result is
    // what relu of the reduced value is, not the sum of relus.
    let cases = vec![case(&[3], vec![inp(&[4, 3], &[p()])], None)];
    let lines = check_op("relu(P)", &cases, false, &|x| x[0].relu());
    assert!(lines[0].contains("-> (R)"), "{}", lines[0]);
}
