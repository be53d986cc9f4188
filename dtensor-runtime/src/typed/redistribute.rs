//! Typed `redistribute`: which targets a layout may be redistributed to, per mesh dim,
//! generated from the runtime's own legality table ([`transition_error`]), so the typed layer
//! and the planner cannot disagree. An illegal target (`Shard` → `Partial`, `Partial<Sum>` →
//! `Partial<Avg>`) is a trait-bound error that `cargo check` reports at the call.

use super::lift::lift_binary;
use super::markers::{Avg, Max, Min, Partial, Product, Replicate, Shard, Sum};
use crate::placement::{transition_error, Placement, ReduceOp};

/// The verdict of [`transition_error`] for one pair of marker kinds, as a type.
#[doc(hidden)]
pub enum Verdict<const LEGAL: bool> {}

/// Holds for legal transitions only (implemented for `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "cannot redistribute `{From}` to `{To}` on mesh dim `{Name}`",
    label = "`{From}` → `{To}` is not a legal redistribution on mesh dim `{Name}`",
    note = "`Shard` → `Partial` exists only for `Partial<Sum>` (zero-filled shards) and `Partial<A>` → `Partial<B>` has no meaning; redistribute that mesh dim to `Replicate` (or keep it) instead"
)]
pub trait LegalTransition<From, To, Name> {}
impl<From, To, Name> LegalTransition<From, To, Name> for Verdict<true> {}

/// `transition_error(from, to).is_none()` (usable in a const generic argument).
#[doc(hidden)]
pub const fn legal(from: Placement, to: Placement) -> bool {
    transition_error(from, to).is_none()
}

/// The redistribute rule on one mesh dim: `Self` may become `To`.
#[doc(hidden)]
pub trait RedistributeRule<To, Name> {
    /// Always `To`.
    type Out: super::PlacementMarker;
}

lift_binary!(
    /// The redistribute rule on every mesh dim of a layout.
    #[doc(hidden)]
    RedistributeLayout,
    RedistributeRule
);

/// One impl per (from kind, to kind) pair; a `Shard` stands for every shard dim (legality
/// never depends on it).
macro_rules! transitions {
    (@impl [$($fg:tt)*] [$($tg:tt)*] $from:ty, $fp:expr; $to:ty, $tp:expr) => {
        impl<N, $($fg)* $($tg)*> RedistributeRule<$to, N> for $from
        where
            Verdict<{ legal($fp, $tp) }>: LegalTransition<$from, $to, N>,
        {
            type Out = $to;
        }
    };
    (@to $fg:tt $from:ty, $fp:expr;) => {};
    (@to $fg:tt $from:ty, $fp:expr; $tg:tt $to:ty, $tp:expr; $($rest:tt)*) => {
        transitions!(@impl $fg $tg $from, $fp; $to, $tp);
        transitions!(@to $fg $from, $fp; $($rest)*);
    };
    ($($fg:tt $from:ty, $fp:expr;)*) => {$(
        transitions!(@to $fg $from, $fp;
            [const E: usize,] Shard<E>, Placement::Shard(0);
            [] Replicate, Placement::Replicate;
            [] Partial<Sum>, Placement::Partial(ReduceOp::Sum);
            [] Partial<Avg>, Placement::Partial(ReduceOp::Avg);
            [] Partial<Min>, Placement::Partial(ReduceOp::Min);
            [] Partial<Max>, Placement::Partial(ReduceOp::Max);
            [] Partial<Product>, Placement::Partial(ReduceOp::Product);
        );
    )*};
}

transitions!(
    [const D: usize,] Shard<D>, Placement::Shard(0);
    [] Replicate, Placement::Replicate;
    [] Partial<Sum>, Placement::Partial(ReduceOp::Sum);
    [] Partial<Avg>, Placement::Partial(ReduceOp::Avg);
    [] Partial<Min>, Placement::Partial(ReduceOp::Min);
    [] Partial<Max>, Placement::Partial(ReduceOp::Max);
    [] Partial<Product>, Placement::Partial(ReduceOp::Product);
);

/// Two markers that may share a layout: anything but two `Partial`s of different reduce ops
/// (such a value has no meaning for the runtime, whose ops never produce one).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "a layout mixes `{Self}` and `{Other}`: two different Partial reduce ops",
    label = "layout with `{Self}` and `{Other}` on two mesh dims",
    note = "a value cannot be partial under two reduce ops at once; redistribute one of those mesh dims to `Replicate` first"
)]
pub trait Compatible<Other> {}
impl<Other> Compatible<Other> for Replicate {}
impl<Other, const D: usize> Compatible<Other> for Shard<D> {}
impl<Op: super::ReduceMarker> Compatible<Replicate> for Partial<Op> {}
impl<Op: super::ReduceMarker, const D: usize> Compatible<Shard<D>> for Partial<Op> {}
impl<Op: super::ReduceMarker> Compatible<Partial<Op>> for Partial<Op> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typed::dims::{dp, tp};
    use crate::typed::TypedLayout;

    #[allow(clippy::extra_unused_type_parameters)] // the bound is what is tested
    fn can<L: RedistributeLayout<L2, (dp, tp)>, L2: TypedLayout<(dp, tp)>>() -> bool {
        true
    }

    #[test]
    fn legal_targets_compile() {
        assert!(can::<(Shard<0>, Partial<Sum>), (Replicate, Replicate)>());
        assert!(can::<(Replicate, Replicate), (Partial<Avg>, Shard<1>)>());
        assert!(can::<(Partial<Max>, Shard<1>), (Partial<Max>, Shard<0>)>());
        // The table the typed rule is generated from.
        assert!(legal(Placement::Shard(3), Placement::PARTIAL_SUM)); // PyTorch 2.15: zero fill
        assert!(!legal(Placement::Shard(3), Placement::Partial(ReduceOp::Avg)));
        assert!(can::<(Shard<0>, Shard<1>), (Partial<Sum>, Shard<1>)>());
        assert!(!legal(Placement::PARTIAL_SUM, Placement::Partial(ReduceOp::Avg)));
        assert!(legal(Placement::PARTIAL_SUM, Placement::Shard(1)));
    }
}
