//! Placement marker types: the type-level twin of [`Placement`].
//!
//! Markers are uninhabited types (enums, and `Partial`, a struct holding a [`Never`]): they
//! only ever appear as type arguments, and being absent
//! from the value namespace lets `Shard<0>` (a type) live next to `Shard(0)` (a function).

use crate::placement::{Placement, ReduceOp};
use std::marker::PhantomData;

/// Sealed: only the markers of this module are placements.
mod sealed {
    pub trait Sealed {}
}

/// A placement marker type (`Shard<D>`, `Replicate`, `Partial<Op>`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a placement marker",
    label = "expected `Shard<D>`, `Replicate` or `Partial<Sum|Avg|Min|Max|Product>`"
)]
pub trait PlacementMarker: sealed::Sealed + 'static {
    /// The dynamic placement this marker stands for.
    const PLACEMENT: Placement;
    /// `D + 1` for `Shard<D>`, 0 otherwise: the smallest tensor rank the marker fits.
    const MIN_RANK: usize;
    /// `Some(op)` for `Partial<Op>` (layouts may not mix two different ops).
    const PARTIAL: Option<ReduceOp>;
}

/// Split along tensor dim `D` (torch.chunk semantics) on one mesh dim.
pub enum Shard<const D: usize> {}

/// Every rank of the mesh dim holds the full data.
pub enum Replicate {}

/// Every rank holds a partial value; the logical value is their reduction by `Op`.
///
/// `Op` is one of [`Sum`], [`Avg`], [`Min`], [`Max`], [`Product`].
//
// Named fields, so that rustfmt keeps them off the first line: rustc quotes that line when a
// bound on `Op` fails, and the user should see the bound, not the uninhabited field.
pub struct Partial<Op: ReduceMarker> {
    _op: PhantomData<Op>,
    _uninhabited: Never,
}

/// A reduce-op marker for [`Partial`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a reduce op of `Partial`",
    label = "expected one of `Sum`, `Avg`, `Min`, `Max`, `Product`"
)]
pub trait ReduceMarker: sealed::Sealed + 'static {
    /// The dynamic reduce op.
    const OP: ReduceOp;
}

/// An uninhabited type that no user can name in a layout. Rule traits get one hidden impl
/// for it per marker, so that no marker has a single impl (rustc would otherwise infer the
/// other operand from that impl and report a bare "mismatched types" instead of the rule's
/// message).
#[doc(hidden)]
pub enum Never {}

macro_rules! reduce_markers {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {$(
        $(#[$doc])*
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl ReduceMarker for $name {
            const OP: ReduceOp = ReduceOp::$op;
        }
    )*};
}

reduce_markers! {
    /// `Partial<Sum>`: the logical value is the sum over the mesh dim.
    Sum => Sum,
    /// `Partial<Avg>`: the logical value is the mean over the mesh dim.
    Avg => Avg,
    /// `Partial<Min>`: the logical value is the minimum over the mesh dim.
    Min => Min,
    /// `Partial<Max>`: the logical value is the maximum over the mesh dim.
    Max => Max,
    /// `Partial<Product>`: the logical value is the product over the mesh dim.
    Product => Product,
}

impl<const D: usize> sealed::Sealed for Shard<D> {}
impl<const D: usize> PlacementMarker for Shard<D> {
    const PLACEMENT: Placement = Placement::Shard(D as isize);
    const MIN_RANK: usize = D + 1;
    const PARTIAL: Option<ReduceOp> = None;
}

impl sealed::Sealed for Replicate {}
impl PlacementMarker for Replicate {
    const PLACEMENT: Placement = Placement::Replicate;
    const MIN_RANK: usize = 0;
    const PARTIAL: Option<ReduceOp> = None;
}

impl<Op: ReduceMarker> sealed::Sealed for Partial<Op> {}
impl<Op: ReduceMarker> PlacementMarker for Partial<Op> {
    const PLACEMENT: Placement = Placement::Partial(Op::OP);
    const MIN_RANK: usize = 0;
    const PARTIAL: Option<ReduceOp> = Some(Op::OP);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_map_to_their_placements() {
        assert_eq!(<Shard<3> as PlacementMarker>::PLACEMENT, Placement::Shard(3));
        assert_eq!(<Shard<3> as PlacementMarker>::MIN_RANK, 4);
        assert_eq!(<Replicate as PlacementMarker>::PLACEMENT, Placement::Replicate);
        assert_eq!(<Partial<Sum> as PlacementMarker>::PLACEMENT, Placement::Partial(ReduceOp::Sum));
        assert_eq!(<Partial<Avg> as PlacementMarker>::PLACEMENT, Placement::Partial(ReduceOp::Avg));
        assert_eq!(<Partial<Min> as PlacementMarker>::PLACEMENT, Placement::Partial(ReduceOp::Min));
        assert_eq!(<Partial<Max> as PlacementMarker>::PLACEMENT, Placement::Partial(ReduceOp::Max));
        assert_eq!(<Partial<Product> as PlacementMarker>::PLACEMENT, Placement::Partial(ReduceOp::Product));
    }
}
