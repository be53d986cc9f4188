//! The typed masking rules (`eq_mask` … `ge_mask`, `where_`, `masked_fill`, `tril`/`triu`)
//! against the dynamic ops and the single-device reference, on a 2-rank and a 2×2 mesh: same
//! placements, same values. Uneven shapes (5, 3) and a `[1, 3]` tensor sharded on its
//! size-1 dim (one rank holds an empty shard) exercise torch.chunk sharding. Sizes the types
//! cannot see are errors at the caller's line, before any communication.

#[macro_use]
mod typed_util;

use dtensor_runtime::ndarray::{ArrayD, Zip};
use dtensor_runtime::typed::dims::{dp, tp};
use dtensor_runtime::typed::Dt;
use dtensor_runtime::{run, CommDebugMode, DTensor, Error};
use typed_util::*;

/// 1.0 where `f(a, b)`, else 0.0.
fn compare_ref(a: &ArrayD<f64>, b: &ArrayD<f64>, f: fn(&f64, &f64) -> bool) -> ArrayD<f64> {
    Zip::from(a).and(b).map_collect(|x, y| f(x, y) as u8 as f64)
}

/// A 0/1 mask of `shape`.
fn mask(shape: &[usize], seed: usize) -> ArrayD<f64> {
    global(shape, seed, false).mapv(|v| (v > 0.0) as u8 as f64)
}

/// `value` where the broadcast `m` is non-zero, else `x`.
fn fill_ref(x: &ArrayD<f64>, m: &ArrayD<f64>, value: f64) -> ArrayD<f64> {
    let m = m.broadcast(x.shape()).unwrap();
    Zip::from(x).and(&m).map_collect(|&v, &k| if k != 0.0 { value } else { v })
}

/// `tril` (lower) or `triu` of the last two dims.
fn tri_ref(x: &ArrayD<f64>, lower: bool, diagonal: i64) -> ArrayD<f64> {
    let nd = x.ndim();
    let mut y = x.clone();
    for (ix, v) in y.indexed_iter_mut() {
        let (i, j) = (ix[nd - 2] as i64, ix[nd - 1] as i64);
        if (lower && j - i > diagonal) || (!lower && j - i < diagonal) {
            *v = 0.0;
        }
    }
    y
}

#[test]
fn comparison_rules_match_dynamic() {
    // `b` equals `a` where a third tensor is positive, so every comparison sees both answers.
    let half_equal = |a: &ArrayD<f64>, seed| {
        Zip::from(a).and(&global(a.shape(), seed, false)).map_collect(|&x, &c| if c > 0.0 { x } else { c })
    };
    let (a, a1) = (global(&[5, 3], 1, false), global(&[1, 3], 1, false));
    let (b, b1) = (half_equal(&a, 3), half_equal(&a1, 2));
    let (eq, lt, ge) = (compare_ref(&a, &b, f64::eq), compare_ref(&a, &b, f64::lt), compare_ref(&a, &b, f64::ge));
    let (ne, le, gt) = (compare_ref(&a, &b, f64::ne), compare_ref(&a, &b, f64::le), compare_ref(&a, &b, f64::gt));
    let lt1 = compare_ref(&a1, &b1, f64::lt);
    assert!(eq.sum() > 0.0 && ne.sum() > 0.0, "the inputs must have equal and unequal elements");
    macro_rules! all {
        ($cb:ident, $m:ty, $mesh:expr, $fails:expr; $($l:tt)*) => {
            $cb!(binary_case [$m, 2, 2, eq_mask, &a, &b, &eq, $mesh, $fails]; $($l)*);
            $cb!(binary_case [$m, 2, 2, ne_mask, &a, &b, &ne, $mesh, $fails]; $($l)*);
            $cb!(binary_case [$m, 2, 2, lt_mask, &a, &b, &lt, $mesh, $fails]; $($l)*);
            $cb!(binary_case [$m, 2, 2, le_mask, &a, &b, &le, $mesh, $fails]; $($l)*);
            $cb!(binary_case [$m, 2, 2, gt_mask, &a, &b, &gt, $mesh, $fails]; $($l)*);
            $cb!(binary_case [$m, 2, 2, ge_mask, &a, &b, &ge, $mesh, $fails]; $($l)*);
            $cb!(binary_case [$m, 2, 2, lt_mask, &a1, &b1, &lt1, $mesh, $fails]; $($l)*);
        };
    }
    on_meshes(
        |mesh, fails| {
            all!(each1, (tp,), mesh, fails; (R, R) (S0, S0) (S1, S1));
            Ok(())
        },
        |mesh, fails| {
            all!(product2, (dp, tp), mesh, fails; (R, R) (S0, S0) (S1, S1));
            Ok(())
        },
    );
}

/// One masking case: data layout `$la`, mask layout `$lm`; `where_` takes `other` with the
/// data's layout.
macro_rules! mask_case {
    ([$m:ty, $rm:literal, $x:expr, $o:expr, $mk:expr, $fill:expr, $sel:expr, $mesh:expr, $fails:expr]; $la:ty, $lm:ty) => {{
        let x = input::<$m, $la, 2>($x, $mesh)?;
        let o = input::<$m, $la, 2>($o, $mesh)?;
        let k = input::<$m, $lm, $rm>($mk, $mesh)?;
        let case = format!("masked_fill {} with mask {} {:?}", stringify!($la), stringify!($lm), $mk.shape());
        check(&case, x.masked_fill(&k, 7.5), x.as_dtensor().masked_fill(k.as_dtensor(), 7.5), $fill, $fails)?;
        let case = format!("where_ {} with condition {} {:?}", stringify!($la), stringify!($lm), $mk.shape());
        check(&case, x.where_(&k, &o), x.as_dtensor().where_(k.as_dtensor(), o.as_dtensor()), $sel, $fails)?;
    }};
}

#[test]
fn masking_rules_match_dynamic() {
    let (x, o) = (global(&[5, 3], 4, false), global(&[5, 3], 5, false));
    let (x1, o1) = (global(&[1, 3], 4, false), global(&[1, 3], 5, false));
    // A same-shape mask, a row mask [1, 3] (broadcast over rows), a column mask [5, 1] and a
    // rank-1 mask [3].
    let (full, row, col, vec) = (mask(&[5, 3], 6), mask(&[1, 3], 7), mask(&[5, 1], 8), mask(&[3], 9));
    let full1 = mask(&[1, 3], 10);
    let sel = |m: &ArrayD<f64>, x: &ArrayD<f64>, o: &ArrayD<f64>| {
        let m = m.broadcast(x.shape()).unwrap().to_owned();
        Zip::from(x).and(o).and(&m).map_collect(|&a, &b, &k| if k != 0.0 { a } else { b })
    };
    let exp = |m: &ArrayD<f64>| (fill_ref(&x, m, 7.5), sel(m, &x, &o));
    let ((ff, sf), (fr, sr), (fc, sc), (fv, sv)) = (exp(&full), exp(&row), exp(&col), exp(&vec));
    let (ff1, sf1) = (fill_ref(&x1, &full1, 7.5), sel(&full1, &x1, &o1));
    on_meshes(
        |mesh, fails| {
            each1!(mask_case [(tp,), 2, &x, &o, &full, &ff, &sf, mesh, fails]; (R, R) (S0, S0) (S1, S1));
            each1!(mask_case [(tp,), 2, &x, &o, &row, &fr, &sr, mesh, fails]; (R, R) (S0, R));
            each1!(mask_case [(tp,), 2, &x, &o, &col, &fc, &sc, mesh, fails]; (R, R) (S1, R));
            each1!(mask_case [(tp,), 1, &x, &o, &vec, &fv, &sv, mesh, fails]; (R, R) (S0, R));
            each1!(mask_case [(tp,), 2, &x1, &o1, &full1, &ff1, &sf1, mesh, fails]; (S0, S0) (S0, R) (S1, S1));
            Ok(())
        },
        |mesh, fails| {
            product2!(mask_case [(dp, tp), 2, &x, &o, &full, &ff, &sf, mesh, fails]; (R, R) (S0, S0) (S1, S1));
            product2!(mask_case [(dp, tp), 1, &x, &o, &vec, &fv, &sv, mesh, fails]; (R, R) (S0, R));
            product2!(mask_case [(dp, tp), 2, &x1, &o1, &full1, &ff1, &sf1, mesh, fails]; (S0, S0) (S1, S1));
            Ok(())
        },
    );
}

#[test]
fn tril_triu_rules_match_dynamic() {
    let (x, x3) = (global(&[5, 4], 11, false), global(&[3, 5, 4], 12, false));
    macro_rules! all {
        ($cb:ident, $m:ty, $mesh:expr, $fails:expr; $($l:tt)*) => {
            for diagonal in [-1, 0, 2] {
                let (lo, up) = (tri_ref(&x, true, diagonal), tri_ref(&x, false, diagonal));
                let (lo3, up3) = (tri_ref(&x3, true, diagonal), tri_ref(&x3, false, diagonal));
                $cb!(unary_case [$m, 2, "tril", |t: &Dt<_, _, _, 2>| t.tril(diagonal), |d: &DTensor<f64>| d.tril(diagonal), &x, &lo, $mesh, $fails]; $($l)*);
                $cb!(unary_case [$m, 2, "triu", |t: &Dt<_, _, _, 2>| t.triu(diagonal), |d: &DTensor<f64>| d.triu(diagonal), &x, &up, $mesh, $fails]; $($l)*);
                $cb!(unary_case [$m, 3, "tril [3, 5, 4]", |t: &Dt<_, _, _, 3>| t.tril(diagonal), |d: &DTensor<f64>| d.tril(diagonal), &x3, &lo3, $mesh, $fails]; $($l)* (S2, R));
                $cb!(unary_case [$m, 3, "triu [3, 5, 4]", |t: &Dt<_, _, _, 3>| t.triu(diagonal), |d: &DTensor<f64>| d.triu(diagonal), &x3, &up3, $mesh, $fails]; $($l)* (S2, R));
            }
        };
    }
    on_meshes(
        |mesh, fails| {
            all!(each1, (tp,), mesh, fails; (R, R) (S0, R) (S1, R) (Ps, R) (Pa, R));
            Ok(())
        },
        |mesh, fails| {
            all!(product2, (dp, tp), mesh, fails; (R, R) (S0, R) (S1, R) (Ps, R));
            Ok(())
        },
    );
}

#[test]
fn masking_sizes_the_types_cannot_see_are_errors_at_the_callers_line() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let x: Dt<f64, (tp,), (S0,), 2> = Dt::distribute(&global(&[4, 3], 1, false), &mesh)?;
        let other: Dt<f64, (tp,), (S0,), 2> = Dt::distribute(&global(&[2, 3], 2, false), &mesh)?;
        // A full-size replicated mask where the data is sharded: the runtime would slice it.
        let full: Dt<f64, (tp,), (R,), 2> = Dt::distribute(&mask(&[4, 3], 3), &mesh)?;
        // A sharded mask of another shape.
        let small: Dt<f64, (tp,), (S0,), 2> = Dt::distribute(&mask(&[2, 3], 4), &mesh)?;
        let comm = CommDebugMode::new();
        let guard = comm.enter();
        let mut errs = vec![];
        let line = line!() + 1;
        errs.push((x.masked_fill(&full, 0.0).unwrap_err(), line));
        let line = line!() + 1;
        errs.push((x.where_(&small, &x).unwrap_err(), line));
        let line = line!() + 1;
        errs.push((x.where_(&full.redistribute::<(S0,)>()?, &other).unwrap_err(), line));
        let line = line!() + 1;
        errs.push((x.lt_mask(&other).unwrap_err(), line));
        drop(guard);
        let issued = comm.get_total_counts();
        Ok((
            errs.into_iter()
                .map(|(e, l)| (e.to_string(), matches!(e, Error::TypedMismatch { .. }), l))
                .collect::<Vec<_>>(),
            issued,
        ))
    })
    .unwrap();
    for (errs, issued) in out {
        // (the one redistribute in the list is R → S: a local slice, no collective)
        assert_eq!(issued, 0, "no collective before the errors");
        for (e, typed, line) in errs {
            assert!(typed && e.contains(&format!("typed_mask.rs:{line}")), "{e}");
        }
    }
}
