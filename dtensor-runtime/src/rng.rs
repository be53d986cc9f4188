//! Counter-based random numbers: the value of global element `i` depends only on
//! `(seed, call offset, i)`, never on the mesh or placements, so a sharded `rand` is
//! bit-identical to the single-rank one.
//!
//! Element `i` uses Philox4x32-10 block `offset + i / 4`, word `i % 4`; `randn` turns the
//! words (0, 1) and (2, 3) of a block into two normals each by Box–Muller.

use crate::element::Element;
use rand_philox::{philox4x32_10, splitmix64, u32_to_unit_f64};
use std::cell::Cell;

/// Seed used when `manual_seed` was never called on this rank.
pub const DEFAULT_SEED: u64 = 67_280_421_310_721;

thread_local! {
    static STATE: Cell<(u64, u64)> = const { Cell::new((DEFAULT_SEED, 0)) };
}

/// Seeds this rank's generator (call it with the same seed on every rank).
pub fn manual_seed(seed: u64) {
    STATE.with(|s| s.set((seed, 0)));
}

/// Current (seed, counter offset in blocks) of this rank's generator.
pub fn rng_state() -> (u64, u64) {
    STATE.with(|s| s.get())
}

/// Restores a state returned by [`rng_state`].
pub fn set_rng_state(state: (u64, u64)) {
    STATE.with(|s| s.set(state));
}

/// Reserves the counter blocks of a tensor of `numel` elements and returns its (seed,
/// first counter block). Every rank advances by the *global* size, so later calls stay in step.
pub(crate) fn reserve(numel: usize) -> (u64, u64) {
    STATE.with(|s| {
        let (seed, offset) = s.get();
        s.set((seed, offset + (numel as u64).div_ceil(4)));
        (seed, offset)
    })
}

/// Random words of one rand/randn call, addressed by global element index.
#[derive(Clone, Debug)]
pub struct Stream {
    key: [u32; 2],
    offset: u64,
    cached: Option<(u64, [u32; 4])>,
}

impl Stream {
    /// The stream of `seed` starting at counter block `offset`.
    pub fn new(seed: u64, offset: u64) -> Self {
        let k = splitmix64(seed);
        Stream { key: [k as u32, (k >> 32) as u32], offset, cached: None }
    }

    fn block(&mut self, b: u64) -> [u32; 4] {
        if let Some((cb, words)) = self.cached {
            if cb == b {
                return words;
            }
        }
        let c = self.offset + b;
        let words = philox4x32_10([c as u32, (c >> 32) as u32, 0, 0], self.key);
        self.cached = Some((b, words));
        words
    }

    /// Uniform in (0, 1) for global element `i`.
    pub fn uniform<T: Element>(&mut self, i: usize) -> T {
        let w = self.block(i as u64 / 4)[i % 4];
        T::of_f64(u32_to_unit_f64(w))
    }

    /// Standard normal for global element `i`.
    pub fn normal<T: Element>(&mut self, i: usize) -> T {
        let words = self.block(i as u64 / 4);
        T::of_f64(normal_of_block(&words, i % 4))
    }
}

/// Element `lane` of the Philox block `words` as a standard normal: Box–Muller on the word
/// pair of the lane, with [`ln`] and [`sincos_turn`] instead of the math library, so the CUDA
/// kernel (the same steps in C, `crate::cuda::source::RNG_SOURCE`) gives the same bits.
pub(crate) fn normal_of_block(words: &[u32; 4], lane: usize) -> f64 {
    let pair = lane & !1;
    let u1 = u32_to_unit_f64(words[pair]);
    let u2 = u32_to_unit_f64(words[pair + 1]);
    let r = (-2.0 * ln(u1)).sqrt();
    let (sin, cos) = sincos_turn(u2);
    if lane.is_multiple_of(2) {
        r * cos
    } else {
        r * sin
    }
}

/// Number of terms of the `ln` series of the generator (and of the CUDA kernels' copy, `crate::cuda::source::RNG_SOURCE`).
pub const LOG_TERMS: i32 = 12;
/// Number of terms of the sine and cosine series of the generator (and of the CUDA copy).
pub const TRIG_TERMS: i32 = 11;

/// `ln 2` rounded so that `e·LN2_HI` is exact for any exponent (fdlibm's `ln2_hi`).
pub const LN2_HI: f64 = 6.931_471_803_691_238e-1;
/// `ln 2 - LN2_HI` (fdlibm's `ln2_lo`).
pub const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;

/// `x = m·2^e` with `m` in [0.5, 1), for positive normal `x` (C's `frexp`).
fn frexp(x: f64) -> (f64, i32) {
    let bits = x.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i32 - 1022;
    (f64::from_bits((bits & !(0x7ff << 52)) | (1022 << 52)), e)
}

/// `ln x` for `x` in (0, 1) from correctly rounded operations only: `x = m·2^e` with `m` in
/// [√½, √2), `ln m = 2 atanh s` with `s = (m-1)/(m+1)`, summed as `2s(1 + z/3 + z²/5 + …)`.
pub(crate) fn ln(x: f64) -> f64 {
    let (mut m, mut e) = frexp(x);
    if m < std::f64::consts::FRAC_1_SQRT_2 {
        m *= 2.0;
        e -= 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let z = s * s;
    let mut p = 2.0 / (2.0 * LOG_TERMS as f64 - 1.0);
    for k in (0..LOG_TERMS - 1).rev() {
        p = p * z + 2.0 / (2.0 * k as f64 + 1.0);
    }
    e as f64 * LN2_HI + (e as f64 * LN2_LO + s * p)
}

/// `(sin 2πt, cos 2πt)` for `t` in [0, 1): the nearest quarter turn `q` is exact, the rest
/// `a = (4t - q)·π/2` lies in [-π/4, π/4] where the Taylor series converge to double precision.
pub(crate) fn sincos_turn(t: f64) -> (f64, f64) {
    let r = t * 4.0;
    let q = (r + 0.5).floor();
    let a = (r - q) * std::f64::consts::FRAC_PI_2;
    let z = a * a;
    let n = TRIG_TERMS as usize;
    let (mut sc, mut cc) = (vec![0.0; n], vec![0.0; n]);
    let (mut fs, mut fc) = (1.0f64, 1.0f64);
    for k in 0..n {
        sc[k] = fs;
        cc[k] = fc;
        let kf = k as f64;
        fs = -fs / ((2.0 * kf + 2.0) * (2.0 * kf + 3.0));
        fc = -fc / ((2.0 * kf + 1.0) * (2.0 * kf + 2.0));
    }
    let (mut ps, mut pc) = (sc[n - 1], cc[n - 1]);
    for k in (0..n - 1).rev() {
        ps = ps * z + sc[k];
        pc = pc * z + cc[k];
    }
    let (s, c) = (a * ps, pc);
    match (q as i64) & 3 {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portable_math_is_accurate() {
        let mut worst = (0.0f64, 0.0f64);
        for k in 0..20_000u32 {
            let w = k.wrapping_mul(2_654_435_761);
            let u = u32_to_unit_f64(w);
            let l = ln(u);
            worst.0 = worst.0.max((l - u.ln()).abs() / u.ln().abs());
            let (s, c) = sincos_turn(u);
            let th = 2.0 * std::f64::consts::PI * u;
            worst.1 = worst.1.max((s - th.sin()).abs().max((c - th.cos()).abs()));
        }
        assert!(worst.0 < 4e-16, "ln relative error {}", worst.0);
        // The reference angle 2πu itself is rounded (half an ulp of 2π is 4.4e-16).
        assert!(worst.1 < 1.5e-15, "sin/cos absolute error {}", worst.1);
        assert_eq!(sincos_turn(0.25), (1.0, 0.0));
    }
}
