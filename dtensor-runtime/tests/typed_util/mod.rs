//! Helpers of the typed-rule tests: deterministic global inputs, typed inputs of any layout
//! (Partial ones built from unequal per-rank parts), the three-way check typed / dynamic /
//! single-device reference, and the layout-product macros.
#![allow(dead_code, unused_macros, unused_imports)]

use dtensor_runtime::layout::checked_local_shape_and_offset;
use dtensor_runtime::ndarray::{ArrayD, Axis, IxDyn, Slice};
use dtensor_runtime::ops::implicit::{forbid_implicit, ScopeSite};
use dtensor_runtime::typed::{Avg, Dt, MeshDims, Partial, Replicate, Shard, Sum, TypedLayout};
use dtensor_runtime::{from_local, run, DTensor, DeviceMesh, FromLocal, Placement, ReduceOp, Result};

pub type S0 = Shard<0>;
pub type S1 = Shard<1>;
pub type S2 = Shard<2>;
pub type S3 = Shard<3>;
pub type R = Replicate;
pub type Ps = Partial<Sum>;
pub type Pa = Partial<Avg>;

/// Deterministic global tensor, values in [-2, 2] (or [0.5, 2.5] when `positive`).
pub fn global(shape: &[usize], seed: usize, positive: bool) -> ArrayD<f64> {
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
/// 1/4 : 3/4 over its two ranks, a `Partial<Avg>` one as `g + 1/2` and `g - 1/2`; on a mesh
/// dim of one rank, that rank holds the whole value.
pub fn input<M: MeshDims, L: TypedLayout<M>, const RK: usize>(
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
        assert!(mesh.size(i) <= 2, "the partial split below assumes at most 2 ranks per mesh dim");
        if mesh.size(i) == 1 {
            continue;
        }
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
pub fn check<M: MeshDims, L: TypedLayout<M>, const RK: usize>(
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

/// Runs `body` on a 2-rank `tp` mesh and on a 2×2 `dp × tp` mesh; fails with every mismatch.
pub fn on_meshes(
    body1: impl Fn(&DeviceMesh, &mut Vec<String>) -> Result<()> + Sync,
    body2: impl Fn(&DeviceMesh, &mut Vec<String>) -> Result<()> + Sync,
) {
    // Every typed op runs under its typed-op guard (no communicating move its rule does not
    // show) and inside a `#[distribute]` body's guard (no implicit collective): the typed
    // rules and the guard must agree. The 1-rank meshes check that the rules hold where every
    // group has one rank.
    let on = |world: usize, shape: &'static [usize], names: &'static [&'static str], two_d: bool| {
        run(world, |ctx| {
            let mesh = ctx.init_device_mesh(shape, names)?;
            let site = ScopeSite { function: "typed_util::on_meshes", file: file!(), line: line!() };
            let _guard = forbid_implicit(site);
            let mut fails = vec![];
            if two_d {
                body2(&mesh, &mut fails)?;
            } else {
                body1(&mesh, &mut fails)?;
            }
            Ok(fails.into_iter().map(|f| format!("[mesh {shape:?}] {f}")).collect::<Vec<_>>())
        })
    };
    let r1 = on(2, &[2], &["tp"], false);
    let r2 = on(4, &[2, 2], &["dp", "tp"], true);
    let r3 = on(1, &[1], &["tp"], false);
    let r4 = on(1, &[1, 1], &["dp", "tp"], true);
    let fails: Vec<String> = [r1, r2, r3, r4].into_iter().flat_map(|r| r.expect("run")).flatten().collect();
    assert!(fails.is_empty(), "{} failures:\n{}", fails.len(), fails.join("\n"));
}
