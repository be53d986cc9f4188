//! A typed layout: a tuple of placement markers, one per mesh dimension.

use super::dims::MeshDims;
use super::markers::PlacementMarker;
use crate::placement::{Placement, ReduceOp};

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
    /// Whether two mesh dims are `Partial` with different reduce ops. Such a value has no
    /// well-defined meaning for the runtime (its ops never produce one), so `Dt` rejects it.
    const MIXED_PARTIAL: bool;
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

/// Do two entries hold different reduce ops?
const fn mixed(ops: &[Option<ReduceOp>]) -> bool {
    let mut first: Option<ReduceOp> = None;
    let mut i = 0;
    while i < ops.len() {
        if let Some(op) = ops[i] {
            match first {
                None => first = Some(op),
                Some(f) => {
                    if f as u8 != op as u8 {
                        return true;
                    }
                }
            }
        }
        i += 1;
    }
    false
}

macro_rules! layout_tuples {
    ($(($($p:ident : $n:ident),+)),+) => {$(
        impl<$($p: PlacementMarker,)+ $($n: super::dims::MeshDim),+> TypedLayout<($($n,)+)> for ($($p,)+) {
            const MIN_RANK: usize = {
                let mut m = 0;
                $(m = max(m, $p::MIN_RANK);)+
                m
            };
            const MIXED_PARTIAL: bool = mixed(&[$($p::PARTIAL),+]);
            fn placements() -> Vec<Placement> {
                vec![$($p::PLACEMENT),+]
            }
        }
    )+};
}

layout_tuples!((P0: N0), (P0: N0, P1: N1), (P0: N0, P1: N1, P2: N2), (P0: N0, P1: N1, P2: N2, P3: N3));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typed::dims::{dp, pp, tp};
    use crate::typed::markers::{Avg, Partial, Replicate, Shard, Sum};

    #[test]
    fn min_rank_is_largest_shard_dim_plus_one() {
        assert_eq!(<(Replicate, Partial<Sum>) as TypedLayout<(dp, tp)>>::MIN_RANK, 0);
        assert_eq!(<(Shard<0>, Shard<2>, Replicate) as TypedLayout<(dp, tp, pp)>>::MIN_RANK, 3);
        const { assert!(!<(Partial<Sum>, Partial<Sum>) as TypedLayout<(dp, tp)>>::MIXED_PARTIAL) };
        const { assert!(<(Partial<Sum>, Replicate, Partial<Avg>) as TypedLayout<(dp, tp, pp)>>::MIXED_PARTIAL) };
        assert_eq!(
            <(Shard<1>, Partial<Sum>, Replicate) as TypedLayout<(dp, tp, pp)>>::placements(),
            vec![Placement::Shard(1), Placement::PARTIAL_SUM, Placement::Replicate]
        );
    }
}
