//! A typed layout: a tuple of placement markers, one per mesh dimension.

use super::dims::MeshDims;
use super::markers::PlacementMarker;
use crate::placement::Placement;

/// A tuple of [`PlacementMarker`]s that fits the typed mesh `M` (same number of dims).
///
/// ```
/// use dtensor_runtime::typed::{dims::{dp, tp}, TypedLayout, Replicate, Shard};
/// use dtensor_runtime::Placement;
/// assert_eq!(
///     <(Shard<0>, Replicate) as TypedLayout<(dp, tp)>>::placements(),
///     vec![Placement::Shard(0), Placement::Replicate]
/// );
/// ```
#[diagnostic::on_unimplemented(
    message = "layout `{Self}` does not fit the mesh `{M}`",
    label = "a layout is a tuple with one placement marker per mesh dimension",
    note = "e.g. `(Shard<0>, Replicate)` on the mesh `(dp, tp)`"
)]
pub trait TypedLayout<M: MeshDims>: 'static {
    /// Smallest tensor rank every marker fits (`D + 1` for the largest `Shard<D>`).
    const MIN_RANK: usize;
    /// The dynamic placements, in mesh-dim order.
    fn placements() -> Vec<Placement>;
}

/// `max` for const contexts.
const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// A layout type with two different Partial reduce ops is not a `TypedLayout` (a bound that
/// `cargo check` reports where the type is written): every pair of markers must be
/// `Compatible` (`typed::redistribute`; one direction suffices: the relation is
/// symmetric).
macro_rules! layout_tuples {
    ($(($($p:ident : $n:ident),+) [$($a:ident $b:ident),*]),+) => {$(
        impl<$($p: PlacementMarker,)+ $($n: super::dims::MeshDim),+> TypedLayout<($($n,)+)> for ($($p,)+)
        where
            $($a: super::redistribute::Compatible<$b>,)*
        {
            const MIN_RANK: usize = {
                let mut m = 0;
                $(m = max(m, $p::MIN_RANK);)+
                m
            };
            fn placements() -> Vec<Placement> {
                vec![$($p::PLACEMENT),+]
            }
        }
    )+};
}

layout_tuples!(
    (P0: N0) [],
    (P0: N0, P1: N1) [P0 P1],
    (P0: N0, P1: N1, P2: N2) [P0 P1, P0 P2, P1 P2],
    (P0: N0, P1: N1, P2: N2, P3: N3) [P0 P1, P0 P2, P0 P3, P1 P2, P1 P3, P2 P3]
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typed::dims::{dp, pp, tp};
    use crate::typed::markers::{Partial, Replicate, Shard, Sum};

    #[test]
    fn min_rank_is_largest_shard_dim_plus_one() {
        assert_eq!(<(Replicate, Partial<Sum>) as TypedLayout<(dp, tp)>>::MIN_RANK, 0);
        assert_eq!(<(Shard<0>, Shard<2>, Replicate) as TypedLayout<(dp, tp, pp)>>::MIN_RANK, 3);
        assert_eq!(
            <(Shard<1>, Partial<Sum>, Replicate) as TypedLayout<(dp, tp, pp)>>::placements(),
            vec![Placement::Shard(1), Placement::PARTIAL_SUM, Placement::Replicate]
        );
    }
}
