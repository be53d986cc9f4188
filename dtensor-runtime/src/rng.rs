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
        let lane = i % 4;
        let pair = lane & !1;
        let u1 = u32_to_unit_f64(words[pair]);
        let u2 = u32_to_unit_f64(words[pair + 1]);
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u2;
        T::of_f64(if lane.is_multiple_of(2) { r * theta.cos() } else { r * theta.sin() })
    }
}
