//! The typed rules of `min`, `argmax` / `argmin`, `stack`, `index_select`, `gather` and
//! `repeat_interleave` against the dynamic ops and the single-device reference, on a 2-rank
//! and a 2×2 mesh: same placements, same values. Uneven sizes (5 rows over 2 ranks) and a
//! dim of size 1 sharded over 2 ranks (an empty shard) exercise torch.chunk sharding; legal
//! layouts issue no implicit redistribution.

#[macro_use]
mod typed_util;

use dtensor_runtime::ndarray::{ArrayD, Axis};
use dtensor_runtime::ops::implicit_redistribution_count;
use dtensor_runtime::typed::dims::{dp, tp};
use dtensor_runtime::typed::{Dim, Dt};
use dtensor_runtime::DTensor;
use typed_util::*;

/// Records a failure when this rank redistributed implicitly since `before`.
fn no_implicit(before: usize, fails: &mut Vec<String>) {
    let n = implicit_redistribution_count() - before;
    if n != 0 {
        fails.push(format!("{n} implicit redistributions on legal typed layouts"));
    }
}

/// Min over `dim`, kept.
fn min_ref(x: &ArrayD<f64>, dim: usize) -> ArrayD<f64> {
    x.fold_axis(Axis(dim), f64::INFINITY, |a, &b| a.min(b)).insert_axis(Axis(dim))
}

/// Index of the first maximum (`max`) or minimum over `dim`, kept.
fn arg_ref(x: &ArrayD<f64>, dim: usize, max: bool) -> ArrayD<f64> {
    x.map_axis(Axis(dim), |lane| {
        let mut best = 0;
        for (i, &v) in lane.iter().enumerate() {
            if (max && v > lane[best]) || (!max && v < lane[best]) {
                best = i;
            }
        }
        best as f64
    })
    .insert_axis(Axis(dim))
}

#[test]
fn min_and_arg_reduction_rules_match_dynamic() {
    // [5, 3]: dim 0 uneven over 2 ranks; [1, 4]: an empty shard of dim 0.
    let (x, x1) = (global(&[5, 3], 11, false), global(&[1, 4], 12, false));
    let (m0, m1, m1x1) = (min_ref(&x, 0), min_ref(&x, 1), min_ref(&x1, 1));
    let (amax0, amax1, amin1) = (arg_ref(&x, 0, true), arg_ref(&x, 1, true), arg_ref(&x, 1, false));
    let (amax1x1, amin0) = (arg_ref(&x1, 1, true), arg_ref(&x, 0, false));
    macro_rules! cases {
        ($cb:ident, $m:ty, $mesh:expr, $fails:expr; $($l:tt)*) => {{
            $cb!(unary_case [$m, 2, "min(0)", |t: &Dt<_, _, _, 2>| t.min(Dim::<0>), |d: &DTensor<f64>| d.min_dim(0, true), &x, &m0, $mesh, $fails]; $($l)*);
            $cb!(unary_case [$m, 2, "min(1)", |t: &Dt<_, _, _, 2>| t.min(Dim::<1>), |d: &DTensor<f64>| d.min_dim(1, true), &x, &m1, $mesh, $fails]; $($l)*);
            $cb!(unary_case [$m, 2, "min(1) [1, 4]", |t: &Dt<_, _, _, 2>| t.min(Dim::<1>), |d: &DTensor<f64>| d.min_dim(1, true), &x1, &m1x1, $mesh, $fails]; $($l)*);
            // argmax over dim 1: rows may stay sharded; over dim 0: columns may. The indices are
            // i64, compared as f64 (exact at these sizes).
            $cb!(unary_case [$m, 2, "argmax(1)", |t: &Dt<_, _, _, 2>| t.argmax(Dim::<1>).and_then(|i| i.cast::<f64>()), |d: &DTensor<f64>| d.argmax(1, true).and_then(|i| i.cast::<f64>()), &x, &amax1, $mesh, $fails]; (R, R) (S0, R));
            $cb!(unary_case [$m, 2, "argmin(1)", |t: &Dt<_, _, _, 2>| t.argmin(Dim::<1>).and_then(|i| i.cast::<f64>()), |d: &DTensor<f64>| d.argmin(1, true).and_then(|i| i.cast::<f64>()), &x, &amin1, $mesh, $fails]; (R, R) (S0, R));
            $cb!(unary_case [$m, 2, "argmax(1) [1, 4]", |t: &Dt<_, _, _, 2>| t.argmax(Dim::<1>).and_then(|i| i.cast::<f64>()), |d: &DTensor<f64>| d.argmax(1, true).and_then(|i| i.cast::<f64>()), &x1, &amax1x1, $mesh, $fails]; (R, R) (S0, R));
            $cb!(unary_case [$m, 2, "argmax(0)", |t: &Dt<_, _, _, 2>| t.argmax(Dim::<0>).and_then(|i| i.cast::<f64>()), |d: &DTensor<f64>| d.argmax(0, true).and_then(|i| i.cast::<f64>()), &x, &amax0, $mesh, $fails]; (R, R) (S1, R));
            $cb!(unary_case [$m, 2, "argmin(0)", |t: &Dt<_, _, _, 2>| t.argmin(Dim::<0>).and_then(|i| i.cast::<f64>()), |d: &DTensor<f64>| d.argmin(0, true).and_then(|i| i.cast::<f64>()), &x, &amin0, $mesh, $fails]; (R, R) (S1, R));
        }};
    }
    on_meshes(
        |mesh, fails| {
            let before = implicit_redistribution_count();
            cases!(each1, (tp,), mesh, fails; (R, R) (S0, R) (S1, R));
            no_implicit(before, fails);
            Ok(())
        },
        |mesh, fails| {
            let before = implicit_redistribution_count();
            cases!(product2, (dp, tp), mesh, fails; (R, R) (S0, R) (S1, R));
            no_implicit(before, fails);
            Ok(())
        },
    );
}

#[test]
fn min_all_matches_the_reference() {
    let x = global(&[5, 3], 13, false);
    let lo = ArrayD::from_elem(vec![], x.fold(f64::INFINITY, |a, &b| a.min(b)));
    on_meshes(
        |mesh, fails| {
            each1!(unary_case [(tp,), 2, "min_all", |t: &Dt<_, _, _, 2>| t.min_all(), |d: &DTensor<f64>| d.min(), &x, &lo, mesh, fails]; (R, R) (S0, R) (S1, R));
            Ok(())
        },
        |mesh, fails| {
            product2!(unary_case [(dp, tp), 2, "min_all", |t: &Dt<_, _, _, 2>| t.min_all(), |d: &DTensor<f64>| d.min(), &x, &lo, mesh, fails]; (R, R) (S0, R) (S1, R));
            Ok(())
        },
    );
}

#[test]
fn stack_rules_match_dynamic() {
    // [5, 3] stacked with [5, 3]: the new dim at 0, 1 or 2 shifts the shards after it.
    let (a, b) = (global(&[5, 3], 21, false), global(&[5, 3], 22, false));
    let st = |d| dtensor_runtime::ndarray::stack(Axis(d), &[a.view(), b.view()]).unwrap();
    let (st0, st1, st2) = (st(0), st(1), st(2));
    macro_rules! stack_case {
        ([$m:ty, $d:literal, $expect:expr, $mesh:expr, $fails:expr]; $la:ty, $_lb:ty) => {{
            let (ta, tb) = (input::<$m, $la, 2>(&a, $mesh)?, input::<$m, $la, 2>(&b, $mesh)?);
            let case = format!("stack({}) {}", $d, stringify!($la));
            let dynamic = dtensor_runtime::ops::stack(&[ta.as_dtensor(), tb.as_dtensor()], $d);
            let typed: dtensor_runtime::Result<Dt<f64, $m, _, 3>> = Dt::stack(&[&ta, &tb], Dim::<$d>);
            check(&case, typed, dynamic, $expect, $fails)?;
        }};
    }
    macro_rules! cases {
        ($cb:ident, $m:ty, $mesh:expr, $fails:expr; $($l:tt)*) => {{
            $cb!(stack_case [$m, 0, &st0, $mesh, $fails]; $($l)*);
            $cb!(stack_case [$m, 1, &st1, $mesh, $fails]; $($l)*);
            $cb!(stack_case [$m, 2, &st2, $mesh, $fails]; $($l)*);
        }};
    }
    on_meshes(
        |mesh, fails| {
            let before = implicit_redistribution_count();
            cases!(each1, (tp,), mesh, fails; (R, R) (S0, R) (S1, R) (Ps, R) (Pa, R));
            no_implicit(before, fails);
            Ok(())
        },
        |mesh, fails| {
            let before = implicit_redistribution_count();
            cases!(product2, (dp, tp), mesh, fails; (R, R) (S0, R) (S1, R) (Ps, R));
            no_implicit(before, fails);
            Ok(())
        },
    );
}

/// Whole-number ids in `[0, n)`.
fn ids(shape: &[usize], n: usize, seed: usize) -> ArrayD<f64> {
    global(shape, seed, true).mapv(|x| ((x - 0.5) * 4.0).floor() % n as f64)
}

fn index_select_ref(x: &ArrayD<f64>, dim: usize, ids: &ArrayD<f64>) -> ArrayD<f64> {
    let at: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
    x.select(Axis(dim), &at)
}

fn gather_ref(x: &ArrayD<f64>, dim: usize, ids: &ArrayD<f64>) -> ArrayD<f64> {
    ArrayD::from_shape_fn(ids.raw_dim(), |ix| {
        let mut at = ix.clone();
        at[dim] = ids[&ix] as usize;
        x[&at]
    })
}

#[test]
fn index_select_and_gather_rules_match_dynamic() {
    // [5, 4]: 5 rows uneven over 2 ranks; 3 ids (uneven) and 1 id (an empty shard).
    let x = global(&[5, 4], 31, false);
    let (i1, i0, i1one) = (ids(&[3], 4, 32), ids(&[3], 5, 33), ids(&[1], 4, 34));
    assert!(i1.iter().any(|&i| i >= 2.0) && i0.iter().any(|&i| i >= 3.0));
    let (sel1, sel0, sel1one) =
        (index_select_ref(&x, 1, &i1), index_select_ref(&x, 0, &i0), index_select_ref(&x, 1, &i1one));
    // gather along 1 with an index of 5 rows (shards of dim 0 line up), along 0 with 2 rows.
    let (g1, g0) = (ids(&[5, 3], 4, 35), ids(&[2, 4], 5, 36));
    let (gat1, gat0) = (gather_ref(&x, 1, &g1), gather_ref(&x, 0, &g0));
    macro_rules! sel_case {
        ([$m:ty, $d:literal, $ids:expr, $expect:expr, $mesh:expr, $fails:expr]; $lx:ty, $li:ty) => {{
            let t = input::<$m, $lx, 2>(&x, $mesh)?;
            let i = input::<$m, $li, 1>($ids, $mesh)?;
            let case = format!("index_select({}) {} ids {} {:?}", $d, stringify!($lx), stringify!($li), $ids.shape());
            check(
                &case,
                t.index_select(Dim::<$d>, &i),
                t.as_dtensor().index_select($d, i.as_dtensor()),
                $expect,
                $fails,
            )?;
        }};
    }
    macro_rules! gather_case {
        ([$m:ty, $d:literal, $ids:expr, $expect:expr, $mesh:expr, $fails:expr]; $lx:ty, $li:ty) => {{
            let t = input::<$m, $lx, 2>(&x, $mesh)?;
            let i = input::<$m, $li, 2>($ids, $mesh)?;
            let case = format!("gather({}) {} index {}", $d, stringify!($lx), stringify!($li));
            check(&case, t.gather(Dim::<$d>, &i), t.as_dtensor().gather($d, i.as_dtensor()), $expect, $fails)?;
        }};
    }
    on_meshes(
        |mesh, fails| {
            let before = implicit_redistribution_count();
            each1!(sel_case [(tp,), 1, &i1, &sel1, mesh, fails]; (R, R) (S0, R) (R, S0) (Ps, R) (Pa, R));
            each1!(sel_case [(tp,), 1, &i1one, &sel1one, mesh, fails]; (R, S0) (S0, R));
            each1!(sel_case [(tp,), 0, &i0, &sel0, mesh, fails]; (R, R) (S1, R) (R, S0) (Ps, R));
            each1!(gather_case [(tp,), 1, &g1, &gat1, mesh, fails]; (R, R) (S0, S0) (R, S1) (Ps, R) (Pa, R));
            each1!(gather_case [(tp,), 0, &g0, &gat0, mesh, fails]; (R, R) (S1, S1) (R, S0));
            no_implicit(before, fails);
            Ok(())
        },
        |mesh, fails| {
            let before = implicit_redistribution_count();
            product2!(sel_case [(dp, tp), 1, &i1, &sel1, mesh, fails]; (R, R) (S0, R) (R, S0) (Ps, R));
            product2!(sel_case [(dp, tp), 0, &i0, &sel0, mesh, fails]; (R, R) (S1, R) (R, S0));
            product2!(gather_case [(dp, tp), 1, &g1, &gat1, mesh, fails]; (R, R) (S0, S0) (R, S1) (Ps, R));
            product2!(gather_case [(dp, tp), 0, &g0, &gat0, mesh, fails]; (R, R) (S1, S1) (R, S0));
            no_implicit(before, fails);
            Ok(())
        },
    );
}

/// `repeats` copies of every slice of `dim`, in place.
fn interleave_ref(x: &ArrayD<f64>, dim: usize, repeats: usize) -> ArrayD<f64> {
    let at: Vec<usize> = (0..x.shape()[dim] * repeats).map(|i| i / repeats).collect();
    x.select(Axis(dim), &at)
}

/// `x` tiled `repeats[i]` times along dim `i`.
fn tile_ref(x: &ArrayD<f64>, repeats: &[usize]) -> ArrayD<f64> {
    let mut out = x.clone();
    for (d, &r) in repeats.iter().enumerate() {
        let at: Vec<usize> = (0..out.shape()[d] * r).map(|i| i % out.shape()[d]).collect();
        out = out.select(Axis(d), &at);
    }
    out
}

#[test]
fn repeat_rules_match_dynamic() {
    // [2, 4, 3]: 4 kv heads repeated twice (GQA); heads divide over 2 and 4 shards, and the
    // uneven rows of 3 over 2 ranks stay sharded when another dim is repeated.
    let x = global(&[2, 4, 3], 41, false);
    let (rep1, rep2) = (interleave_ref(&x, 1, 2), interleave_ref(&x, 2, 3));
    let (tile, tile_rows) = (tile_ref(&x, &[1, 2, 1]), tile_ref(&x, &[1, 1, 2]));
    macro_rules! cases {
        ($cb:ident, $m:ty, $mesh:expr, $fails:expr; $($l:tt)*) => {{
            $cb!(unary_case [$m, 3, "repeat_interleave(2, 1)", |t: &Dt<_, _, _, 3>| t.repeat_interleave(2, Dim::<1>), |d: &DTensor<f64>| d.repeat_interleave(2, 1), &x, &rep1, $mesh, $fails]; $($l)*);
            $cb!(unary_case [$m, 3, "repeat_interleave(3, 2)", |t: &Dt<_, _, _, 3>| t.repeat_interleave(3, Dim::<2>), |d: &DTensor<f64>| d.repeat_interleave(3, 2), &x, &rep2, $mesh, $fails]; (R, R) (S0, R) (S1, R) (Ps, R));
            $cb!(unary_case [$m, 3, "repeat([1, 2, 1])", |t: &Dt<_, _, _, 3>| t.repeat([1, 2, 1]), |d: &DTensor<f64>| d.repeat(&[1, 2, 1]), &x, &tile, $mesh, $fails]; (R, R) (S0, R) (S2, R) (Ps, R));
            $cb!(unary_case [$m, 3, "repeat([1, 1, 2])", |t: &Dt<_, _, _, 3>| t.repeat([1, 1, 2]), |d: &DTensor<f64>| d.repeat(&[1, 1, 2]), &x, &tile_rows, $mesh, $fails]; (R, R) (S0, R) (S1, R));
        }};
    }
    on_meshes(
        |mesh, fails| {
            let before = implicit_redistribution_count();
            cases!(each1, (tp,), mesh, fails; (R, R) (S0, R) (S1, R) (S2, R) (Ps, R) (Pa, R));
            no_implicit(before, fails);
            Ok(())
        },
        |mesh, fails| {
            let before = implicit_redistribution_count();
            cases!(product2, (dp, tp), mesh, fails; (R, R) (S0, R) (S1, R) (Ps, R));
            no_implicit(before, fails);
            Ok(())
        },
    );
}

#[test]
fn index_and_repeat_sizes_the_types_cannot_see_are_errors_at_the_callers_line() {
    let out = dtensor_runtime::run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        // 3 heads over 2 ranks: repeated in place they would not stay whole per rank.
        let kv: Dt<f64, (tp,), (S1,), 3> = Dt::distribute(&global(&[1, 3, 2], 51, false), &mesh)?;
        // An index of 3 rows against 5: the shards of dim 0 would not line up.
        let x: Dt<f64, (tp,), (S0,), 2> = Dt::distribute(&global(&[5, 4], 52, false), &mesh)?;
        let idx: Dt<f64, (tp,), (S0,), 2> = Dt::distribute(&ids(&[3, 4], 4, 53), &mesh)?;
        let rows: Dt<f64, (tp,), (S0,), 2> = Dt::distribute(&global(&[5, 4], 54, false), &mesh)?;
        let before = implicit_redistribution_count();
        let line = line!() + 1;
        let e1 = kv.repeat_interleave(2, Dim::<1>).err();
        let e2 = x.gather(Dim::<1>, &idx).err();
        let e3 = rows.repeat([2, 1]).err();
        Ok((e1, e2, e3, line, implicit_redistribution_count() - before))
    })
    .unwrap();
    for (e1, e2, e3, line, redistributions) in out {
        assert_eq!(redistributions, 0);
        for (e, l, op) in [(e1, line, "repeat_interleave"), (e2, line + 1, "gather"), (e3, line + 2, "repeat")] {
            match e {
                Some(dtensor_runtime::Error::TypedMismatch { what, actual, .. }) => {
                    assert!(what.contains(&format!("typed `{op}`")), "{what}");
                    assert!(what.contains(&format!("typed_select.rs:{l}")), "{what} at line {l}");
                    assert!(actual.contains("call `.redistribute()`"), "{actual}");
                }
                other => panic!("{op}: expected a TypedMismatch, got {other:?}"),
            }
        }
    }
}
