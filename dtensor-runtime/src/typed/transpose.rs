//! Typed `transpose::<D0, D1>()`: swaps two tensor dims; a `Shard` on either moves with it.

use super::lift::lift_unary;
use super::markers::{Partial, ReduceMarker, Replicate, Shard};
use super::reduce::Dim;
use super::same::SameLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::Scalar;
use crate::error::Result;

/// Context of the transpose rule: the two swapped dims.
pub enum Swap<const D0: usize, const D1: usize> {}

/// The transpose rule on one mesh dim (hidden from the docs: its impls would fill every
/// marker's page).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "transpose of `{Self}` on mesh dim `{Name}` has no typed rule: typed transpose covers tensor dims 0..=5",
    label = "no typed transpose rule for `{Self}`",
    note = "use the dynamic `transpose` on `.as_dtensor()` for higher ranks"
)]
pub trait TransposeRule<Name, Ctx> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The transpose rule on every mesh dim of a layout.
    TransposeLayout,
    TransposeRule,
    ctx
);

impl<N, const D0: usize, const D1: usize> TransposeRule<N, Swap<D0, D1>> for Replicate {
    type Out = Replicate;
}
impl<N, Op: ReduceMarker, const D0: usize, const D1: usize> TransposeRule<N, Swap<D0, D1>> for Partial<Op> {
    type Out = Partial<Op>;
}

/// Where dim `d` goes when `d0` and `d1` swap.
const fn swapped(d: usize, d0: usize, d1: usize) -> usize {
    if d == d0 {
        d1
    } else if d == d1 {
        d0
    } else {
        d
    }
}

/// `impl TransposeRule<N, Swap<d0, d1>> for Shard<d>` for every triple of the list.
macro_rules! shard_transpose_rules {
    (@d $d0:literal $d1:literal; $($d:literal)*) => {$(
        impl<N> TransposeRule<N, Swap<$d0, $d1>> for Shard<$d> {
            type Out = Shard<{ swapped($d, $d0, $d1) }>;
        }
    )*};
    (@d1 $d0:literal; $($d1:literal)*) => {$(
        shard_transpose_rules!(@d $d0 $d1; 0 1 2 3 4 5);
    )*};
    ($($d0:literal)*) => {$(
        shard_transpose_rules!(@d1 $d0; 0 1 2 3 4 5);
    )*};
}
shard_transpose_rules!(0 1 2 3 4 5);

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Swaps tensor dims `D0` and `D1`: `x.transpose(Dim::<0>, Dim::<1>)`; a `Shard` on either
    /// follows its dim. Dims ≥ `R` fail at `cargo build`.
    #[track_caller]
    pub fn transpose<const D0: usize, const D1: usize, Lx>(
        &self,
        _d0: Dim<D0>,
        _d1: Dim<D1>,
    ) -> Result<Dt<T, M, <Lx as TransposeLayout<M, Swap<D0, D1>>>::Out, R>>
    where
        L: SameLayout<Lx>,
        Lx: TransposeLayout<M, Swap<D0, D1>>,
    {
        const { assert!(D0 < R && D1 < R, "`transpose(Dim::<D0>, Dim::<D1>)`: both dims must be < the tensor rank R") };
        Dt::from_op("transpose", || self.as_dtensor().transpose(D0 as isize, D1 as isize))
    }

    /// Matrix transpose (`transpose::<0, 1>()` of a rank-2 tensor).
    #[track_caller]
    pub fn t<Lx>(&self) -> Result<Dt<T, M, <Lx as TransposeLayout<M, Swap<0, 1>>>::Out, R>>
    where
        L: SameLayout<Lx>,
        Lx: TransposeLayout<M, Swap<0, 1>>,
    {
        self.transpose(Dim::<0>, Dim::<1>)
    }
}
