//! Typed `relu` and `gelu`: nonlinear, so they keep `Shard<D>` and `Replicate` and reject
//! `Partial` (the activation of a sum is not the sum of the activations).

use super::lift::lift_unary;
use super::markers::{Replicate, Shard};
use super::same::SameLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::Element;
use crate::error::Result;

/// The rule of a nonlinear element-wise op on one mesh dim.
#[diagnostic::on_unimplemented(
    message = "relu/gelu of `{Self}` on mesh dim `{Name}` is not a legal layout: a Partial value must be reduced first",
    label = "`{Self}` holds partial values on mesh dim `{Name}`",
    note = "redistribute mesh dim `{Name}` to `Replicate` (all-reduce) or `Shard<D>` (reduce-scatter) before a nonlinear op"
)]
pub trait NonlinearRule<Name> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The nonlinear rule on every mesh dim of a layout.
    NonlinearLayout,
    NonlinearRule
);

impl<N> NonlinearRule<N> for Replicate {
    type Out = Replicate;
}
impl<N, const D: usize> NonlinearRule<N> for Shard<D> {
    type Out = Shard<D>;
}

impl<T: Element, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// `max(x, 0)`; does not compile on a `Partial` layout.
    pub fn relu<Lx>(&self) -> Result<Dt<T, M, <Lx as NonlinearLayout<M>>::Out, R>>
    where
        L: SameLayout<Lx>,
        Lx: NonlinearLayout<M>,
    {
        Dt::from_op("relu", self.as_dtensor().relu())
    }

    /// GELU (tanh approximation); does not compile on a `Partial` layout.
    pub fn gelu<Lx>(&self) -> Result<Dt<T, M, <Lx as NonlinearLayout<M>>::Out, R>>
    where
        L: SameLayout<Lx>,
        Lx: NonlinearLayout<M>,
    {
        Dt::from_op("gelu", self.as_dtensor().gelu())
    }
}
