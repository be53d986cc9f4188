//! Every typed rule against the dynamic op: for each marker combination that compiles, on a
//! 2-rank mesh and a 2×2 mesh, the typed op and the dynamic op on the same inputs give
//! (1) the same placements — the layout the type system computed is what the dynamic sharding
//! propagation returns, (2) the same full tensor, (3) equal to the single-device reference
//! computed with ndarray on the global inputs. Uneven shapes (5, 3, 7) exercise torch.chunk
//! sharding. Partial inputs are built with `from_local` from unequal per-rank parts. Layouts
//! that mix two Partial ops do not compile (`cargo build`), so products keep one op each.

#[macro_use]
mod typed_util;

use dtensor_runtime::ndarray::{ArrayD, Axis, Ix2, IxDyn, Slice};
use dtensor_runtime::ops::{implicit_redistribution_count, implicit_redistributions};
use dtensor_runtime::typed::dims::{dp, tp};
use dtensor_runtime::typed::{Dim, Dims, Dt, TypedLayout};
use dtensor_runtime::{run, DTensor, Error};

use typed_util::*;

fn matmul_ref(a: &ArrayD<f64>, b: &ArrayD<f64>) -> ArrayD<f64> {
    let b2 = b.view().into_dimensionality::<Ix2>().unwrap();
    let (k, n) = b2.dim();
    let lead: Vec<usize> = a.shape()[..a.ndim() - 1].to_vec();
    let rows: usize = lead.iter().product();
    let a2 = a.as_standard_layout().into_owned().into_shape_with_order((rows, k)).unwrap();
    let mut shape = lead;
    shape.push(n);
    a2.dot(&b2).into_shape_with_order(IxDyn(&shape)).unwrap()
}

fn gelu_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044_715 * x * x * x)).tanh())
}

#[test]
fn matmul_rules_match_dynamic() {
    // [5, 7] @ [7, 3] and [3, 5, 7] @ [7, 3]: uneven everywhere.
    let (a2, a3, b) = (global(&[5, 7], 1, false), global(&[3, 5, 7], 2, false), global(&[7, 3], 3, false));
    let (e2, e3) = (matmul_ref(&a2, &b), matmul_ref(&a3, &b));
    on_meshes(
        |mesh, fails| {
            each1!(binary_case [(tp,), 2, 2, matmul, &a2, &b, &e2, mesh, fails];
                (R, R) (S0, R) (R, S1) (S1, S0) (Ps, R) (R, Ps) (Pa, R) (R, Pa));
            each1!(binary_case [(tp,), 3, 2, matmul, &a3, &b, &e3, mesh, fails];
                (R, R) (S0, R) (S1, R) (R, S1) (S2, S0) (Ps, R) (R, Ps) (Pa, R) (R, Pa));
            Ok(())
        },
        |mesh, fails| {
            product2!(binary_case [(dp, tp), 2, 2, matmul, &a2, &b, &e2, mesh, fails];
                (R, R) (S0, R) (R, S1) (S1, S0) (Ps, R) (R, Ps));
            Ok(())
        },
    );
}

#[test]
fn pointwise_rules_match_dynamic() {
    let (a, b, p) = (global(&[5, 3], 4, false), global(&[5, 3], 5, false), global(&[5, 3], 6, true));
    let (add, sub, mul, div) = (&a + &b, &a - &b, &a * &b, &a / &p);
    on_meshes(
        |mesh, fails| {
            each1!(binary_case [(tp,), 2, 2, add, &a, &b, &add, mesh, fails];
                (R, R) (S0, S0) (S1, S1) (Ps, Ps) (Ps, R) (R, Ps) (Pa, Pa) (Pa, R) (R, Pa));
            each1!(binary_case [(tp,), 2, 2, sub, &a, &b, &sub, mesh, fails];
                (R, R) (S0, S0) (S1, S1) (Ps, Ps) (Ps, R) (R, Ps) (Pa, Pa) (Pa, R) (R, Pa));
            each1!(binary_case [(tp,), 2, 2, mul, &a, &b, &mul, mesh, fails];
                (R, R) (S0, S0) (S1, S1) (Ps, R) (R, Ps) (Pa, R) (R, Pa));
            each1!(binary_case [(tp,), 2, 2, div, &a, &p, &div, mesh, fails];
                (R, R) (S0, S0) (S1, S1) (Ps, R) (Pa, R));
            Ok(())
        },
        |mesh, fails| {
            product2!(binary_case [(dp, tp), 2, 2, add, &a, &b, &add, mesh, fails];
                (R, R) (S0, S0) (S1, S1) (Ps, Ps) (Ps, R) (R, Ps));
            product2!(binary_case [(dp, tp), 2, 2, mul, &a, &b, &mul, mesh, fails];
                (R, R) (S0, S0) (S1, S1) (Ps, R) (R, Ps));
            // (One Partial op per layout: Sum and Avg are checked in separate products.)
            product2!(binary_case [(dp, tp), 2, 2, div, &a, &p, &div, mesh, fails];
                (R, R) (S1, S1) (Ps, R));
            product2!(binary_case [(dp, tp), 2, 2, add, &a, &b, &add, mesh, fails];
                (R, R) (S0, S0) (Pa, Pa) (Pa, R) (R, Pa));
            product2!(binary_case [(dp, tp), 2, 2, div, &a, &p, &div, mesh, fails];
                (R, R) (S0, S0) (Pa, R));
            Ok(())
        },
    );
}

#[test]
fn activation_rules_match_dynamic() {
    let x = global(&[5, 3], 7, false);
    let (relu, gelu) = (x.mapv(|v| v.max(0.0)), x.mapv(gelu_ref));
    macro_rules! both {
        ($cb:ident, $m:ty, $mesh:expr, $fails:expr; $($l:tt)*) => {
            $cb!(unary_case [$m, 2, "relu", |t: &Dt<_, _, _, 2>| t.relu(), |d: &DTensor<f64>| d.relu(), &x, &relu, $mesh, $fails]; $($l)*);
            $cb!(unary_case [$m, 2, "gelu", |t: &Dt<_, _, _, 2>| t.gelu(), |d: &DTensor<f64>| d.gelu(), &x, &gelu, $mesh, $fails]; $($l)*);
        };
    }
    on_meshes(
        |mesh, fails| {
            both!(each1, (tp,), mesh, fails; (R, R) (S0, R) (S1, R));
            Ok(())
        },
        |mesh, fails| {
            both!(product2, (dp, tp), mesh, fails; (R, R) (S0, R) (S1, R));
            Ok(())
        },
    );
}

#[test]
fn sum_rules_match_dynamic() {
    let x = global(&[5, 3], 8, false);
    let (s0, s1) = (x.sum_axis(Axis(0)).insert_axis(Axis(0)), x.sum_axis(Axis(1)).insert_axis(Axis(1)));
    macro_rules! dims {
        ($cb:ident, $m:ty, $mesh:expr, $fails:expr; $($l:tt)*) => {
            $cb!(unary_case [$m, 2, "sum(0)", |t: &Dt<_, _, _, 2>| t.sum(Dim::<0>), |d: &DTensor<f64>| d.sum_dim(0, true), &x, &s0, $mesh, $fails]; $($l)*);
            $cb!(unary_case [$m, 2, "sum(1)", |t: &Dt<_, _, _, 2>| t.sum(Dim::<1>), |d: &DTensor<f64>| d.sum_dim(1, true), &x, &s1, $mesh, $fails]; $($l)*);
        };
    }
    on_meshes(
        |mesh, fails| {
            dims!(each1, (tp,), mesh, fails; (R, R) (S0, R) (S1, R) (Ps, R) (Pa, R));
            Ok(())
        },
        |mesh, fails| {
            // `Partial<Avg>` next to a summed shard would mix two Partial ops: 1-D only.
            dims!(product2, (dp, tp), mesh, fails; (R, R) (S0, R) (S1, R) (Ps, R));
            Ok(())
        },
    );
}

#[test]
fn transpose_rules_match_dynamic() {
    let x = global(&[5, 3], 9, false);
    let x3 = global(&[3, 5, 2], 10, false);
    let xt = x.t().to_owned();
    let x3t = x3.view().permuted_axes(vec![2, 1, 0]).as_standard_layout().into_owned();
    on_meshes(
        |mesh, fails| {
            each1!(unary_case [(tp,), 2, "t", |t: &Dt<_, _, _, 2>| t.t(), |d: &DTensor<f64>| d.transpose(0, 1), &x, &xt, mesh, fails];
                (R, R) (S0, R) (S1, R) (Ps, R) (Pa, R));
            each1!(unary_case [(tp,), 3, "transpose(0, 2)", |t: &Dt<_, _, _, 3>| t.transpose(Dim::<0>, Dim::<2>), |d: &DTensor<f64>| d.transpose(0, 2), &x3, &x3t, mesh, fails];
                (R, R) (S0, R) (S1, R) (S2, R) (Ps, R));
            Ok(())
        },
        |mesh, fails| {
            product2!(unary_case [(dp, tp), 2, "t", |t: &Dt<_, _, _, 2>| t.t(), |d: &DTensor<f64>| d.transpose(0, 1), &x, &xt, mesh, fails];
                (R, R) (S0, R) (S1, R) (Ps, R));
            Ok(())
        },
    );
}

#[test]
fn redistribute_to_every_layout_keeps_the_value() {
    let x = global(&[5, 3], 11, false);
    macro_rules! redist_case {
        ([$m:ty, $mesh:expr, $fails:expr]; ($($a:ty),+ $(,)?), ($($b:ty),+ $(,)?)) => {{
            let a = input::<$m, ($($a,)+), 2>(&x, $mesh)?;
            let case = format!("redistribute {} -> {}", stringify!(($($a,)+)), stringify!(($($b,)+)));
            let t = a.redistribute::<($($b,)+)>();
            let d = a.as_dtensor().redistribute(&<($($b,)+) as TypedLayout<$m>>::placements());
            check(&case, t, d, &x, $fails)?;
        }};
    }
    on_meshes(
        |mesh, fails| {
            each1!(redist_case [(tp,), mesh, fails]; (S0, R) (S1, S0) (R, S1) (Ps, R) (Ps, S0) (Pa, S1) (R, R));
            Ok(())
        },
        |mesh, fails| {
            product2!(redist_case [(dp, tp), mesh, fails]; (S0, R) (S1, S0) (R, S1) (Ps, R) (Ps, S1));
            Ok(())
        },
    );
}

#[test]
fn conversion_from_dynamic_checks_names_rank_and_placements() {
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let g = global(&[4, 6], 12, false);
        let x: Dt<f64, (dp, tp), (S0, R), 2> = Dt::distribute(&g, &mesh)?;
        let d: DTensor<f64> = x.clone().into();
        let back = Dt::<f64, (dp, tp), (S0, R), 2>::try_from(d.clone());
        let wrong_layout = Dt::<f64, (dp, tp), (R, S1), 2>::from_dtensor(d.clone()).err();
        let wrong_rank = Dt::<f64, (dp, tp), (S0, R), 3>::from_dtensor(d.clone()).err();
        let wrong_names = Dt::<f64, (tp, dp), (S0, R), 2>::from_dtensor(d).err();
        let partial_distribute = Dt::<f64, (dp, tp), (S0, Ps), 2>::distribute(&g, &mesh).err();
        Ok((back.is_ok(), wrong_layout, wrong_rank, wrong_names, partial_distribute, x.local().shape().to_vec()))
    })
    .unwrap();
    for (ok, layout, rank, names, partial, local) in out {
        assert!(ok);
        assert_eq!(local, vec![2, 6]);
        let what = |e: Option<Error>| match e {
            Some(Error::TypedMismatch { what, .. }) => what,
            other => panic!("expected TypedMismatch, got {other:?}"),
        };
        // Each names what differs and the caller's line (`#[track_caller]`).
        for (e, want) in [(layout, "layout"), (rank, "tensor rank"), (names, "mesh dims")] {
            let w = what(e);
            assert!(w.starts_with(&format!("{want} (at ")) && w.contains("typed_rules.rs:"), "{w}");
        }
        assert!(matches!(partial, Some(Error::PartialNotAllowed { .. })), "{partial:?}");
    }
}

/// One case of a typed op with another name than its dynamic op: typed `a.$typed(&b)` vs
/// dynamic `a.$dynamic(b)`, and no communication by the dynamic op the typed one wraps (the
/// only implicit redistribution allowed is the local `Replicate` → `Partial` of a linear op).
macro_rules! pair_case {
    ([$m:ty, $ra:literal, $rb:literal, $typed:ident, $dynamic:ident, $ga:expr, $gb:expr, $expect:expr, $mesh:expr, $fails:expr]; $la:ty, $lb:ty) => {{
        let a = input::<$m, $la, $ra>($ga, $mesh)?;
        let b = input::<$m, $lb, $rb>($gb, $mesh)?;
        let case = format!("{} {} × {} {:?}", stringify!($typed), stringify!($la), stringify!($lb), $gb.shape());
        let _ = implicit_redistributions();
        let t = a.$typed(&b);
        for r in implicit_redistributions() {
            if r.bytes != 0 || r.from.iter().zip(&r.to).any(|(f, t)| f != t && !(f.is_replicate() && t.is_partial())) {
                $fails.push(format!("{case}: the typed op redistributed implicitly: {r:?}"));
            }
        }
        check(&case, t, a.as_dtensor().$dynamic(b.as_dtensor()), $expect, $fails)?;
    }};
}

/// `a op b` with numpy broadcasting (b broadcast to a's shape).
fn broadcast_ref(a: &ArrayD<f64>, b: &ArrayD<f64>, f: fn(f64, f64) -> f64) -> ArrayD<f64> {
    let b = b.broadcast(a.raw_dim()).expect("broadcastable");
    let mut out = a.clone();
    out.zip_mut_with(&b, |x, &y| *x = f(*x, y));
    out
}

#[test]
fn broadcast_rules_match_dynamic() {
    // A batch-sharded activation with a `[1, n]` and an `[n]` bias, a `[m, 1]` column scale,
    // and a `[1, n]` activation (an empty shard on the second rank of a sharded dim 0).
    let x = global(&[5, 3], 20, false);
    let (row, vec1, col, p) =
        (global(&[1, 3], 21, false), global(&[3], 22, false), global(&[5, 1], 23, false), global(&[1, 3], 24, true));
    let one = global(&[1, 3], 25, false);
    let (add, addv, mulc, div, sub1) = (
        broadcast_ref(&x, &row, |a, b| a + b),
        broadcast_ref(&x, &vec1, |a, b| a + b),
        broadcast_ref(&x, &col, |a, b| a * b),
        broadcast_ref(&x, &p, |a, b| a / b),
        broadcast_ref(&one, &vec1, |a, b| a - b),
    );
    on_meshes(
        |mesh, fails| {
            each1!(pair_case [(tp,), 2, 2, add_broadcast, add, &x, &row, &add, mesh, fails];
                (R, R) (S0, R) (Ps, R) (Ps, Ps) (R, Ps) (Pa, R) (Pa, Pa));
            each1!(pair_case [(tp,), 2, 1, add_broadcast, add, &x, &vec1, &addv, mesh, fails];
                (R, R) (S0, R) (Ps, R) (R, Pa));
            each1!(pair_case [(tp,), 2, 2, mul_broadcast, mul, &x, &col, &mulc, mesh, fails];
                (R, R) (S1, R) (Ps, R) (R, Ps) (Pa, R));
            each1!(pair_case [(tp,), 2, 2, div_broadcast, div, &x, &p, &div, mesh, fails];
                (R, R) (S0, R) (Ps, R));
            each1!(pair_case [(tp,), 2, 1, sub_broadcast, sub, &one, &vec1, &sub1, mesh, fails];
                (R, R) (S0, R) (Ps, Ps) (R, Ps));
            Ok(())
        },
        |mesh, fails| {
            product2!(pair_case [(dp, tp), 2, 2, add_broadcast, add, &x, &row, &add, mesh, fails];
                (R, R) (S0, R) (Ps, R) (R, Ps));
            product2!(pair_case [(dp, tp), 2, 1, mul_broadcast, mul, &x, &vec1, &broadcast_ref(&x, &vec1, |a, b| a * b), mesh, fails];
                (R, R) (S0, R) (Pa, R));
            Ok(())
        },
    );
}

#[test]
fn broadcast_sizes_the_types_cannot_see_are_errors_at_the_callers_line() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let x: Dt<f64, (tp,), (S0,), 2> = Dt::distribute(&global(&[4, 3], 26, false), &mesh)?;
        // A full-size replicated operand where `x` is sharded: the runtime would slice it.
        let full: Dt<f64, (tp,), (R,), 2> = Dt::distribute(&global(&[4, 3], 27, false), &mesh)?;
        // `x` itself would be broadcast: it is not the full-size operand.
        let wide: Dt<f64, (tp,), (R,), 2> = Dt::distribute(&global(&[1, 3], 28, false), &mesh)?;
        let big: Dt<f64, (tp,), (R,), 2> = Dt::distribute(&global(&[4, 3], 29, false), &mesh)?;
        let before = implicit_redistribution_count();
        let line = line!() + 1;
        let e1 = x.add_broadcast(&full).err();
        let e2 = wide.mul_broadcast(&big).err();
        Ok((e1, e2, line, implicit_redistribution_count() - before))
    })
    .unwrap();
    for (e1, e2, line, redistributions) in out {
        assert_eq!(redistributions, 0);
        for (e, l, want) in [(e1, line, "its dim 0 is not broadcast"), (e2, line + 1, "the broadcast shape")] {
            match e {
                Some(Error::TypedMismatch { what, expected, .. }) => {
                    assert!(what.contains(&format!("typed_rules.rs:{l}")), "{what}");
                    assert!(what.contains(want) || expected.contains(want), "{what} / {expected}");
                }
                other => panic!("expected TypedMismatch, got {other:?}"),
            }
        }
    }
}

/// `[.., m, k] @ [.., k, n]` with the same batch dims.
fn batched_ref(a: &ArrayD<f64>, b: &ArrayD<f64>) -> ArrayD<f64> {
    let (nd, m, n) = (a.ndim(), a.shape()[a.ndim() - 2], b.shape()[b.ndim() - 1]);
    let mut shape = a.shape().to_vec();
    shape[nd - 1] = n;
    let batch: usize = a.shape()[..nd - 2].iter().product();
    let k = a.shape()[nd - 1];
    let a3 = a.as_standard_layout().into_owned().into_shape_with_order((batch, m, k)).unwrap();
    let b3 = b.as_standard_layout().into_owned().into_shape_with_order((batch, k, n)).unwrap();
    let mut out = Vec::with_capacity(batch * m * n);
    for i in 0..batch {
        out.extend(a3.index_axis(Axis(0), i).dot(&b3.index_axis(Axis(0), i)).iter().copied());
    }
    ArrayD::from_shape_vec(IxDyn(&shape), out).unwrap()
}

#[test]
fn batched_matmul_rules_match_dynamic() {
    // [3, 5, 7] @ [3, 7, 4] and [2, 3, 5, 4] @ [2, 3, 4, 3]: uneven batch, m, k and n; a
    // [1, 2, 3] @ [1, 3, 2] batch of one leaves the second rank's batch shard empty.
    let (a3, b3) = (global(&[3, 5, 7], 30, false), global(&[3, 7, 4], 31, false));
    let (a4, b4) = (global(&[2, 3, 5, 4], 32, false), global(&[2, 3, 4, 3], 33, false));
    let (a1, b1) = (global(&[1, 2, 3], 34, false), global(&[1, 3, 2], 35, false));
    let (e3, e4, e1) = (batched_ref(&a3, &b3), batched_ref(&a4, &b4), batched_ref(&a1, &b1));
    on_meshes(
        |mesh, fails| {
            each1!(pair_case [(tp,), 3, 3, matmul_batched, matmul, &a3, &b3, &e3, mesh, fails];
                (R, R) (S0, S0) (S1, R) (R, S2) (S2, S1) (Ps, R) (R, Ps) (Pa, R));
            each1!(pair_case [(tp,), 4, 4, matmul_batched, matmul, &a4, &b4, &e4, mesh, fails];
                (R, R) (S0, S0) (S1, S1) (S2, R) (R, S3) (S3, S2) (Ps, R));
            each1!(pair_case [(tp,), 3, 3, matmul_batched, matmul, &a1, &b1, &e1, mesh, fails];
                (S0, S0) (S1, R) (S2, S1));
            Ok(())
        },
        |mesh, fails| {
            product2!(pair_case [(dp, tp), 4, 4, matmul_batched, matmul, &a4, &b4, &e4, mesh, fails];
                (R, R) (S0, S0) (S1, S1) (S2, R) (R, S3) (S3, S2));
            Ok(())
        },
    );
}

/// Layer norm (or RMS norm when `rms`) of `x` over its trailing `k` dims, times `w`, plus `b`.
fn norm_ref(x: &ArrayD<f64>, k: usize, w: &ArrayD<f64>, b: Option<&ArrayD<f64>>, rms: bool) -> ArrayD<f64> {
    let shape = x.shape().to_vec();
    let inner: usize = shape[shape.len() - k..].iter().product();
    let rows = x.len() / inner;
    let flat = x.as_standard_layout().into_owned().into_shape_with_order((rows, inner)).unwrap();
    let (wf, bf) = (w.iter().copied().collect::<Vec<_>>(), b.map(|b| b.iter().copied().collect::<Vec<_>>()));
    let mut out = Vec::with_capacity(x.len());
    for row in flat.rows() {
        let mean = if rms { 0.0 } else { row.sum() / inner as f64 };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / inner as f64;
        let inv = 1.0 / (var + 1e-5).sqrt();
        for (j, v) in row.iter().enumerate() {
            out.push((v - mean) * inv * wf[j] + bf.as_ref().map_or(0.0, |b| b[j]));
        }
    }
    ArrayD::from_shape_vec(IxDyn(&shape), out).unwrap()
}

#[test]
fn norm_rules_match_dynamic() {
    // [5, 3] over [3]; [3, 5, 2] over [2] and over [5, 2]; [1, 3] leaves an empty batch shard.
    let (x2, x3, x1) = (global(&[5, 3], 40, false), global(&[3, 5, 2], 41, false), global(&[1, 3], 42, false));
    let (w3, b3) = (global(&[3], 43, true), global(&[3], 44, false));
    let (w2, w52, b52) = (global(&[2], 45, true), global(&[5, 2], 46, true), global(&[5, 2], 47, false));
    let ln2 = norm_ref(&x2, 1, &w3, Some(&b3), false);
    let rms2 = norm_ref(&x2, 1, &w3, None, true);
    let ln3 = norm_ref(&x3, 1, &w2, None, false);
    let ln3k2 = norm_ref(&x3, 2, &w52, Some(&b52), false);
    let rms3k2 = norm_ref(&x3, 2, &w52, None, true);
    let ln1 = norm_ref(&x1, 1, &w3, Some(&b3), false);
    macro_rules! cases {
        ($cb:ident, $m:ty, $mesh:expr, $fails:expr; $($l:tt)*) => {{
            let w3: Dt<f64, $m, _, 1> = Dt::distribute(&w3, $mesh)?;
            let b3: Dt<f64, $m, _, 1> = Dt::distribute(&b3, $mesh)?;
            let w2: Dt<f64, $m, _, 1> = Dt::distribute(&w2, $mesh)?;
            let w52: Dt<f64, $m, _, 2> = Dt::distribute(&w52, $mesh)?;
            let b52: Dt<f64, $m, _, 2> = Dt::distribute(&b52, $mesh)?;
            let (dw3, db3, dw2, dw52, db52) = (w3.as_dtensor(), b3.as_dtensor(), w2.as_dtensor(), w52.as_dtensor(), b52.as_dtensor());
            $cb!(unary_case [$m, 2, "layer_norm [5, 3]", |t: &Dt<_, _, _, 2>| t.layer_norm([3], Some(&w3), Some(&b3), 1e-5), |d: &DTensor<f64>| d.layer_norm(&[3], Some(dw3), Some(db3), 1e-5), &x2, &ln2, $mesh, $fails]; $($l)*);
            $cb!(unary_case [$m, 2, "rms_norm [5, 3]", |t: &Dt<_, _, _, 2>| t.rms_norm([3], Some(&w3), 1e-5), |d: &DTensor<f64>| d.rms_norm(&[3], Some(dw3), 1e-5), &x2, &rms2, $mesh, $fails]; $($l)*);
            $cb!(unary_case [$m, 2, "layer_norm [1, 3]", |t: &Dt<_, _, _, 2>| t.layer_norm([3], Some(&w3), Some(&b3), 1e-5), |d: &DTensor<f64>| d.layer_norm(&[3], Some(dw3), Some(db3), 1e-5), &x1, &ln1, $mesh, $fails]; $($l)*);
            $cb!(unary_case [$m, 3, "layer_norm [3, 5, 2] over [2]", |t: &Dt<_, _, _, 3>| t.layer_norm([2], Some(&w2), None, 1e-5), |d: &DTensor<f64>| d.layer_norm(&[2], Some(dw2), None, 1e-5), &x3, &ln3, $mesh, $fails]; $($l)* (S1, R));
            $cb!(unary_case [$m, 3, "layer_norm [3, 5, 2] over [5, 2]", |t: &Dt<_, _, _, 3>| t.layer_norm([5, 2], Some(&w52), Some(&b52), 1e-5), |d: &DTensor<f64>| d.layer_norm(&[5, 2], Some(dw52), Some(db52), 1e-5), &x3, &ln3k2, $mesh, $fails]; $($l)*);
            $cb!(unary_case [$m, 3, "rms_norm [3, 5, 2] over [5, 2]", |t: &Dt<_, _, _, 3>| t.rms_norm([5, 2], Some(&w52), 1e-5), |d: &DTensor<f64>| d.rms_norm(&[5, 2], Some(dw52), 1e-5), &x3, &rms3k2, $mesh, $fails]; $($l)*);
        }};
    }
    on_meshes(
        |mesh, fails| {
            cases!(each1, (tp,), mesh, fails; (R, R) (S0, R));
            Ok(())
        },
        |mesh, fails| {
            cases!(product2, (dp, tp), mesh, fails; (R, R) (S0, R));
            Ok(())
        },
    );
}

/// `g` reshaped (row-major) to `shape`.
fn reshaped(g: &ArrayD<f64>, shape: &[usize]) -> ArrayD<f64> {
    g.as_standard_layout().into_owned().into_shape_with_order(IxDyn(shape)).unwrap()
}

/// `g` with its axes in `order` (output dim `k` is input dim `order[k]`).
fn permuted(g: &ArrayD<f64>, order: &[usize]) -> ArrayD<f64> {
    g.view().permuted_axes(order.to_vec()).as_standard_layout().into_owned()
}

#[test]
fn permute_rules_match_dynamic() {
    // [3, 5, 2]: dim 0 over a 2×2 `(S0, S0)` leaves rank (1, 1) an empty shard.
    let (x3, x4) = (global(&[3, 5, 2], 60, false), global(&[2, 3, 5, 2], 61, false));
    let (p201, p120, p0213) = (permuted(&x3, &[2, 0, 1]), permuted(&x3, &[1, 2, 0]), permuted(&x4, &[0, 2, 1, 3]));
    macro_rules! cases {
        ($cb:ident, $m:ty, $mesh:expr, $fails:expr; $($l:tt)*) => {{
            $cb!(unary_case [$m, 3, "permute(2, 0, 1)", |t: &Dt<_, _, _, 3>| t.permute((Dim::<2>, Dim::<0>, Dim::<1>)), |d: &DTensor<f64>| d.permute(&[2, 0, 1]), &x3, &p201, $mesh, $fails]; $($l)*);
            $cb!(unary_case [$m, 3, "permute(1, 2, 0)", |t: &Dt<_, _, _, 3>| t.permute((Dim::<1>, Dim::<2>, Dim::<0>)), |d: &DTensor<f64>| d.permute(&[1, 2, 0]), &x3, &p120, $mesh, $fails]; $($l)*);
            $cb!(unary_case [$m, 4, "permute(0, 2, 1, 3)", |t: &Dt<_, _, _, 4>| t.permute((Dim::<0>, Dim::<2>, Dim::<1>, Dim::<3>)), |d: &DTensor<f64>| d.permute(&[0, 2, 1, 3]), &x4, &p0213, $mesh, $fails]; $($l)* (S3, R));
        }};
    }
    on_meshes(
        |mesh, fails| {
            cases!(each1, (tp,), mesh, fails; (R, R) (S0, R) (S1, R) (S2, R) (Ps, R) (Pa, R));
            Ok(())
        },
        |mesh, fails| {
            cases!(product2, (dp, tp), mesh, fails; (R, R) (S0, R) (S2, R) (Ps, R));
            Ok(())
        },
    );
}

#[test]
fn unsqueeze_squeeze_rules_match_dynamic() {
    // Dim 0 of size 3: uneven over 2 ranks, and an empty shard under a 2×2 `(S0, S0)`.
    let (x, y) = (global(&[3, 5], 62, false), global(&[3, 1, 5], 63, false));
    let (u0, u1, u2) = (reshaped(&x, &[1, 3, 5]), reshaped(&x, &[3, 1, 5]), reshaped(&x, &[3, 5, 1]));
    let sq = reshaped(&y, &[3, 5]);
    macro_rules! cases {
        ($cb:ident, $m:ty, $mesh:expr, $fails:expr; $($l:tt)*) => {{
            $cb!(unary_case [$m, 2, "unsqueeze(0)", |t: &Dt<_, _, _, 2>| t.unsqueeze(Dim::<0>), |d: &DTensor<f64>| d.unsqueeze(0), &x, &u0, $mesh, $fails]; $($l)* (S1, R));
            $cb!(unary_case [$m, 2, "unsqueeze(1)", |t: &Dt<_, _, _, 2>| t.unsqueeze(Dim::<1>), |d: &DTensor<f64>| d.unsqueeze(1), &x, &u1, $mesh, $fails]; $($l)* (S1, R));
            $cb!(unary_case [$m, 2, "unsqueeze(2)", |t: &Dt<_, _, _, 2>| t.unsqueeze(Dim::<2>), |d: &DTensor<f64>| d.unsqueeze(2), &x, &u2, $mesh, $fails]; $($l)* (S1, R));
            $cb!(unary_case [$m, 3, "squeeze(1)", |t: &Dt<_, _, _, 3>| t.squeeze(Dim::<1>), |d: &DTensor<f64>| d.squeeze(Some(1)), &y, &sq, $mesh, $fails]; $($l)* (S2, R));
        }};
    }
    on_meshes(
        |mesh, fails| {
            cases!(each1, (tp,), mesh, fails; (R, R) (S0, R) (Ps, R) (Pa, R));
            Ok(())
        },
        |mesh, fails| {
            cases!(product2, (dp, tp), mesh, fails; (R, R) (S0, R) (Ps, R));
            Ok(())
        },
    );
}

#[test]
fn flatten_unflatten_rules_match_dynamic() {
    // [3, 4, 4, 2]: a shard of dim 0 (uneven; empty under `(S0, S0)`) is outside every
    // flattened group; dims 1 and 2 are the outermost of theirs and divide by 4.
    let x = global(&[3, 4, 4, 2], 64, false);
    let (f12, f23, f13) = (reshaped(&x, &[3, 16, 2]), reshaped(&x, &[3, 4, 8]), reshaped(&x, &[3, 32]));
    // [3, 8, 5]: dim 1 split into [4, 2]; the outer size divides by 4.
    let y = global(&[3, 8, 5], 65, false);
    let (u1, u2) = (reshaped(&y, &[3, 4, 2, 5]), reshaped(&y, &[3, 8, 5, 1]));
    macro_rules! cases {
        ($cb:ident, $m:ty, $mesh:expr, $fails:expr; $($l:tt)*) => {{
            $cb!(unary_case [$m, 4, "flatten(1, 2)", |t: &Dt<_, _, _, 4>| t.flatten(Dims::<1, 2>), |d: &DTensor<f64>| d.flatten(1, 2), &x, &f12, $mesh, $fails]; $($l)* (S1, R) (S3, R));
            $cb!(unary_case [$m, 4, "flatten(2, 3)", |t: &Dt<_, _, _, 4>| t.flatten(Dims::<2, 3>), |d: &DTensor<f64>| d.flatten(2, 3), &x, &f23, $mesh, $fails]; $($l)* (S1, R) (S2, R));
            $cb!(unary_case [$m, 4, "flatten(1, 3)", |t: &Dt<_, _, _, 4>| t.flatten(Dims::<1, 3>), |d: &DTensor<f64>| d.flatten(1, 3), &x, &f13, $mesh, $fails]; $($l)* (S1, R));
            $cb!(unary_case [$m, 3, "unflatten(1, [4, 2])", |t: &Dt<_, _, _, 3>| t.unflatten(Dim::<1>, [4, 2]), |d: &DTensor<f64>| d.unflatten(1, &[4, 2]), &y, &u1, $mesh, $fails]; $($l)* (S1, R) (S2, R));
            $cb!(unary_case [$m, 3, "unflatten(2, [5, 1])", |t: &Dt<_, _, _, 3>| t.unflatten(Dim::<2>, [5, 1]), |d: &DTensor<f64>| d.unflatten(2, &[5, 1]), &y, &u2, $mesh, $fails]; $($l)* (S1, R));
        }};
    }
    on_meshes(
        |mesh, fails| {
            cases!(each1, (tp,), mesh, fails; (R, R) (S0, R) (Ps, R) (Pa, R));
            Ok(())
        },
        |mesh, fails| {
            cases!(product2, (dp, tp), mesh, fails; (R, R) (S0, R) (Ps, R));
            Ok(())
        },
    );
}

/// `g[.., start..start + len, ..]` along `dim`.
fn narrowed(g: &ArrayD<f64>, dim: usize, start: usize, len: usize) -> ArrayD<f64> {
    g.slice_axis(Axis(dim), Slice::from(start..start + len)).to_owned()
}

#[test]
fn narrow_split_chunk_cat_rules_match_dynamic() {
    // [3, 7]: dim 0 uneven over 2 ranks and with an empty shard under a 2×2 `(S0, S0)`.
    let (x, a, b) = (global(&[3, 7], 66, false), global(&[3, 2], 67, false), global(&[3, 4], 68, false));
    let (n1, n0) = (narrowed(&x, 1, 2, 4), narrowed(&x, 0, 1, 2));
    let cat1 = dtensor_runtime::ndarray::concatenate(Axis(1), &[a.view(), b.view(), a.view()]).unwrap();
    // split(3) and chunk(3) of 7: [3, 3, 1]; chunk(4) of 7: [2, 2, 2, 1].
    let (by3, by2) = ([(0, 3), (3, 3), (6, 1)], [(0, 2), (2, 2), (4, 2), (6, 1)]);
    macro_rules! pieces_case {
        ([$m:ty, $name:literal, $typed:expr, $dynamic:expr, $parts:expr, $mesh:expr, $fails:expr]; $la:ty, $_lb:ty) => {{
            let t = input::<$m, $la, 2>(&x, $mesh)?;
            let (tp_, dp_) = (($typed)(&t)?, ($dynamic)(t.as_dtensor())?);
            let (tp_, dp_): (Vec<Dt<f64, $m, $la, 2>>, Vec<DTensor<f64>>) = (tp_, dp_);
            if tp_.len() != $parts.len() || dp_.len() != $parts.len() {
                $fails.push(format!("{} {}: {} / {} pieces", $name, stringify!($la), tp_.len(), dp_.len()));
            }
            for (i, ((tpi, dpi), &(s, n))) in tp_.into_iter().zip(dp_).zip($parts.iter()).enumerate() {
                let case = format!("{} {} piece {i}", $name, stringify!($la));
                check(&case, Ok(tpi), Ok(dpi), &narrowed(&x, 1, s, n), $fails)?;
            }
        }};
    }
    macro_rules! cat_case {
        ([$m:ty, $mesh:expr, $fails:expr]; $la:ty, $_lb:ty) => {{
            let (ta, tb) = (input::<$m, $la, 2>(&a, $mesh)?, input::<$m, $la, 2>(&b, $mesh)?);
            let case = format!("cat(1) {}", stringify!($la));
            let dynamic = dtensor_runtime::ops::cat(&[ta.as_dtensor(), tb.as_dtensor(), ta.as_dtensor()], 1);
            check(&case, Dt::cat(&[&ta, &tb, &ta], Dim::<1>), dynamic, &cat1, $fails)?;
        }};
    }
    macro_rules! cases {
        ($cb:ident, $m:ty, $mesh:expr, $fails:expr; $($l:tt)*) => {{
            $cb!(unary_case [$m, 2, "narrow(1, 2, 4)", |t: &Dt<_, _, _, 2>| t.narrow(Dim::<1>, 2, 4), |d: &DTensor<f64>| d.narrow(1, 2, 4), &x, &n1, $mesh, $fails]; $($l)*);
            $cb!(unary_case [$m, 2, "narrow(0, 1, 2)", |t: &Dt<_, _, _, 2>| t.narrow(Dim::<0>, 1, 2), |d: &DTensor<f64>| d.narrow(0, 1, 2), &x, &n0, $mesh, $fails]; (R, R) (S1, R) (Ps, R));
            $cb!(pieces_case [$m, "split(3, 1)", |t: &Dt<f64, $m, _, 2>| t.split(3, Dim::<1>), |d: &DTensor<f64>| d.split(3, 1), by3, $mesh, $fails]; $($l)*);
            $cb!(pieces_case [$m, "chunk(3, 1)", |t: &Dt<f64, $m, _, 2>| t.chunk(3, Dim::<1>), |d: &DTensor<f64>| d.chunk(3, 1), by3, $mesh, $fails]; $($l)*);
            $cb!(pieces_case [$m, "chunk(4, 1)", |t: &Dt<f64, $m, _, 2>| t.chunk(4, Dim::<1>), |d: &DTensor<f64>| d.chunk(4, 1), by2, $mesh, $fails]; $($l)*);
            $cb!(cat_case [$m, $mesh, $fails]; $($l)*);
        }};
    }
    on_meshes(
        |mesh, fails| {
            cases!(each1, (tp,), mesh, fails; (R, R) (S0, R) (Ps, R) (Pa, R));
            Ok(())
        },
        |mesh, fails| {
            cases!(product2, (dp, tp), mesh, fails; (R, R) (S0, R) (Ps, R));
            Ok(())
        },
    );
}

#[test]
fn view_sizes_the_types_cannot_see_are_errors_at_the_callers_line() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        // [2, 6] sharded on dim 1: splitting it into [3, 2] puts 3 rows on 2 ranks.
        let x: Dt<f64, (tp,), (S1,), 2> = Dt::distribute(&global(&[2, 6], 69, false), &mesh)?;
        // [3, 4] sharded on dim 0: merging it with dim 1 is not a chunk of the merge.
        let y: Dt<f64, (tp,), (S0,), 2> = Dt::distribute(&global(&[3, 4], 70, false), &mesh)?;
        let before = implicit_redistribution_count();
        let line = line!() + 1;
        let e1 = x.unflatten(Dim::<1>, [3, 2]).err();
        let e2 = y.flatten(Dims::<0, 1>).err();
        let e3 = y.squeeze(Dim::<1>).err();
        let ok = x.unflatten(Dim::<1>, [2, 3])?.full_tensor()? == reshaped(&global(&[2, 6], 69, false), &[2, 2, 3]);
        Ok((e1, e2, e3, ok, line, implicit_redistribution_count() - before))
    })
    .unwrap();
    for (e1, e2, e3, ok, line, redistributions) in out {
        assert!(ok, "the even split works");
        assert_eq!(redistributions, 0);
        for (e, l, want) in [(e1, line, "unflatten"), (e2, line + 1, "flatten"), (e3, line + 2, "size 1")] {
            match e {
                Some(Error::TypedMismatch { what, expected, .. }) => {
                    assert!(what.contains(&format!("typed_rules.rs:{l}")), "{what}");
                    assert!(what.contains(want) || expected.contains(want), "{what} / {expected}");
                }
                other => panic!("expected TypedMismatch, got {other:?}"),
            }
        }
    }
}
