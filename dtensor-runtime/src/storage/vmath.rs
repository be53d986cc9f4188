//! Branch-free `exp` for f32 and f64, and the element-wise kernels built on it (GELU tanh
//! form and its derivative, SiLU, sigmoid), as plain slice loops LLVM vectorises.
//!
//! libm's `exp`/`tanh` are scalar calls, one per element; this `exp` is straight-line code
//! (range reduction, a polynomial, an exponent built from bits, every edge case a select), so
//! a loop over a slice runs several lanes per instruction. Its error, asserted over a dense
//! sweep by the tests below: ≤ 1 ulp against the correctly rounded `exp` in f32, ≤ 2 ulp in
//! f64 against libm's; `±∞`, NaN, overflow and results in the subnormal range match libm.
//!
//! The tanh GELU uses `½(1 + tanh u) = σ(2u) = 1 / (1 + e^(-2u))`, so it needs `exp` only and
//! has no cancellation where `tanh u → -1`. The CUDA kernels keep `tanhf`/`expf`; the device
//! tests hold both to `1e-6·(1 + |y|)` of each other, and both are within a few ulp of the
//! element type of the f64 reference formulas of [`super::op`] (times `1 + |z|` for `eᶻ`, the
//! conditioning of `exp` itself).

use crate::op::SoftmaxKind;
use num_traits::Float;

/// Element types with the branch-free [`VExp::vexp`].
pub(super) trait VExp: Float {
    /// `eˣ` (error bounds in the module docs).
    fn vexp(self) -> Self;
    /// A constant in this type.
    fn c(v: f64) -> Self;
}

/// Rounds to the nearest integer (ties to even) for `|x| < 2^51`: adding and subtracting
/// `1.5·2^52` leaves the integer part, without a `round` call (SSE2 has no vector round).
const ROUND_F64: f64 = 6_755_399_441_055_744.0;
/// The same for f32 and `|x| < 2^22`.
const ROUND_F32: f32 = 12_582_912.0;

impl VExp for f64 {
    #[inline(always)]
    fn vexp(self) -> f64 {
        // Outside [LO, HI] the result is 0 or ∞; clamping keeps the scale exponent in range,
        // and the comparisons are false for NaN, which the polynomial carries through.
        const HI: f64 = 709.79;
        const LO: f64 = -745.2;
        // ln 2 split so that `n·LN2_HI` is exact for |n| < 2^11 (Cody–Waite).
        const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
        const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
        let x = if self > HI { HI } else { self };
        let x = if x < LO { LO } else { x };
        let n = (x * std::f64::consts::LOG2_E + ROUND_F64) - ROUND_F64;
        let r = (x - n * LN2_HI) - n * LN2_LO;
        // |r| ≤ ln2/2: Taylor to degree 13 leaves < 2^-60 of truncation error.
        let p = 1.0 / 6_227_020_800.0;
        let p = p * r + 1.0 / 479_001_600.0;
        let p = p * r + 1.0 / 39_916_800.0;
        let p = p * r + 1.0 / 3_628_800.0;
        let p = p * r + 1.0 / 362_880.0;
        let p = p * r + 1.0 / 40_320.0;
        let p = p * r + 1.0 / 5_040.0;
        let p = p * r + 1.0 / 720.0;
        let p = p * r + 1.0 / 120.0;
        let p = p * r + 1.0 / 24.0;
        let p = p * r + 1.0 / 6.0;
        let p = p * r + 0.5;
        let e = 1.0 + (r + r * r * p);
        // 2ⁿ as two normal factors (n ∈ [-1075, 1024]), so subnormal results round once.
        let n1 = (n * 0.5 + ROUND_F64) - ROUND_F64;
        let n2 = n - n1;
        let pow2 = |k: f64| f64::from_bits((k + (1023.0 + ROUND_F64)).to_bits() << 52);
        let y = e * pow2(n1) * pow2(n2);
        if self > HI {
            f64::INFINITY
        } else {
            y
        }
    }

    #[inline(always)]
    fn c(v: f64) -> f64 {
        v
    }
}

impl VExp for f32 {
    #[inline(always)]
    fn vexp(self) -> f32 {
        const HI: f32 = 88.75;
        const LO: f32 = -104.0;
        // ln 2 split so that `n·LN2_HI` is exact for |n| < 2^9.
        const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
        const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
        let x = if self > HI { HI } else { self };
        let x = if x < LO { LO } else { x };
        let n = (x * std::f32::consts::LOG2_E + ROUND_F32) - ROUND_F32;
        let r = (x - n * LN2_HI) - n * LN2_LO;
        // |r| ≤ ln2/2: Taylor to degree 7 leaves < 2^-27 of truncation error.
        let p = 1.0 / 5_040.0;
        let p = p * r + 1.0 / 720.0;
        let p = p * r + 1.0 / 120.0;
        let p = p * r + 1.0 / 24.0;
        let p = p * r + 1.0 / 6.0;
        let p = p * r + 0.5;
        let e = 1.0 + (r + r * r * p);
        let n1 = (n * 0.5 + ROUND_F32) - ROUND_F32;
        let n2 = n - n1;
        let pow2 = |k: f32| f32::from_bits((k + (127.0 + ROUND_F32)).to_bits() << 23);
        let y = e * pow2(n1) * pow2(n2);
        if self > HI {
            f32::INFINITY
        } else {
            y
        }
    }

    #[inline(always)]
    fn c(v: f64) -> f32 {
        v as f32
    }
}

/// The element-wise functions computed here rather than through libm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fast {
    /// `eˣ`
    Exp,
    /// [`crate::op::gelu`], as `x·σ(2u)`.
    Gelu,
    /// [`crate::op::gelu_grad`], as `s + 2x·s(1 - s)·C(1 + 3Ax²)` with `s = σ(2u)`.
    GeluGrad,
    /// `x·σ(x)`
    Silu,
    /// `σ(x)(1 + x(1 - σ(x)))`
    SiluGrad,
    /// `σ(x)`
    Sigmoid,
}

/// `dst[i] = op(src[i])`, appended to the empty `dst`; the op is matched once, outside the loop.
pub(super) fn map<F: VExp>(op: Fast, src: &[F], dst: &mut Vec<F>) {
    match op {
        Fast::Exp => map_with(src, dst, |x| x.vexp()),
        Fast::Gelu => map_with(src, dst, |x| x / (F::one() + (-two_u(x)).vexp())),
        Fast::GeluGrad => map_with(src, dst, |x| {
            let s = F::one() / (F::one() + (-two_u(x)).vexp());
            let (c, a3) = (F::c(crate::op::GELU_C), F::c(3.0 * crate::op::GELU_A));
            s + (x + x) * s * (F::one() - s) * c * (F::one() + a3 * x * x)
        }),
        Fast::Silu => map_with(src, dst, |x| x / (F::one() + (-x).vexp())),
        Fast::SiluGrad => map_with(src, dst, |x| {
            let s = F::one() / (F::one() + (-x).vexp());
            s * (F::one() + x * (F::one() - s))
        }),
        Fast::Sigmoid => map_with(src, dst, |x| F::one() / (F::one() + (-x).vexp())),
    }
}

/// Softmax or log-softmax of each row of `n` elements of `src`, appended to the empty `dst`
/// (`n > 0`); the max is taken as the generic kernel does (NaN elements never win it).
pub(super) fn softmax_rows<F: VExp>(src: &[F], n: usize, kind: SoftmaxKind, dst: &mut Vec<F>) {
    map_with(src, dst, |x| x);
    for row in dst.chunks_exact_mut(n) {
        let m = row.iter().fold(F::neg_infinity(), |a, &b| if b > a { b } else { a });
        let mut s = F::zero();
        match kind {
            SoftmaxKind::Softmax => {
                for v in row.iter_mut() {
                    *v = (*v - m).vexp();
                    s = s + *v;
                }
                row.iter_mut().for_each(|v| *v = *v / s);
            }
            SoftmaxKind::LogSoftmax => {
                for &v in row.iter() {
                    s = s + (v - m).vexp();
                }
                let ls = s.ln();
                row.iter_mut().for_each(|v| *v = *v - m - ls);
            }
        }
    }
}

/// `2u = 2·√(2/π)·(x + A·x³)`, the doubled tanh argument of the GELU.
#[inline(always)]
fn two_u<F: VExp>(x: F) -> F {
    let (c2, a) = (F::c(2.0 * crate::op::GELU_C), F::c(crate::op::GELU_A));
    c2 * (x + a * x * x * x)
}

/// Writes `f` of every element of `src` into the spare capacity of the empty `dst`, no
/// zero-fill first.
#[inline(always)]
fn map_with<F: Copy>(src: &[F], dst: &mut Vec<F>, f: impl Fn(F) -> F) {
    dst.clear();
    dst.reserve_exact(src.len());
    for (o, &x) in dst.spare_capacity_mut().iter_mut().zip(src) {
        o.write(f(x));
    }
    // SAFETY: the loop initialised the first `src.len()` elements (capacity ≥ `src.len()`).
    unsafe { dst.set_len(src.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op;

    /// Distance in representable values between two finite f64 of the same sign.
    fn ulps64(a: f64, b: f64) -> u64 {
        if a == b || (a.is_nan() && b.is_nan()) {
            return 0;
        }
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
    }

    fn ulps32(a: f32, b: f32) -> u64 {
        if a == b || (a.is_nan() && b.is_nan()) {
            return 0;
        }
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
    }

    /// Every edge case: infinities, NaN, overflow, underflow to subnormals and to zero.
    #[test]
    fn exp_edges_match_libm() {
        let xs64 = [
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            0.0,
            -0.0,
            709.78,
            709.79,
            709.8,
            1e300,
            -708.0,
            -740.0,
            -745.0,
            -745.2,
            -746.0,
            -1e300,
            f64::MIN_POSITIVE,
            5e-324,
        ];
        for x in xs64 {
            assert!(ulps64(x.vexp(), x.exp()) <= 2, "f64 exp({x}) = {} vs {}", x.vexp(), x.exp());
        }
        let xs32 = [
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.0,
            88.7,
            88.72,
            88.73,
            1e30,
            -87.0,
            -100.0,
            -103.9,
            -104.0,
            -110.0,
            -1e30,
            f32::MIN_POSITIVE,
            1e-45,
        ];
        for x in xs32 {
            let want = (x as f64).exp() as f32;
            assert!(ulps32(x.vexp(), want) <= 1, "f32 exp({x}) = {} vs {want}", x.vexp());
        }
    }

    /// f64: ≤ 2 ulp against libm over 2·10⁶ points spanning the whole finite range of results,
    /// subnormals included.
    #[test]
    fn exp_f64_within_2_ulp() {
        let (lo, hi, n) = (-745.0, 709.7, 2_000_000);
        let mut worst = (0, 0.0);
        for i in 0..=n {
            let x = lo + (hi - lo) * (i as f64 / n as f64);
            let u = ulps64(x.vexp(), x.exp());
            if u > worst.0 {
                worst = (u, x);
            }
        }
        assert!(worst.0 <= 2, "{worst:?}");
    }

    /// f32: ≤ 1 ulp against the correctly rounded result (libm's f64 exp, rounded) at every
    /// f32 in [-104, 88.72] with a step of 2⁻¹² (about 0.8·10⁶ points), and at every f32 in
    /// [-1, 1] with a step of 2⁻²⁰.
    #[test]
    fn exp_f32_within_1_ulp() {
        let mut worst = (0, 0.0f32);
        let mut check = |x: f32| {
            let u = ulps32(x.vexp(), (x as f64).exp() as f32);
            if u > worst.0 {
                worst = (u, x);
            }
        };
        let mut x = -104.0f32;
        while x <= 88.72 {
            check(x);
            x += 1.0 / 4096.0;
        }
        for i in -(1 << 20)..=(1 << 20) {
            check(i as f32 / (1 << 20) as f32);
        }
        assert!(worst.0 <= 1, "{worst:?}");
    }

    /// 4 epsilons of `want` (at least of 0.01, where a derivative crosses zero), scaled by the
    /// exponent's argument: a relative error ε in the argument `z` of `eᶻ` is `|z|·ε` in the
    /// result. Plus `ε·|x|³` absolute: the reference GELU derivative's `1 - tanh²` is 0 once tanh
    /// rounds to ±1, though the true value is not.
    fn tol(eps: f64, x: f64, want: f64) -> f64 {
        let z = x.abs() + 2.0 * op::GELU_C * (x.abs() + op::GELU_A * x.abs().powi(3));
        4.0 * eps * (1.0 + z) * want.abs().max(1e-2) + eps * x.abs().powi(3)
    }

    /// The kernels against the f64 reference formulas of `op`, in f64 and in f32.
    #[test]
    fn kernels_match_the_reference_formulas() {
        use op::{gelu, gelu_grad};
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        type Reference = fn(f64) -> f64;
        let refs: [(Fast, Reference); 6] = [
            (Fast::Exp, f64::exp),
            (Fast::Gelu, gelu),
            (Fast::GeluGrad, gelu_grad),
            (Fast::Silu, |x| x * (1.0 / (1.0 + (-x).exp()))),
            (Fast::SiluGrad, |x| {
                let s = 1.0 / (1.0 + (-x).exp());
                s * (1.0 + x * (1.0 - s))
            }),
            (Fast::Sigmoid, sig),
        ];
        let xs: Vec<f64> = (-40_000..=40_000).map(|i| i as f64 / 2000.0).collect();
        for (op, f) in refs {
            let mut out = Vec::new();
            map(op, &xs, &mut out);
            for (&x, &y) in xs.iter().zip(&out) {
                let want = f(x);
                assert!((y - want).abs() <= tol(f64::EPSILON, x, want), "{op:?}({x}) = {y} vs {want}");
            }
            let xs32: Vec<f32> = xs.iter().map(|&x| x as f32).collect();
            let mut out32 = Vec::new();
            map(op, &xs32, &mut out32);
            for (&x, &y) in xs32.iter().zip(&out32) {
                let want = f(x as f64);
                let err = (y as f64 - want).abs();
                assert!(err <= tol(f32::EPSILON as f64, x as f64, want), "{op:?}({x}) = {y} vs {want}");
            }
        }
        let mut out = Vec::new();
        map(Fast::Gelu, &[f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -1e10], &mut out);
        assert_eq!(out[0], f64::INFINITY);
        assert!(out[1].is_nan() && out[2].is_nan(), "{out:?}");
        assert_eq!(out[3], 0.0);
    }

    /// Rows of a softmax against libm's `exp` in f64, and the empty-free `-∞` row.
    #[test]
    fn softmax_rows_match_libm() {
        let n = 7;
        let xs: Vec<f64> = (0..70).map(|i| ((i * 37) % 23) as f64 * 0.9 - 10.0).collect();
        for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
            let mut out = Vec::new();
            softmax_rows(&xs, n, kind, &mut out);
            for (row, got) in xs.chunks(n).zip(out.chunks(n)) {
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
                for (&v, &g) in row.iter().zip(got) {
                    let want = match kind {
                        SoftmaxKind::Softmax => (v - m).exp() / s,
                        SoftmaxKind::LogSoftmax => v - m - s.ln(),
                    };
                    assert!((g - want).abs() <= 8.0 * f64::EPSILON * want.abs().max(1.0), "{kind:?} {g} vs {want}");
                }
            }
        }
        let mut out = Vec::new();
        softmax_rows(&[f32::NEG_INFINITY, 0.0], 2, SoftmaxKind::Softmax, &mut out);
        assert_eq!(out, [0.0, 1.0]);
    }
}
