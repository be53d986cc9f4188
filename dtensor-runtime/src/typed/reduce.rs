//! Typed `sum` over one tensor dim (keeping it, so the rank stays a type-level constant):
//! `Shard<DIM>` → `Partial<Sum>`, another `Shard<D>` stays, `Replicate` stays, `Partial<Sum>`
//! and `Partial<Avg>` stay (a sum is linear). `Partial<Min|Max|Product>` need a redistribute
//! first.

use super::lift::lift_unary;
use super::markers::{Avg, Partial, Replicate, Shard, Sum};
use super::same::SameLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::Element;
use crate::error::Result;

/// A tensor dim as a type (and a zero-sized value to pass it): `x.sum(Dim::<1>)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dim<const DIM: usize>;

/// The `sum(dim)` rule on one mesh dim.
#[diagnostic::on_unimplemented(
    message = "sum of `{Self}` on mesh dim `{Name}` is not a legal layout: only `Partial<Sum>` and `Partial<Avg>` stay partial through a sum; redistribute first",
    label = "no sum rule for `{Self}` on mesh dim `{Name}`",
    note = "sum keeps `Replicate`, keeps `Shard<D>` for D ≠ the summed dim (tensor dims up to 7), turns `Shard<dim>` into `Partial<Sum>`, and keeps `Partial<Sum>` and `Partial<Avg>`"
)]
pub trait SumRule<Name, Ctx> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The sum rule on every mesh dim of a layout.
    SumLayout,
    SumRule,
    ctx
);

impl<N, const DIM: usize> SumRule<N, Dim<DIM>> for Replicate {
    type Out = Replicate;
}
impl<N, const DIM: usize> SumRule<N, Dim<DIM>> for Partial<Sum> {
    type Out = Partial<Sum>;
}
impl<N, const DIM: usize> SumRule<N, Dim<DIM>> for Partial<Avg> {
    type Out = Partial<Avg>;
}

/// Chooses the output of `Shard<D>` from whether `D` is the summed dim.
#[doc(hidden)]
pub enum Same<const B: bool> {}
#[doc(hidden)]
pub trait PickSum<S> {
    type Out: super::PlacementMarker;
}
impl<S> PickSum<S> for Same<true> {
    type Out = Partial<Sum>;
}
impl<S: super::PlacementMarker> PickSum<S> for Same<false> {
    type Out = S;
}

/// `impl SumRule<N, Dim<dim>> for Shard<d>` for every pair of the list.
macro_rules! shard_sum_rules {
    (@row $dim:literal; $($d:literal)*) => {$(
        impl<N> SumRule<N, Dim<$dim>> for Shard<$d> {
            type Out = <Same<{ $d == $dim }> as PickSum<Shard<$d>>>::Out;
        }
    )*};
    ($($dim:literal)*) => {$(
        shard_sum_rules!(@row $dim; 0 1 2 3 4 5 6 7);
    )*};
}
shard_sum_rules!(0 1 2 3 4 5 6 7);

impl<T: Element, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Sum over tensor dim `DIM`, keeping it (size 1): `x.sum(Dim::<1>)`. A `Shard<DIM>`
    /// becomes `Partial<Sum>`. `DIM ≥ R` fails at `cargo build`.
    ///
    /// (The dim is a value argument rather than a turbofish so that the layout can go through
    /// [`SameLayout`]: rustc then reports the broken [`SumRule`] with its message instead of
    /// "method exists but its trait bounds were not satisfied".)
    pub fn sum<const DIM: usize, Lx>(&self, _dim: Dim<DIM>) -> Result<Dt<T, M, <Lx as SumLayout<M, Dim<DIM>>>::Out, R>>
    where
        L: SameLayout<Lx>,
        Lx: SumLayout<M, Dim<DIM>>,
    {
        const { assert!(DIM < R, "`sum(Dim::<DIM>)`: DIM must be a dim of the tensor (DIM < R)") };
        Dt::from_op("sum", self.as_dtensor().sum_dim(DIM as isize, true))
    }
}
