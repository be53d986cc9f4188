//! `backward_opts` with `overlap_grad_reduce`: the leaf-gradient all-reduces run in buckets in
//! the background while the pass goes on. The gradients must be bit-identical to plain
//! `backward()`'s (same reductions, same accumulation order) for every bucket size, on every
//! mesh shape, uneven and empty shards included, and agree with a 1-rank run; the collectives
//! are the same ones, merged per bucket.

use dtensor_runtime::ndarray::{ArrayD, Dimension, IxDyn};
use dtensor_runtime::{
    distribute_tensor, run, BackwardOptions, CommDebugMode, DTensor, DType, Placement, Replicate, Result, Shard,
};
use std::collections::BTreeMap;

/// Sizes: batch (sharded over dp), dim, hidden (sharded over tp).
const BATCH: usize = 5;
const DIM: usize = 3;
const HIDDEN: usize = 7;

fn host(shape: &[usize], seed: usize) -> ArrayD<f64> {
    ArrayD::from_shape_fn(IxDyn(shape), |ix| {
        let k = ix.as_array_view().iter().fold(seed, |a, &i| a * 31 + i + 1);
        ((k * 2654435761) % 1000) as f64 / 1000.0 - 0.5
    })
}

/// The parameters: two Megatron blocks' weights (`w1` column-, `w2` row-parallel), a
/// replicated hidden bias (its gradient is Partial on dp *and* Shard-reduced on tp: not
/// bucketable), and a weight `tied` used by both blocks (two gradients to accumulate).
struct Params {
    w1: [DTensor<f64>; 2],
    w2: [DTensor<f64>; 2],
    bias: DTensor<f64>,
    tied: DTensor<f64>,
}

fn params(mesh: &dtensor_runtime::DeviceMesh) -> Result<Params> {
    let p = |shape: &[usize], seed, pl: [Placement; 2]| {
        Ok::<_, dtensor_runtime::Error>(distribute_tensor(host(shape, seed), mesh, &pl, None)?.requires_grad_(true))
    };
    Ok(Params {
        w1: [p(&[DIM, HIDDEN], 1, [Replicate, Shard(1)])?, p(&[DIM, HIDDEN], 2, [Replicate, Shard(1)])?],
        w2: [p(&[HIDDEN, DIM], 3, [Replicate, Shard(0)])?, p(&[HIDDEN, DIM], 4, [Replicate, Shard(0)])?],
        bias: p(&[HIDDEN], 5, [Replicate, Replicate])?,
        tied: p(&[DIM, DIM], 6, [Replicate, Replicate])?,
    })
}

/// `sum((block(block(x)))^2)` with `block(x) = x + gelu(x @ w1 + bias) @ w2 + x @ tied`.
fn loss(p: &Params, x: &DTensor<f64>) -> Result<DTensor<f64>> {
    let mut h = x.clone();
    for i in 0..2 {
        let a = h.matmul(&p.w1[i])?.add(&p.bias)?.gelu()?;
        let y = a.matmul(&p.w2[i])?.redistribute(&[Shard(0), Replicate])?;
        h = h.add(&y)?.add(&h.matmul(&p.tied)?)?;
    }
    h.mul(&h)?.sum()
}

/// What a rank saw: every parameter's full gradient after `steps` backward passes
/// (accumulating), and the collectives of those passes per (kind, mesh dim, op): count, bytes.
type Seen = (Vec<Vec<f64>>, BTreeMap<(String, String, String), (usize, usize)>);

fn grads(dp: usize, tp: usize, opts: Option<BackwardOptions>, steps: usize) -> Vec<Seen> {
    run(dp * tp, |ctx| {
        let mesh = ctx.init_device_mesh(&[dp, tp], &["dp", "tp"])?;
        let p = params(&mesh)?;
        let x = distribute_tensor(host(&[BATCH, DIM], 9), &mesh, &[Shard(0), Replicate], None)?;
        let comm = CommDebugMode::new();
        for _ in 0..steps {
            let l = loss(&p, &x)?;
            comm.scope(|| match &opts {
                Some(o) => l.backward_opts(o),
                None => l.backward(),
            })?;
        }
        let all = [&p.w1[0], &p.w1[1], &p.w2[0], &p.w2[1], &p.bias, &p.tied];
        let g = all
            .iter()
            .map(|t| Ok(t.grad().expect("every parameter gets a gradient").full_tensor()?.iter().copied().collect()))
            .collect::<Result<Vec<Vec<f64>>>>()?;
        let mut seen = BTreeMap::new();
        for r in comm.records() {
            let e = seen.entry((r.kind.name().to_string(), r.mesh_dim_label().to_string(), r.op)).or_insert((0, 0));
            e.0 += 1;
            e.1 += r.bytes;
        }
        Ok((g, seen))
    })
    .unwrap()
}

fn meshes() -> [(usize, usize); 7] {
    // (3, 1): batch 5 in shards 2, 2, 1; (4, 2): 2, 2, 1, 0; (2, 8): hidden 7 in 7 shards of 1
    // and an empty one (w1, w2 of the last tp rank are empty).
    [(1, 1), (2, 1), (1, 2), (2, 2), (3, 1), (4, 2), (2, 8)]
}

#[test]
fn overlapped_gradients_are_bit_identical_to_plain_backward_for_every_bucket_size() {
    let reference = grads(1, 1, None, 1).remove(0).0;
    for (dp, tp) in meshes() {
        let plain = grads(dp, tp, None, 1);
        for (r, (g, _)) in plain.iter().enumerate() {
            for (a, b) in g.iter().zip(&reference) {
                let err = a.iter().zip(b).fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
                assert!(err < 1e-12, "mesh {dp}x{tp} rank {r}: plain backward differs from 1 rank by {err}");
            }
        }
        for bucket in [0, 8, 100, usize::MAX] {
            let overlapped = grads(dp, tp, Some(BackwardOptions::new().overlap_grad_reduce(bucket)), 1);
            for (r, ((g, _), (want, _))) in overlapped.iter().zip(&plain).enumerate() {
                assert_eq!(g, want, "mesh {dp}x{tp}, bucket {bucket} bytes, rank {r}: gradients differ");
            }
        }
    }
}

#[test]
fn accumulation_over_several_passes_matches_plain_backward() {
    for (dp, tp) in [(2, 2), (3, 1)] {
        let plain = grads(dp, tp, None, 3);
        let overlapped = grads(dp, tp, Some(BackwardOptions::new().overlap_grad_reduce(64)), 3);
        assert_eq!(
            overlapped.iter().map(|o| &o.0).collect::<Vec<_>>(),
            plain.iter().map(|o| &o.0).collect::<Vec<_>>(),
            "mesh {dp}x{tp}"
        );
    }
}

#[test]
fn buckets_merge_the_dp_gradient_all_reduces_and_leave_every_other_collective_alone() {
    let key = |k: &str, d: &str, op: &str| (k.to_string(), d.to_string(), op.to_string());
    let (plain_key, bucket_key) = (key("all_reduce", "dp", "grad_accumulate"), key("all_reduce", "dp", "grad_bucket"));
    for (dp, tp) in [(2, 2), (2, 1), (4, 2)] {
        let plain = grads(dp, tp, None, 1).remove(0).1;
        let mut per_grad = grads(dp, tp, Some(BackwardOptions::new().overlap_grad_reduce(0)), 1).remove(0).1;
        let mut one_bucket = grads(dp, tp, Some(BackwardOptions::new().overlap_grad_reduce(usize::MAX)), 1).remove(0).1;
        // Bucket 0: one all-reduce per bucketable gradient (at least w1 ×2 and w2 ×2), the
        // rest reduced by a plain redistribute; together exactly plain backward's.
        let (n, bytes) = per_grad.remove(&bucket_key).expect("bucketed all-reduces");
        assert!(n >= 4, "mesh {dp}x{tp}: {n} gradients bucketed");
        let (left, left_bytes) = per_grad.get(&plain_key).copied().unwrap_or((0, 0));
        assert_eq!((n + left, bytes + left_bytes), plain[&plain_key], "mesh {dp}x{tp}");
        // One bucket: all of them in one all-reduce of the same bytes; the rest unchanged.
        assert_eq!(one_bucket.remove(&bucket_key), Some((1, bytes)), "mesh {dp}x{tp}: one bucket");
        assert_eq!(one_bucket, per_grad, "mesh {dp}x{tp}: every other collective as in plain backward");
    }
}

#[test]
fn reductions_in_another_dtype_fall_back_to_plain_backward() {
    let opts = BackwardOptions::new().overlap_grad_reduce(usize::MAX).reduce_in(DType::F32);
    let with = grads(2, 2, Some(opts), 1);
    let without = grads(2, 2, Some(BackwardOptions::new().reduce_in(DType::F32)), 1);
    assert_eq!(with, without);
}

/// Buckets on two mesh dims at once, with uneven shards: weights `w` (column-parallel) get
/// gradients Partial on dp, whose local size depends on the tp coordinate; per-sample
/// offsets `v` (batch-sharded) get gradients Partial on tp, whose local size depends on the
/// dp coordinate. Every rank must still start the same buckets in the same order (buckets
/// fill by nominal, rank-independent bytes), or a worker waiting on its dp peer could wait
/// on a peer whose worker waits on a tp peer: the sequence of bucket all-reduces (their mesh
/// dims, in start order) must be the same on every rank, and the pass must finish with plain
/// backward's gradients, for every bucket size.
#[test]
fn buckets_on_two_mesh_dims_with_uneven_shards_finish_and_match_plain_backward() {
    type Ranked = (Vec<Vec<f64>>, Vec<String>);
    let run_with = |dp: usize, tp: usize, opts: Option<BackwardOptions>| -> Vec<Ranked> {
        dtensor_runtime::LocalWorld::new(dp * tp)
            .timeout(std::time::Duration::from_secs(30))
            .run(|ctx| {
                let mesh = ctx.init_device_mesh(&[dp, tp], &["dp", "tp"])?;
                let leaf = |shape: &[usize], seed, pl: [Placement; 2]| {
                    Ok::<_, dtensor_runtime::Error>(
                        distribute_tensor(host(shape, seed), &mesh, &pl, None)?.requires_grad_(true),
                    )
                };
                let mut params = Vec::new();
                let mut h = distribute_tensor(host(&[BATCH, DIM], 9), &mesh, &[Shard(0), Replicate], None)?;
                for i in 0..3 {
                    let v = leaf(&[BATCH, DIM], 20 + i, [Shard(0), Replicate])?;
                    let w1 = leaf(&[DIM, HIDDEN], 30 + i, [Replicate, Shard(1)])?;
                    let w2 = leaf(&[HIDDEN, DIM], 40 + i, [Replicate, Shard(0)])?;
                    let y = h.add(&v)?.matmul(&w1)?.gelu()?.matmul(&w2)?.redistribute(&[Shard(0), Replicate])?;
                    h = h.add(&y)?;
                    params.extend([v, w1, w2]);
                }
                let loss = h.mul(&h)?.sum()?;
                let comm = CommDebugMode::new();
                comm.scope(|| match &opts {
                    Some(o) => loss.backward_opts(o),
                    None => loss.backward(),
                })?;
                let starts = comm
                    .records()
                    .into_iter()
                    .filter(|r| r.op == "grad_bucket")
                    .map(|r| r.mesh_dim_label().to_string())
                    .collect();
                let grads = params
                    .iter()
                    .map(|p| Ok(p.grad().expect("a gradient").full_tensor()?.iter().copied().collect()))
                    .collect::<Result<Vec<Vec<f64>>>>()?;
                Ok((grads, starts))
            })
            .unwrap()
    };
    for (dp, tp) in [(2, 2), (3, 2), (2, 3), (4, 2)] {
        let plain: Vec<_> = run_with(dp, tp, None).into_iter().map(|(g, _)| g).collect();
        for bucket in [0, 16, 40, 100, 1 << 20] {
            let got = run_with(dp, tp, Some(BackwardOptions::new().overlap_grad_reduce(bucket)));
            let (grads, starts): (Vec<_>, Vec<_>) = got.into_iter().unzip();
            assert!(starts[0].iter().any(|d| d == "tp") && starts[0].iter().any(|d| d == "dp"), "{starts:?}");
            assert!(starts.iter().all(|s| s == &starts[0]), "mesh {dp}x{tp}, bucket {bucket}: {starts:?}");
            assert_eq!(grads, plain, "mesh {dp}x{tp}, bucket {bucket} bytes");
        }
    }
}

// ------------------------------------------------------------------ bucket agreement
// Issue 33, finding 9: ranks whose buckets have the same size but different contents mixed
// unrelated gradients silently. With the collective fingerprint check on, each bucket's
// all-reduce carries what it holds (shapes, placements, local sizes, in order): a typed error
// on every rank. Element types that differ are refused by the thread backend even without it.

/// One rank's backward over a dp mesh of 2 whose two replicated weights have `hidden`
/// columns (which may differ between ranks: a program that diverged), in `T`.
fn diverged_rank<T: dtensor_runtime::Element>(
    mesh: &dtensor_runtime::DeviceMesh,
    hidden: [usize; 2],
    opts: Option<BackwardOptions>,
) -> Result<()> {
    let cast = |a: ArrayD<f64>| a.mapv(T::of_f64);
    let x = distribute_tensor(cast(host(&[4, DIM], 9)), mesh, &[Shard(0)], None)?;
    let w: Vec<DTensor<T>> = hidden
        .iter()
        .enumerate()
        .map(|(i, &h)| {
            let local = cast(host(&[DIM, h], 50 + i));
            Ok(dtensor_runtime::from_local(local, mesh, &[Replicate], Default::default())?.requires_grad_(true))
        })
        .collect::<Result<_>>()?;
    let loss = |w: &DTensor<T>| -> Result<DTensor<T>> {
        let h = x.matmul(w)?;
        h.mul(&h)?.sum()
    };
    let l = loss(&w[0])?.add(&loss(&w[1])?)?;
    match &opts {
        Some(o) => l.backward_opts(o),
        None => l.backward(),
    }
}

/// [`diverged_rank`] on both ranks (rank `r`'s weights have `hidden[r]` columns), in `f64` on
/// both or (`mixed`) in bf16 on rank 0 and f16 on rank 1; every rank's outcome.
fn diverged_backward(
    hidden: [[usize; 2]; 2],
    opts: Option<BackwardOptions>,
    checks: bool,
    mixed: bool,
) -> Vec<Result<()>> {
    dtensor_runtime::LocalWorld::new(2)
        .timeout(std::time::Duration::from_secs(20))
        .run(|ctx| {
            let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
            mesh.set_collective_checks(checks);
            let h = hidden[ctx.rank()];
            Ok(match (mixed, ctx.rank()) {
                (false, _) => diverged_rank::<f64>(&mesh, h, opts),
                (true, 0) => diverged_rank::<dtensor_runtime::bf16>(&mesh, h, opts),
                (true, _) => diverged_rank::<dtensor_runtime::f16>(&mesh, h, opts),
            })
        })
        .unwrap()
}

fn every_rank_fails(what: &str, out: Vec<Result<()>>, field: Option<&str>) {
    use dtensor_runtime::Error;
    for (r, res) in out.into_iter().enumerate() {
        match (&res, field) {
            (Err(Error::CollectiveMismatch { field: f, .. }), Some(want)) if f == want => {}
            (Err(Error::BufferMismatch { .. } | Error::CollectiveMismatch { .. }), None) => {}
            (other, _) => panic!("{what}, rank {r}: expected a typed error ({field:?}), got {other:?}"),
        }
    }
}

/// Finding 9: rank 0's weights have 2 and 4 columns, rank 1's 4 and 2: one bucket of 6 x DIM
/// elements on both, holding different gradients.
#[test]
fn buckets_of_equal_size_but_different_contents_fail_with_the_check_on() {
    let hidden = [[2, 4], [4, 2]];
    let one_bucket = Some(BackwardOptions::new().overlap_grad_reduce(usize::MAX));
    // Plain backward: one all-reduce per gradient, whose sizes differ: a typed error.
    every_rank_fails("plain", diverged_backward(hidden, None, false, false), None);
    every_rank_fails("plain, check on", diverged_backward(hidden, None, true, false), Some("element count"));
    // Overlapped with the check on: the buckets' contents differ.
    every_rank_fails("overlapped, check on", diverged_backward(hidden, one_bucket, true, false), Some("arguments"));
    // With one all-reduce per gradient the sizes differ again, check off.
    let per_grad = Some(BackwardOptions::new().overlap_grad_reduce(0));
    every_rank_fails("overlapped per gradient", diverged_backward(hidden, per_grad, false, false), None);
    // The same weights on every rank pass with the check on.
    for out in diverged_backward([[2, 4], [2, 4]], one_bucket, true, false) {
        out.unwrap();
    }
}

/// Finding 9 (element types): a bf16 bucket meeting an f16 one of the same size fails on
/// every rank, with the fingerprint check on and off (the thread backend compares element
/// types itself), as plain backward does.
#[test]
fn buckets_of_different_element_types_fail() {
    let hidden = [[2, 4], [2, 4]];
    for opts in [None, Some(BackwardOptions::new().overlap_grad_reduce(usize::MAX))] {
        for checks in [false, true] {
            let out = diverged_backward(hidden, opts, checks, true);
            every_rank_fails(&format!("bf16 vs f16, {opts:?}, check {checks}"), out, Some("dtype"));
        }
    }
}
