//! Every typed rule against the dynamic op: for each marker combination that compiles, on a
//! 2-rank mesh and a 2×2 mesh, the typed op and the dynamic op on the same inputs give
//! (1) the same placements — the layout the type system computed is what the dynamic sharding
//! propagation returns, (2) the same full tensor, (3) equal to the single-device reference
//! computed with ndarray on the global inputs. Uneven shapes (5, 3, 7) exercise torch.chunk
//! sharding. Partial inputs are built with `from_local` from unequal per-rank parts. Layouts
//! that mix two Partial ops do not compile (`cargo build`), so products keep one op each.

use dtensor_runtime::layout::checked_local_shape_and_offset;
use dtensor_runtime::ndarray::{ArrayD, Axis, Ix2, IxDyn, Slice};
use dtensor_runtime::typed::dims::{dp, tp};
use dtensor_runtime::typed::{Avg, Dim, Dt, MeshDims, Partial, Replicate, Shard, Sum, TypedLayout};
use dtensor_runtime::{from_local, run, DTensor, DeviceMesh, Error, FromLocal, Placement, ReduceOp, Result};

type S0 = Shard<0>;
type S1 = Shard<1>;
type S2 = Shard<2>;
type R = Replicate;
type Ps = Partial<Sum>;
type Pa = Partial<Avg>;

/// Deterministic global tensor, values in [-2, 2] (or [0.5, 2.5] when `positive`).
fn global(shape: &[usize], seed: usize, positive: bool) -> ArrayD<f64> {
    let mut i = 0usize;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        i += 1;
        let v = ((i * 37 + seed * 101) % 17) as f64 / 4.0; // 0 ..= 4, exact in binary
        if positive {
            v / 2.0 + 0.5
        } else {
            v - 2.0
        }
    })
}

/// A typed input holding `g` with layout `L`. A `Partial<Sum>` mesh dim splits the value
/// 1/4 : 3/4 over its two ranks, a `Partial<Avg>` one as `g + 1/2` and `g - 1/2`.
fn input<M: MeshDims, L: TypedLayout<M>, const RK: usize>(
    g: &ArrayD<f64>,
    mesh: &DeviceMesh,
) -> Result<Dt<f64, M, L, RK>> {
    let ps = L::placements();
    let (shape, off) = checked_local_shape_and_offset(g.shape(), mesh.shape(), mesh.coordinate(), &ps)?;
    let mut v = g.view();
    for d in 0..shape.len() {
        v.slice_axis_inplace(Axis(d), Slice::from(off[d]..off[d] + shape[d]));
    }
    let mut local = v.to_owned();
    for (i, p) in ps.iter().enumerate() {
        assert_eq!(mesh.size(i), 2, "the partial split below assumes 2 ranks per mesh dim");
        let first = mesh.coordinate()[i] == 0;
        match p {
            Placement::Partial(ReduceOp::Sum) => local.mapv_inplace(|x| x * if first { 0.25 } else { 0.75 }),
            Placement::Partial(ReduceOp::Avg) => local.mapv_inplace(|x| x + if first { 0.5 } else { -0.5 }),
            _ => {}
        }
    }
    Dt::from_dtensor(from_local(local, mesh, &ps, FromLocal::with_shape(g.shape()))?)
}

/// Compares a typed result with the dynamic one and the reference; collective (every rank
/// calls it for every case, in the same order).
fn check<M: MeshDims, L: TypedLayout<M>, const RK: usize>(
    case: &str,
    typed: Result<Dt<f64, M, L, RK>>,
    dynamic: Result<DTensor<f64>>,
    expect: &ArrayD<f64>,
    fails: &mut Vec<String>,
) -> Result<()> {
    let (typed, dynamic) = match (typed, dynamic) {
        (Ok(t), Ok(d)) => (t, d),
        (t, d) => {
            fails.push(format!("{case}: typed {:?} / dynamic {:?}", t.err(), d.err()));
            return Ok(());
        }
    };
    if L::placements() != dynamic.placements() {
        fails.push(format!("{case}: typed layout {:?} but dynamic {:?}", L::placements(), dynamic.placements()));
    }
    let (ft, fd) = (typed.full_tensor()?, dynamic.full_tensor()?);
    if ft != fd {
        fails.push(format!("{case}: typed and dynamic results differ"));
    }
    let err = (&ft - expect).iter().fold(0.0f64, |m, x| m.max(x.abs()));
    if ft.shape() != expect.shape() || err > 1e-9 {
        fails.push(format!(
            "{case}: result differs from the single-device reference (shape {:?}, max err {err})",
            ft.shape()
        ));
    }
    Ok(())
}

/// Calls `$cb!($($args)*; La, Lb)` for every pair of per-mesh-dim pairs (the 2-D product).
macro_rules! product2 {
    ($cb:ident $args:tt; $($p:tt)*) => {
        product2!(@outer $cb $args [$($p)*]; $($p)*);
    };
    (@outer $cb:ident $args:tt $all:tt; ) => {};
    (@outer $cb:ident $args:tt $all:tt; $first:tt $($rest:tt)*) => {
        product2!(@inner $cb $args $first; $all);
        product2!(@outer $cb $args $all; $($rest)*);
    };
    (@inner $cb:ident $args:tt ($a0:ty, $b0:ty); [$(($a1:ty, $b1:ty))*]) => {
        $($cb!($args; ($a0, $a1), ($b0, $b1));)*
    };
}

/// Calls `$cb!($($args)*; (La,), (Lb,))` for every per-mesh-dim pair (1-D mesh).
macro_rules! each1 {
    ($cb:ident $args:tt; $(($a:ty, $b:ty))*) => {
        $($cb!($args; ($a,), ($b,));)*
    };
}

/// One binary case: typed `a.$op(&b)` vs dynamic `a.$op(b)`.
macro_rules! binary_case {
    ([$m:ty, $ra:literal, $rb:literal, $op:ident, $ga:expr, $gb:expr, $expect:expr, $mesh:expr, $fails:expr]; $la:ty, $lb:ty) => {{
        let a = input::<$m, $la, $ra>($ga, $mesh)?;
        let b = input::<$m, $lb, $rb>($gb, $mesh)?;
        let case = format!("{} {} × {}", stringify!($op), stringify!($la), stringify!($lb));
        check(&case, a.$op(&b), a.as_dtensor().$op(b.as_dtensor()), $expect, $fails)?;
    }};
}

/// One unary case: `$typed` and `$dynamic` are closures of the typed / dynamic input.
macro_rules! unary_case {
    ([$m:ty, $r:literal, $name:literal, $typed:expr, $dynamic:expr, $g:expr, $expect:expr, $mesh:expr, $fails:expr]; $la:ty, $_lb:ty) => {{
        let a = input::<$m, $la, $r>($g, $mesh)?;
        let case = format!("{} {}", $name, stringify!($la));
        let t: &Dt<f64, $m, $la, $r> = &a;
        check(&case, ($typed)(t), ($dynamic)(a.as_dtensor()), $expect, $fails)?;
    }};
}

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

/// Runs `body` on a 2-rank `tp` mesh and on a 2×2 `dp × tp` mesh; fails with every mismatch.
fn on_meshes(
    body1: impl Fn(&DeviceMesh, &mut Vec<String>) -> Result<()> + Sync,
    body2: impl Fn(&DeviceMesh, &mut Vec<String>) -> Result<()> + Sync,
) {
    let r1 = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let mut fails = vec![];
        body1(&mesh, &mut fails)?;
        Ok(fails)
    });
    let r2 = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let mut fails = vec![];
        body2(&mesh, &mut fails)?;
        Ok(fails)
    });
    let fails: Vec<String> = [r1, r2].into_iter().flat_map(|r| r.expect("run")).flatten().collect();
    assert!(fails.is_empty(), "{} failures:\n{}", fails.len(), fails.join("\n"));
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
