//! Which layout the operand of `x.op(&y.redistribute()?)` takes in a `#[distribute]` body (see
//! `Dt::redistribute_like`): per mesh dim, the receiver's marker, except that a `Partial`
//! receiver of `mul`/`div` takes a `Replicate` operand (`P * R` is the linear form; `P * P`
//! has no meaning). The macro names the op's kind; the rule traits stay the one home of what is
//! legal, and an operand layout they refuse is reported as the redistribution's or the op's
//! error.

use super::markers::{Partial, Replicate, Shard};
use super::{MeshDim, PlacementMarker, ReduceMarker, TypedLayout};

/// `add`, `sub` and the comparison masks: the operand takes the receiver's layout.
pub enum Same {}

/// `mul` and `div`: a `Partial` receiver takes a `Replicate` operand on that mesh dim.
pub enum Scale {}

/// The operand's marker beside a receiver marker `Self`, for op kind `K`.
pub trait OperandMarker<K> {
    /// The operand's marker.
    type Target: PlacementMarker;
}

impl<K, const D: usize> OperandMarker<K> for Shard<D> {
    type Target = Shard<D>;
}
impl<K> OperandMarker<K> for Replicate {
    type Target = Replicate;
}
impl<Op: ReduceMarker> OperandMarker<Same> for Partial<Op> {
    type Target = Partial<Op>;
}
impl<Op: ReduceMarker> OperandMarker<Scale> for Partial<Op> {
    type Target = Replicate;
}

/// [`OperandMarker`] on every mesh dim of a layout.
pub trait OperandLayout<K, M: super::MeshDims> {
    /// The operand's layout.
    type Target: TypedLayout<M>;
}

macro_rules! operand_tuples {
    ($(($($a:ident $n:ident),+)),+) => {$(
        impl<K, $($a: OperandMarker<K>, $n: MeshDim),+> OperandLayout<K, ($($n,)+)> for ($($a,)+)
        where
            ($(<$a as OperandMarker<K>>::Target,)+): TypedLayout<($($n,)+)>,
        {
            type Target = ($(<$a as OperandMarker<K>>::Target,)+);
        }
    )+};
}
operand_tuples!((A0 N0), (A0 N0, A1 N1), (A0 N0, A1 N1, A2 N2), (A0 N0, A1 N1, A2 N2, A3 N3));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typed::dims::{dp, tp};
    use crate::typed::markers::{Avg, Sum};
    use crate::Placement;

    fn target<K, L: OperandLayout<K, (dp, tp)>>() -> Vec<Placement> {
        <L::Target as TypedLayout<(dp, tp)>>::placements()
    }

    #[test]
    fn partial_receivers_of_scaling_ops_take_replicate_operands() {
        use Placement::{Replicate as R, Shard as S};
        assert_eq!(target::<Same, (Shard<0>, Partial<Sum>)>(), vec![S(0), Placement::PARTIAL_SUM]);
        assert_eq!(target::<Scale, (Shard<0>, Partial<Sum>)>(), vec![S(0), R]);
        assert_eq!(target::<Scale, (Partial<Avg>, Shard<1>)>(), vec![R, S(1)]);
        assert_eq!(target::<Same, (Replicate, Shard<1>)>(), vec![R, S(1)]);
    }
}
