//! Shape ops: narrow/slice, split/chunk, cat/stack, permute, contiguous, flatten/unflatten,
//! squeeze, repeat/repeat_interleave, index_select/gather — forward and every input
//! gradient against the single-rank result (uneven and empty shards), finite differences in
//! f64 on each op's first case.

mod ops_util;

use dtensor_runtime::{cat, stack, Partial, Placement, ReduceOp, Replicate as R, Shard as S};
use ops_util::{case, check_op, ids, inp};

fn p() -> Placement {
    Partial(ReduceOp::Sum)
}

#[test]
fn narrow_and_slice() {
    let cases = vec![
        // not sharded on the sliced dim: local
        case(&[2, 2], vec![inp(&[5, 6], &[S(0), R])], Some(&[S(0), R])),
        case(&[3], vec![inp(&[7, 6], &[S(0)])], Some(&[S(0)])),
        // sharded on it: Replicate first
        case(&[2, 2], vec![inp(&[4, 6], &[S(0), S(1)])], None),
        case(&[2, 2], vec![inp(&[2, 5], &[S(1), S(1)])], None),
        // linear: Partial stays
        case(&[2, 2], vec![inp(&[3, 6], &[p(), S(0)])], Some(&[p(), S(0)])),
    ];
    check_op("narrow(1, 1, 3)", &cases, true, &|x| x[0].narrow(1, 1, 3));
    check_op("slice(-1, -4, -1)", &cases, true, &|x| x[0].slice(-1, -4, -1));
    check_op("slice(1, 2, 99)", &cases, true, &|x| x[0].slice(1, 2, 99));
    // the whole dim is a no-op: a shard of it stays
    let whole = vec![case(&[2, 2], vec![inp(&[3, 5], &[S(1), S(1)])], Some(&[S(1), S(1)]))];
    check_op("narrow(1, 0, 5)", &whole, true, &|x| x[0].narrow(1, 0, 5));
}

#[test]
fn split_chunk_and_cat() {
    let cases = vec![
        case(&[2, 2], vec![inp(&[5, 7], &[S(0), R])], None),
        case(&[2, 2], vec![inp(&[4, 7], &[S(0), S(1)])], None),
        case(&[3], vec![inp(&[2, 7], &[S(1)])], None),
        case(&[2, 2], vec![inp(&[3, 7], &[p(), R])], None),
    ];
    check_op("cat(reversed(chunk(3, 1)))", &cases, true, &|x| {
        let v = x[0].chunk(3, 1)?;
        cat(&[&v[2], &v[1], &v[0]], 1)
    });
    check_op("split(2, -1) pieces scaled", &cases, true, &|x| {
        let v = x[0].split(2, -1)?;
        let scaled: Vec<_> =
            v.iter().enumerate().map(|(i, t)| t.mul_scalar(i as f64 + 1.0)).collect::<Result<_, _>>()?;
        cat(&scaled.iter().collect::<Vec<_>>(), -1)
    });
    check_op("split_with_sizes([1, 0, 6], 1)[2]", &cases, true, &|x| {
        Ok(x[0].split_with_sizes(&[1, 0, 6], 1)?.remove(2))
    });
}

#[test]
fn cat_and_stack() {
    let cases = vec![
        // sharded on another dim: kept
        case(&[2, 2], vec![inp(&[5, 2], &[S(0), R]), inp(&[5, 3], &[S(0), R])], Some(&[S(0), R])),
        case(&[3], vec![inp(&[7, 1], &[S(0)]), inp(&[7, 4], &[S(0)])], Some(&[S(0)])),
        // sharded on the cat dim: not kept
        case(&[2, 2], vec![inp(&[4, 3], &[S(1), R]), inp(&[4, 5], &[S(1), R])], None),
        // disagreeing placements
        case(&[2, 2], vec![inp(&[3, 2], &[S(0), R]), inp(&[3, 3], &[R, S(0)])], None),
        // Partial on both: stays (linear)
        case(&[2, 2], vec![inp(&[3, 2], &[p(), S(0)]), inp(&[3, 3], &[p(), S(0)])], Some(&[p(), S(0)])),
    ];
    check_op("cat(1)", &cases, true, &|x| cat(&[&x[0], &x[1]], 1));
    let same = vec![
        case(&[2, 2], vec![inp(&[5, 3], &[S(0), S(1)]), inp(&[5, 3], &[S(0), S(1)])], Some(&[S(0), S(2)])),
        case(&[3], vec![inp(&[2, 4], &[S(1)]), inp(&[2, 4], &[R])], None),
        case(&[2, 2], vec![inp(&[2, 3], &[S(1), S(1)]), inp(&[2, 3], &[S(1), S(1)])], Some(&[S(2), S(2)])),
    ];
    check_op("stack(1)", &same, true, &|x| stack(&[&x[0], &x[1], &x[0]], 1));
}

#[test]
fn permute_and_contiguous() {
    let cases = vec![
        case(&[2, 2], vec![inp(&[2, 3, 5], &[S(0), S(2)])], Some(&[S(1), S(0)])),
        case(&[3], vec![inp(&[4, 7, 2], &[S(1)])], Some(&[S(2)])),
        case(&[2, 2], vec![inp(&[3, 2, 3], &[S(2), S(2)])], Some(&[S(0), S(0)])),
        case(&[2, 2], vec![inp(&[3, 2, 4], &[p(), S(1)])], Some(&[p(), S(2)])),
    ];
    check_op("permute([2, 0, 1])", &cases, true, &|x| x[0].permute(&[2, 0, 1]));
    let cases = vec![
        case(&[2, 2], vec![inp(&[2, 3, 5], &[S(0), S(2)])], Some(&[S(2), S(0)])),
        case(&[3], vec![inp(&[4, 7, 2], &[S(1)])], Some(&[S(1)])),
        case(&[2, 2], vec![inp(&[3, 2, 4], &[p(), S(1)])], Some(&[p(), S(1)])),
    ];
    check_op("permute([-1, 1, 0]).contiguous()", &cases, true, &|x| x[0].permute(&[-1, 1, 0])?.contiguous());
}

#[test]
fn flatten_unflatten_squeeze() {
    let cases = vec![
        case(&[2, 2], vec![inp(&[4, 3, 2], &[S(0), R])], None),
        case(&[3], vec![inp(&[5, 3, 2], &[S(1)])], None),
        case(&[2, 2], vec![inp(&[2, 3, 4], &[S(2), S(0)])], None),
    ];
    check_op("flatten(1, 2)", &cases, true, &|x| x[0].flatten(1, 2));
    check_op("flatten(0, -1)", &cases, true, &|x| x[0].flatten(0, -1));
    check_op("unflatten(flatten)", &cases, true, &|x| x[0].flatten(1, 2)?.unflatten(1, &[-1, 2]));
    let ones = vec![
        case(&[2, 2], vec![inp(&[4, 1, 3, 1], &[S(0), S(2)])], Some(&[S(0), S(1)])),
        case(&[3], vec![inp(&[1, 5, 1], &[S(1)])], Some(&[S(0)])),
    ];
    check_op("squeeze()", &ones, true, &|x| x[0].squeeze(None));
    let ones = vec![
        case(&[2, 2], vec![inp(&[4, 1, 3, 1], &[S(0), S(2)])], Some(&[S(0), S(2)])),
        case(&[3], vec![inp(&[1, 5, 1], &[S(1)])], Some(&[S(1)])),
    ];
    check_op("squeeze(-1)", &ones, true, &|x| x[0].squeeze(Some(-1)));
}

#[test]
fn repeat_and_repeat_interleave() {
    let cases = vec![
        case(&[2, 2], vec![inp(&[3, 4], &[S(0), S(1)])], None),
        case(&[3], vec![inp(&[5, 2], &[S(0)])], None),
        case(&[2, 2], vec![inp(&[2, 3], &[S(1), S(1)])], None),
        case(&[2, 2], vec![inp(&[2, 3], &[p(), R])], None),
    ];
    check_op("repeat([2, 1, 3])", &cases, true, &|x| x[0].repeat(&[2, 1, 3]));
    // dims repeated once keep their shards
    let kept = vec![case(&[2, 2], vec![inp(&[4, 3], &[S(0), R])], Some(&[S(0), R]))];
    check_op("repeat([1, 2])", &kept, true, &|x| x[0].repeat(&[1, 2]));
    // GQA: 2 kv heads repeated 2x on a tp mesh of 2 keep the head shard (no comm)
    let heads = vec![
        case(&[2, 2], vec![inp(&[2, 4, 3, 2], &[S(0), S(1)])], Some(&[S(0), S(1)])),
        case(&[2], vec![inp(&[1, 2, 3, 2], &[S(1)])], Some(&[S(1)])),
        // uneven heads: the merged dim is not a chunk of the input's, so it redistributes
        case(&[2, 2], vec![inp(&[3, 3, 2], &[S(1), S(0)])], None),
    ];
    check_op("repeat_interleave(2, 1)", &heads, true, &|x| x[0].repeat_interleave(2, 1));
}

#[test]
fn index_select_and_gather() {
    let cases = vec![
        case(&[2, 2], vec![inp(&[5, 4], &[S(1), R]), ids(&[6], &[R, R], 5)], Some(&[S(1), R])),
        // sharded index, replicated input: the output is sharded on the indexed dim
        case(&[3], vec![inp(&[5, 4], &[R]), ids(&[7], &[S(0)], 5)], Some(&[S(0)])),
        // input sharded on the indexed dim: Replicate first
        case(&[2, 2], vec![inp(&[5, 4], &[S(0), S(1)]), ids(&[3], &[R, R], 5)], None),
        case(&[2, 2], vec![inp(&[5, 3], &[p(), R]), ids(&[4], &[R, R], 5)], Some(&[p(), R])),
    ];
    check_op("index_select(0)", &cases, true, &|x| x[0].index_select(0, &x[1]));
    let g = vec![
        case(&[2, 2], vec![inp(&[5, 4], &[S(0), R]), ids(&[5, 6], &[S(0), R], 4)], Some(&[S(0), R])),
        case(&[3], vec![inp(&[5, 4], &[R]), ids(&[3, 7], &[S(1)], 4)], Some(&[S(1)])),
        case(&[2, 2], vec![inp(&[4, 4], &[S(1), S(0)]), ids(&[3, 2], &[R, R], 4)], None),
        case(&[2, 2], vec![inp(&[3, 4], &[p(), R]), ids(&[3, 5], &[R, R], 4)], Some(&[p(), R])),
    ];
    check_op("gather(1)", &g, true, &|x| x[0].gather(1, &x[1]));
}
