//! The typed rules of the model ops — `scaled_dot_product_attention`, `embedding`,
//! `cross_entropy`, `mse_loss` — against the dynamic ops and the single-device reference, on
//! a 2-rank and a 2×2 mesh: same placements, same values. Uneven sizes (3 heads, 5 tokens, 7
//! rows) and a batch of 1 sharded over 2 ranks (an empty shard) exercise torch.chunk
//! sharding; legal layouts issue no collective except the statistics of loss parallelism.

#[macro_use]
mod typed_util;

use dtensor_runtime::ndarray::{s, Array2, ArrayD, Axis, Ix3, IxDyn, Zip};
use dtensor_runtime::typed::attention::{scaled_dot_product_attention, scaled_dot_product_attention_masked};
use dtensor_runtime::typed::dims::{dp, tp};
use dtensor_runtime::typed::Dt;
use dtensor_runtime::{run, CommDebugMode, Error};
use typed_util::*;

/// `softmax(q kᵀ · scale + mask) v` over the last two dims: `causal` hides keys after each
/// query, `mask` (additive) is broadcast to the scores `[.., Lq, Lk]`.
fn sdpa_ref(
    q: &ArrayD<f64>,
    k: &ArrayD<f64>,
    v: &ArrayD<f64>,
    causal: bool,
    mask: Option<&ArrayD<f64>>,
) -> ArrayD<f64> {
    let nd = q.ndim();
    let (lq, e, lk, ev) = (q.shape()[nd - 2], q.shape()[nd - 1], k.shape()[nd - 2], v.shape()[nd - 1]);
    let n: usize = q.shape()[..nd - 2].iter().product();
    let flat = |x: &ArrayD<f64>, a, b| x.as_standard_layout().into_owned().into_shape_with_order((n, a, b)).unwrap();
    let (q3, k3, v3) = (flat(q, lq, e), flat(k, lk, e), flat(v, lk, ev));
    let m3 = mask.map(|m| {
        let mut scores_shape = q.shape()[..nd - 1].to_vec();
        scores_shape.push(lk);
        flat(&m.broadcast(IxDyn(&scores_shape)).unwrap().to_owned(), lq, lk)
    });
    let scale = 1.0 / (e as f64).sqrt();
    let mut out = ArrayD::zeros(IxDyn(&[n, lq, ev])).into_dimensionality::<Ix3>().unwrap();
    for b in 0..n {
        let mut sc: Array2<f64> = q3.slice(s![b, .., ..]).dot(&k3.slice(s![b, .., ..]).t()) * scale;
        if let Some(m3) = &m3 {
            sc += &m3.slice(s![b, .., ..]);
        }
        for ((i, j), x) in sc.indexed_iter_mut() {
            if causal && j > i {
                *x = f64::NEG_INFINITY;
            }
        }
        for mut row in sc.rows_mut() {
            let m = row.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            row.mapv_inplace(|x| (x - m).exp());
            let z = row.sum();
            row.mapv_inplace(|x| x / z);
        }
        out.slice_mut(s![b, .., ..]).assign(&sc.dot(&v3.slice(s![b, .., ..])));
    }
    let mut shape = q.shape()[..nd - 1].to_vec();
    shape.push(ev);
    out.into_shape_with_order(IxDyn(&shape)).unwrap()
}

/// One attention case: q with `$lq`, k and v with `$lkv`; also checks that no collective ran.
macro_rules! attention_case {
    ([$m:ty, $r:literal, $q:expr, $k:expr, $v:expr, $causal:expr, $expect:expr, $mesh:expr, $fails:expr]; $lq:ty, $lkv:ty) => {{
        let q = input::<$m, $lq, $r>($q, $mesh)?;
        let k = input::<$m, $lkv, $r>($k, $mesh)?;
        let v = input::<$m, $lkv, $r>($v, $mesh)?;
        let case = format!("sdpa q {} k, v {} causal {} {:?}", stringify!($lq), stringify!($lkv), $causal, $q.shape());
        let comm = CommDebugMode::new();
        let typed = comm.scope(|| scaled_dot_product_attention(&q, &k, &v, $causal, None));
        if comm.total() != 0 {
            $fails.push(format!("{case}: {} collectives", comm.total()));
        }
        let dynamic = dtensor_runtime::scaled_dot_product_attention(
            q.as_dtensor(),
            k.as_dtensor(),
            v.as_dtensor(),
            None,
            $causal,
            None,
        );
        check(&case, typed, dynamic, $expect, $fails)?;
    }};
}

#[test]
fn attention_rules_match_dynamic() {
    // [batch 2, heads 3, seq 5, head dim 4]; k, v with 6 keys; a batch of 1 for the empty shard.
    let (q, k, v) = (global(&[2, 3, 5, 4], 1, false), global(&[2, 3, 6, 4], 2, false), global(&[2, 3, 6, 4], 3, false));
    let (q1, k1, v1) =
        (global(&[1, 3, 5, 4], 4, false), global(&[1, 3, 5, 4], 5, false), global(&[1, 3, 5, 4], 6, false));
    let (q3, k3, v3) = (global(&[3, 5, 4], 7, false), global(&[3, 5, 4], 8, false), global(&[3, 5, 4], 9, false));
    let plain = sdpa_ref(&q, &k, &v, false, None);
    let (causal1, causal3) = (sdpa_ref(&q1, &k1, &v1, true, None), sdpa_ref(&q3, &k3, &v3, true, None));
    let causal = sdpa_ref(&q, &k, &v, true, None);
    on_meshes(
        |mesh, fails| {
            each1!(attention_case [(tp,), 4, &q, &k, &v, false, &plain, mesh, fails]; (R, R) (S0, S0) (S1, S1) (S2, R));
            each1!(attention_case [(tp,), 4, &q, &k, &v, true, &causal, mesh, fails]; (R, R) (S0, S0) (S1, S1) (S2, R));
            each1!(attention_case [(tp,), 4, &q1, &k1, &v1, true, &causal1, mesh, fails]; (S0, S0) (S2, R));
            each1!(attention_case [(tp,), 3, &q3, &k3, &v3, true, &causal3, mesh, fails]; (R, R) (S0, S0) (S1, R));
            Ok(())
        },
        |mesh, fails| {
            // Megatron: batch on dp, heads on tp; and sequence-parallel queries.
            product2!(attention_case [(dp, tp), 4, &q, &k, &v, true, &causal, mesh, fails]; (R, R) (S0, S0) (S1, S1) (S2, R));
            product2!(attention_case [(dp, tp), 4, &q1, &k1, &v1, false, &sdpa_ref(&q1, &k1, &v1, false, None), mesh, fails]; (S0, S0) (S1, S1));
            Ok(())
        },
    );
}

/// Rows of `table` at the whole-number `ids`.
fn embedding_ref(table: &ArrayD<f64>, ids: &ArrayD<f64>) -> ArrayD<f64> {
    let d = table.shape()[1];
    let mut shape = ids.shape().to_vec();
    shape.push(d);
    let rows: Vec<f64> =
        ids.iter().flat_map(|&i| table.index_axis(Axis(0), i as usize).iter().copied().collect::<Vec<_>>()).collect();
    ArrayD::from_shape_vec(IxDyn(&shape), rows).unwrap()
}

/// One embedding case: table `$lw`, ids `$li` (rank 2), output rank 3.
macro_rules! embedding_case {
    ([$m:ty, $w:expr, $ids:expr, $expect:expr, $mesh:expr, $fails:expr]; $lw:ty, $li:ty) => {{
        let w = input::<$m, $lw, 2>($w, $mesh)?;
        let ids = input::<$m, $li, 2>($ids, $mesh)?;
        let case = format!("embedding table {} ids {} {:?}", stringify!($lw), stringify!($li), $ids.shape());
        let comm = CommDebugMode::new();
        let typed = comm.scope(|| w.embedding::<_, _, 2, 3>(&ids));
        if comm.total() != 0 {
            $fails.push(format!("{case}: {} collectives", comm.total()));
        }
        check(&case, typed, w.as_dtensor().embedding(ids.as_dtensor()), $expect, $fails)?;
    }};
}

#[test]
fn embedding_rules_match_dynamic() {
    // Vocab 7 (uneven over 2), dim 5; ids [3, 4] and [1, 4] (an empty shard of dim 0).
    let w = global(&[7, 5], 1, false);
    let whole = |shape: &[usize], seed| global(shape, seed, true).mapv(|x| ((x - 0.5) * 3.0).floor());
    let (ids, ids1) = (whole(&[3, 4], 2), whole(&[1, 4], 3));
    assert!(ids.iter().all(|&i| (0.0..7.0).contains(&i)) && ids.iter().any(|&i| i >= 4.0));
    let (e, e1) = (embedding_ref(&w, &ids), embedding_ref(&w, &ids1));
    on_meshes(
        |mesh, fails| {
            each1!(embedding_case [(tp,), &w, &ids, &e, mesh, fails]; (R, R) (R, S0) (R, S1) (S1, R) (S0, R) (Ps, R) (Pa, R));
            each1!(embedding_case [(tp,), &w, &ids1, &e1, mesh, fails]; (R, S0) (S0, R));
            Ok(())
        },
        |mesh, fails| {
            product2!(embedding_case [(dp, tp), &w, &ids, &e, mesh, fails]; (R, R) (R, S0) (R, S1) (S1, R) (S0, R) (Ps, R));
            product2!(embedding_case [(dp, tp), &w, &ids1, &e1, mesh, fails]; (R, S0) (S0, R));
            Ok(())
        },
    );
}

/// `-mean(log_softmax(x)[t])` over the class dim (the last).
fn cross_entropy_ref(x: &ArrayD<f64>, t: &ArrayD<f64>) -> ArrayD<f64> {
    let c = x.shape()[x.ndim() - 1];
    let rows = x.as_standard_layout().into_owned().into_shape_with_order((t.len(), c)).unwrap();
    let total: f64 = rows
        .rows()
        .into_iter()
        .zip(t.iter())
        .map(|(r, &ti)| {
            let m = r.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            let lse = m + r.mapv(|v| (v - m).exp()).sum().ln();
            lse - r[ti as usize]
        })
        .sum();
    ArrayD::from_elem(IxDyn(&[]), total / t.len() as f64)
}

/// One loss case: `$typed` / `$dynamic` of the two inputs (ranks `$rx`, `$rt`).
macro_rules! loss_case {
    // The loss-parallel typed op runs the dynamic `cross_entropy`.
    ([$m:ty, $rx:literal, $rt:literal, cross_entropy_loss_parallel, $x:expr, $t:expr, $expect:expr, $mesh:expr, $fails:expr]; $lx:ty, $lt:ty) => {{
        let x = input::<$m, $lx, $rx>($x, $mesh)?;
        let t = input::<$m, $lt, $rt>($t, $mesh)?;
        let case =
            format!("cross_entropy_loss_parallel {} against {} {:?}", stringify!($lx), stringify!($lt), $x.shape());
        check(&case, x.cross_entropy_loss_parallel(&t), x.as_dtensor().cross_entropy(t.as_dtensor()), $expect, $fails)?;
    }};
    ([$m:ty, $rx:literal, $rt:literal, $op:ident, $x:expr, $t:expr, $expect:expr, $mesh:expr, $fails:expr]; $lx:ty, $lt:ty) => {{
        let x = input::<$m, $lx, $rx>($x, $mesh)?;
        let t = input::<$m, $lt, $rt>($t, $mesh)?;
        let case = format!("{} {} against {} {:?}", stringify!($op), stringify!($lx), stringify!($lt), $x.shape());
        check(&case, x.$op(&t), x.as_dtensor().$op(t.as_dtensor()), $expect, $fails)?;
    }};
}

#[test]
fn loss_rules_match_dynamic() {
    // Logits [5, 4] (5 rows over 2 ranks), [1, 4] (an empty shard) and [2, 3, 4].
    let classes = |shape: &[usize], seed| global(shape, seed, true).mapv(|x| ((x - 0.5) * 1.99).floor());
    let (x, x1, x3) = (global(&[5, 4], 1, false), global(&[1, 4], 2, false), global(&[2, 3, 4], 3, false));
    let (t, t1, t3) = (classes(&[5], 4), classes(&[1], 5), classes(&[2, 3], 6));
    let (ce, ce1, ce3) = (cross_entropy_ref(&x, &t), cross_entropy_ref(&x1, &t1), cross_entropy_ref(&x3, &t3));
    let y = global(&[5, 4], 7, false);
    let mse = ArrayD::from_elem(IxDyn(&[]), Zip::from(&x).and(&y).fold(0.0, |a, &p, &q| a + (p - q) * (p - q)) / 20.0);
    on_meshes(
        |mesh, fails| {
            // Plain `cross_entropy` takes the layouts that need no collective; the
            // loss-parallel one takes those and the class-sharded logits.
            each1!(loss_case [(tp,), 2, 1, cross_entropy, &x, &t, &ce, mesh, fails]; (R, R) (S0, S0) (S0, R));
            each1!(loss_case [(tp,), 2, 1, cross_entropy_loss_parallel, &x, &t, &ce, mesh, fails]; (R, R) (S0, S0) (S0, R) (S1, R));
            each1!(loss_case [(tp,), 2, 1, cross_entropy, &x1, &t1, &ce1, mesh, fails]; (S0, S0));
            each1!(loss_case [(tp,), 2, 1, cross_entropy_loss_parallel, &x1, &t1, &ce1, mesh, fails]; (S0, S0) (S1, R));
            each1!(loss_case [(tp,), 3, 2, cross_entropy, &x3, &t3, &ce3, mesh, fails]; (S1, S1));
            each1!(loss_case [(tp,), 3, 2, cross_entropy_loss_parallel, &x3, &t3, &ce3, mesh, fails]; (S1, S1) (S2, R));
            each1!(loss_case [(tp,), 2, 2, mse_loss, &x, &y, &mse, mesh, fails]; (R, R) (S0, S0) (S1, S1));
            Ok(())
        },
        |mesh, fails| {
            // Batch on dp, classes on tp: loss parallelism under data parallelism.
            product2!(loss_case [(dp, tp), 2, 1, cross_entropy, &x, &t, &ce, mesh, fails]; (R, R) (S0, S0));
            product2!(loss_case [(dp, tp), 2, 1, cross_entropy_loss_parallel, &x, &t, &ce, mesh, fails]; (R, R) (S0, S0) (S1, R));
            product2!(loss_case [(dp, tp), 2, 2, mse_loss, &x, &y, &mse, mesh, fails]; (R, R) (S0, S0) (S1, S1));
            Ok(())
        },
    );
}

#[test]
fn model_op_shapes_the_types_cannot_see_are_errors() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let a: dtensor_runtime::Dt<f64, (tp,), (S0,), 2> =
            dtensor_runtime::Dt::distribute(&global(&[4, 3], 1, false), &mesh)?;
        let b: dtensor_runtime::Dt<f64, (tp,), (S0,), 2> =
            dtensor_runtime::Dt::distribute(&global(&[4, 2], 2, false), &mesh)?;
        let line = line!() + 1;
        let e = a.mse_loss(&b).unwrap_err();
        Ok((matches!(e, Error::TypedMismatch { .. }), e.to_string(), line))
    })
    .unwrap();
    for (typed, e, line) in out {
        assert!(typed && e.contains(&format!("typed_model_ops.rs:{line}")), "{e}");
    }
}

/// Loss parallelism inside a scope that forbids implicit redistributions (the body of a
/// `#[distribute]` function): the typed `cross_entropy` of logits sharded on the batch (dp)
/// and on the classes (tp) runs, and the typed `backward` of its rank-0 loss gives the
/// 1-rank loss and gradient `(softmax(x) - onehot(t)) / rows`. Uneven: 5 rows and 5 classes
/// over 2 ranks each.
#[test]
fn loss_parallel_cross_entropy_runs_and_backpropagates_without_implicit_redistribution() {
    use dtensor_runtime::ops::implicit::{forbid_implicit, ScopeSite};
    let x = global(&[5, 5], 3, false);
    let t = global(&[5], 4, true).mapv(|v| (v * 1.9).floor());
    let want_loss = cross_entropy_ref(&x, &t);
    let mut want_grad = x.clone();
    for (mut row, &ti) in want_grad.axis_iter_mut(Axis(0)).zip(t.iter()) {
        let m = row.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        row.mapv_inplace(|v| (v - m).exp());
        let s = row.sum();
        row.mapv_inplace(|v| v / s);
        row[ti as usize] -= 1.0;
        row.mapv_inplace(|v| v / 5.0);
    }
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let xt = input::<(dp, tp), (S0, S1), 2>(&x, &mesh)?.requires_grad_(true);
        let tt = input::<(dp, tp), (S0, R), 1>(&t, &mesh)?;
        let loss = {
            let _scope = forbid_implicit(ScopeSite { function: "loss", file: file!(), line: line!() });
            let loss: dtensor_runtime::Dt<f64, (dp, tp), (Ps, Ps), 0> = xt.cross_entropy_loss_parallel(&tt)?;
            loss.backward()?;
            loss
        };
        let grad = xt.as_dtensor().grad().ok_or_else(|| Error::Autograd("no gradient reached the logits".into()))?;
        Ok((loss.full_tensor()?, grad.full_tensor()?))
    })
    .unwrap();
    for (loss, grad) in out {
        assert!((loss.sum() - want_loss.sum()).abs() < 1e-12, "{loss} vs {want_loss}");
        assert_eq!(grad.shape(), want_grad.shape());
        for (g, w) in grad.iter().zip(&want_grad) {
            assert!((g - w).abs() < 1e-12, "{g} vs {w}");
        }
    }
}

/// One masked attention case: q `$lq`, k and v `$lkv`, mask `$lm` of rank `$rm`.
macro_rules! masked_case {
    ([$m:ty, $qkv:expr, $mask:expr, $rm:literal, $expect:expr, $mesh:expr, $fails:expr]; ($lq:ty, $lkv:ty, $lm:ty)) => {{
        let (qa, ka, va) = $qkv;
        let q = input::<$m, $lq, 4>(&qa, $mesh)?;
        let k = input::<$m, $lkv, 4>(&ka, $mesh)?;
        let v = input::<$m, $lkv, 4>(&va, $mesh)?;
        let mask = input::<$m, $lm, $rm>($mask, $mesh)?;
        let case = format!(
            "sdpa masked q {} k, v {} mask {} {:?}",
            stringify!($lq),
            stringify!($lkv),
            stringify!($lm),
            $mask.shape()
        );
        let comm = CommDebugMode::new();
        let typed = comm.scope(|| scaled_dot_product_attention_masked(&q, &k, &v, &mask, None));
        if comm.total() != 0 {
            $fails.push(format!("{case}: {} collectives", comm.total()));
        }
        let dynamic = dtensor_runtime::scaled_dot_product_attention(
            q.as_dtensor(),
            k.as_dtensor(),
            v.as_dtensor(),
            Some(mask.as_dtensor()),
            false,
            None,
        );
        check(&case, typed, dynamic, $expect, $fails)?;
    }};
}

#[test]
fn masked_attention_rules_match_dynamic() {
    // [batch 2, heads 3 (uneven over 2), seq 5, head dim 4], 6 keys; a broadcast [5, 6] mask, a
    // per-head [3, 1, 6] mask and a full-shape mask sharded like the output.
    let (qa, ka, va) =
        (global(&[2, 3, 5, 4], 11, false), global(&[2, 3, 6, 4], 12, false), global(&[2, 3, 6, 4], 13, false));
    let (m2, mh, mf) = (global(&[5, 6], 14, false), global(&[3, 1, 6], 15, false), global(&[2, 3, 5, 6], 16, false));
    let (e2, eh, ef) = (
        sdpa_ref(&qa, &ka, &va, false, Some(&m2)),
        sdpa_ref(&qa, &ka, &va, false, Some(&mh)),
        sdpa_ref(&qa, &ka, &va, false, Some(&mf)),
    );
    on_meshes(
        |mesh, fails| {
            masked_case!([(tp,), (&qa, &ka, &va), &m2, 2, &e2, mesh, fails]; ((R,), (R,), (R,)));
            masked_case!([(tp,), (&qa, &ka, &va), &m2, 2, &e2, mesh, fails]; ((S0,), (S0,), (R,)));
            masked_case!([(tp,), (&qa, &ka, &va), &m2, 2, &e2, mesh, fails]; ((S1,), (S1,), (R,)));
            masked_case!([(tp,), (&qa, &ka, &va), &mh, 3, &eh, mesh, fails]; ((S0,), (S0,), (R,)));
            masked_case!([(tp,), (&qa, &ka, &va), &mf, 4, &ef, mesh, fails]; ((S1,), (S1,), (S1,)));
            masked_case!([(tp,), (&qa, &ka, &va), &mf, 4, &ef, mesh, fails]; ((S2,), (R,), (S2,)));
            masked_case!([(tp,), (&qa, &ka, &va), &mf, 4, &ef, mesh, fails]; ((S0,), (S0,), (S0,)));
            Ok(())
        },
        |mesh, fails| {
            // Megatron: batch on dp, heads on tp.
            masked_case!([(dp, tp), (&qa, &ka, &va), &m2, 2, &e2, mesh, fails]; ((S0, S1), (S0, S1), (R, R)));
            masked_case!([(dp, tp), (&qa, &ka, &va), &mf, 4, &ef, mesh, fails]; ((S0, S1), (S0, S1), (S0, S1)));
            masked_case!([(dp, tp), (&qa, &ka, &va), &mh, 3, &eh, mesh, fails]; ((S0, S2), (S0, R), (R, R)));
            masked_case!([(dp, tp), (&qa, &ka, &va), &mf, 4, &ef, mesh, fails]; ((S0, S2), (S0, R), (S0, S2)));
            Ok(())
        },
    );
}

#[test]
fn masked_attention_sizes_the_types_cannot_see_are_errors_at_the_callers_line() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        // Heads sharded, a replicated mask that is not broadcast on the heads dim.
        let q: Dt<f64, (tp,), (S1,), 4> = Dt::distribute(&global(&[1, 2, 3, 4], 21, false), &mesh)?;
        let mask: Dt<f64, (tp,), (R,), 4> = Dt::distribute(&global(&[1, 2, 3, 3], 22, false), &mesh)?;
        let line = line!() + 1;
        let e = scaled_dot_product_attention_masked(&q, &q, &q, &mask, None).err();
        Ok((e, line))
    })
    .unwrap();
    for (e, line) in out {
        match e {
            Some(Error::TypedMismatch { what, .. }) => {
                assert!(what.contains("scaled_dot_product_attention"), "{what}");
                assert!(what.contains(&format!("typed_model_ops.rs:{line}")), "{what} at line {line}");
            }
            other => panic!("expected a TypedMismatch, got {other:?}"),
        }
    }
}

/// One softmax case: typed `$op(Dim::<1>)` on layout `$l` against the dynamic `softmax(1)` /
/// `log_softmax(1)` and the reference.
macro_rules! softmax_case {
    ([$m:ty, $op:ident, $dynop:ident, $g:expr, $expect:expr, $mesh:expr, $fails:expr]; $l:ty) => {{
        let x = input::<$m, $l, 2>($g, $mesh)?;
        let case = format!("{} {}", stringify!($op), stringify!($l));
        check(&case, x.$op(dtensor_runtime::typed::Dim::<1>), x.as_dtensor().$dynop(1), $expect, $fails)?;
    }};
}

/// Issue 31 ("typed ops that communicate inside"): `softmax`/`log_softmax` take the layouts
/// that need no collective (a shard of another dim; a shard of the softmax dim does not
/// compile, see `ui-tests/tests/ui/fail/softmax_sharded_dim_needs_name.rs`), and
/// `*_across_shards` those and a shard of the softmax dim; both match the dynamic op and the
/// single-rank reference, uneven shapes included, on 1, 2 and 2×2 ranks.
#[test]
fn softmax_rules_match_dynamic() {
    let x = global(&[5, 7], 11, false);
    let soft = |log: bool| {
        let mut y = x.clone();
        for mut row in y.rows_mut() {
            let m = row.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            let z: f64 = row.iter().map(|v| (v - m).exp()).sum();
            row.mapv_inplace(|v| if log { v - m - z.ln() } else { (v - m).exp() / z });
        }
        y
    };
    let (sm, lsm) = (soft(false), soft(true));
    on_meshes(
        |mesh, fails| {
            softmax_case!([(tp,), softmax, softmax, &x, &sm, mesh, fails]; (R,));
            softmax_case!([(tp,), softmax, softmax, &x, &sm, mesh, fails]; (S0,));
            softmax_case!([(tp,), log_softmax, log_softmax, &x, &lsm, mesh, fails]; (S0,));
            softmax_case!([(tp,), softmax_across_shards, softmax, &x, &sm, mesh, fails]; (S0,));
            softmax_case!([(tp,), softmax_across_shards, softmax, &x, &sm, mesh, fails]; (S1,));
            softmax_case!([(tp,), log_softmax_across_shards, log_softmax, &x, &lsm, mesh, fails]; (S1,));
            Ok(())
        },
        |mesh, fails| {
            softmax_case!([(dp, tp), softmax, softmax, &x, &sm, mesh, fails]; (S0, R));
            softmax_case!([(dp, tp), softmax_across_shards, softmax, &x, &sm, mesh, fails]; (S0, S1));
            softmax_case!([(dp, tp), log_softmax_across_shards, log_softmax, &x, &lsm, mesh, fails]; (S1, S1));
            Ok(())
        },
    );
}
