//! Type equality as a reflexive trait, so that a layout mismatch is a trait error (E0277)
//! that carries a message, rather than a bare "mismatched types" (E0308).

use super::{Dt, MeshDims, TypedLayout};
use crate::element::Scalar;

/// `A: SameLayout<B>` holds exactly when `A == B`; its functions are identities that let
/// generic code (e.g. the typed reductions' keepdim form) turn a tensor of layout `A` into one
/// of layout `B` for free.
#[diagnostic::on_unimplemented(
    message = "expected layout `{Expected}`, found `{Self}`: call `.redistribute()`",
    label = "this tensor has layout `{Self}`, not `{Expected}`",
    note = "call `.redistribute::<{Expected}>()` on it first"
)]
pub trait SameLayout<Expected>: Sized {
    /// The identity on an owned tensor.
    fn cast<T: Scalar, M: MeshDims, const R: usize>(x: Dt<T, M, Self, R>) -> Dt<T, M, Expected, R>
    where
        Self: TypedLayout<M>,
        Expected: TypedLayout<M>;
    /// The identity on a shared reference.
    fn cast_ref<T: Scalar, M: MeshDims, const R: usize>(x: &Dt<T, M, Self, R>) -> &Dt<T, M, Expected, R>
    where
        Self: TypedLayout<M>,
        Expected: TypedLayout<M>;
    /// The identity on a mutable reference.
    fn cast_mut<T: Scalar, M: MeshDims, const R: usize>(x: &mut Dt<T, M, Self, R>) -> &mut Dt<T, M, Expected, R>
    where
        Self: TypedLayout<M>,
        Expected: TypedLayout<M>;
}

impl<L> SameLayout<L> for L {
    fn cast<T: Scalar, M: MeshDims, const R: usize>(x: Dt<T, M, L, R>) -> Dt<T, M, L, R>
    where
        L: TypedLayout<M>,
    {
        x
    }
    fn cast_ref<T: Scalar, M: MeshDims, const R: usize>(x: &Dt<T, M, L, R>) -> &Dt<T, M, L, R>
    where
        L: TypedLayout<M>,
    {
        x
    }
    fn cast_mut<T: Scalar, M: MeshDims, const R: usize>(x: &mut Dt<T, M, L, R>) -> &mut Dt<T, M, L, R>
    where
        L: TypedLayout<M>,
    {
        x
    }
}
