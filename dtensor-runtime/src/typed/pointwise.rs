//! Typed element-wise `add`, `sub`, `mul`, `div` of two tensors of the same rank (the rule of `ops::pointwise`):
//! both sides on the same `Shard<D>` or `Replicate` → the same; `Partial<Sum>` and
//! `Partial<Avg>` are linear, so `P±P`, `P±R`, `R±P`, `P*R`, `R*P`, `P/R` → the same Partial.
//! Anything else (e.g. `P*P`, `R/P`, `S+R`) needs a redistribute first.

use super::lift::{lift_binary, never_binary};
use super::markers::{Avg, Partial, Replicate, Shard, Sum};
use super::{Dt, MeshDims, TypedLayout};
use crate::element::{Element, Scalar};
use crate::error::Result;

/// Declares one pointwise rule trait with its message.
macro_rules! pointwise_rule {
    ($(#[$doc:meta])* $Rule:ident, $TypedLayout:ident, $msg:literal, $label:literal) => {
        $(#[$doc])*
        #[doc(hidden)] // its impls would fill every marker's page; the layout trait is the bound users meet
        #[diagnostic::on_unimplemented(
            message = $msg,
            label = $label,
            note = "pointwise ops need the same `Shard<D>` or `Replicate` on both sides; `Partial<Sum>`/`Partial<Avg>` only combine linearly (P±P, P±R, R±P, P*R, R*P, P/R)"
        )]
        pub trait $Rule<Rhs, Name> {
            /// Placement of the result on this mesh dim.
            type Out: $crate::typed::PlacementMarker;
        }
        lift_binary!(
            /// The rule on every mesh dim of a layout.
            $TypedLayout,
            $Rule
        );
        never_binary!($Rule);
        impl<N> $Rule<Replicate, N> for Replicate {
            type Out = Replicate;
        }
        impl<N, const D: usize> $Rule<Shard<D>, N> for Shard<D> {
            type Out = Shard<D>;
        }
    };
}

pointwise_rule!(
    /// The `add` rule on one mesh dim.
    AddRule,
    AddLayout,
    "add of `{Self}` + `{Rhs}` on mesh dim `{Name}` is not a legal layout: redistribute one side first",
    "no `add` sharding rule for `{Self}` + `{Rhs}` on mesh dim `{Name}`"
);
pointwise_rule!(
    /// The `sub` rule on one mesh dim.
    SubRule,
    SubLayout,
    "sub of `{Self}` - `{Rhs}` on mesh dim `{Name}` is not a legal layout: redistribute one side first",
    "no `sub` sharding rule for `{Self}` - `{Rhs}` on mesh dim `{Name}`"
);
pointwise_rule!(
    /// The `mul` rule on one mesh dim.
    MulRule,
    MulLayout,
    "mul of `{Self}` * `{Rhs}` on mesh dim `{Name}` is not a legal layout: redistribute one side first",
    "no `mul` sharding rule for `{Self}` * `{Rhs}` on mesh dim `{Name}`"
);
pointwise_rule!(
    /// The `div` rule on one mesh dim.
    DivRule,
    DivLayout,
    "div of `{Self}` / `{Rhs}` on mesh dim `{Name}` is not a legal layout: redistribute one side first",
    "no `div` sharding rule for `{Self}` / `{Rhs}` on mesh dim `{Name}`"
);

/// Sums and averages are linear: `P ± P`, `P ± R`, `R ± P`, `P * R`, `R * P` and `P / R` stay
/// partial with the same op (a Replicate operand of `±` becomes partial locally, no comm).
macro_rules! linear_partial {
    ($($Op:ident),+) => {$(
        impl<N> AddRule<Partial<$Op>, N> for Partial<$Op> {
            type Out = Partial<$Op>;
        }
        impl<N> SubRule<Partial<$Op>, N> for Partial<$Op> {
            type Out = Partial<$Op>;
        }
        impl<N> AddRule<Replicate, N> for Partial<$Op> {
            type Out = Partial<$Op>;
        }
        impl<N> AddRule<Partial<$Op>, N> for Replicate {
            type Out = Partial<$Op>;
        }
        impl<N> SubRule<Replicate, N> for Partial<$Op> {
            type Out = Partial<$Op>;
        }
        impl<N> SubRule<Partial<$Op>, N> for Replicate {
            type Out = Partial<$Op>;
        }
        impl<N> MulRule<Replicate, N> for Partial<$Op> {
            type Out = Partial<$Op>;
        }
        impl<N> MulRule<Partial<$Op>, N> for Replicate {
            type Out = Partial<$Op>;
        }
        impl<N> DivRule<Replicate, N> for Partial<$Op> {
            type Out = Partial<$Op>;
        }
    )+};
}
linear_partial!(Sum, Avg);

/// Typed binary methods: each wraps the dynamic op of the same name.
macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident: $TypedLayout:ident;)+) => {
        impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {$(
            $(#[$doc])*
            #[track_caller]
            pub fn $name<L2>(&self, rhs: &Dt<T, M, L2, R>) -> Result<Dt<T, M, <L as $TypedLayout<L2, M>>::Out, R>>
            where
                T: Element,
                L: $TypedLayout<L2, M>,
                L2: TypedLayout<M>,
            {
                Dt::from_op(stringify!($name), || self.as_dtensor().$name(rhs.as_dtensor()))
            }
        )+}
    };
}

binary_methods! {
    /// Element-wise `self + rhs` (same rank); see [`AddRule`].
    add: AddLayout;
    /// Element-wise `self - rhs` (same rank); see [`SubRule`].
    sub: SubLayout;
    /// Element-wise `self * rhs` (same rank); see [`MulRule`].
    mul: MulLayout;
    /// Element-wise `self / rhs` (same rank); see [`DivRule`].
    div: DivLayout;
}
