//! Typed `permute`: the order is a tuple of [`Dim`]s, so that it is a type —
//! `x.permute((Dim::<0>, Dim::<2>, Dim::<1>, Dim::<3>))` (output dim `k` is input dim
//! `order[k]`). A `Shard<d>` moves to the position of `d` in the order ([`permuted_dim`], the
//! runtime's rule); `Replicate` and every `Partial` pass. Never communicates. An order that is
//! not a permutation of `0..R` (wrong length, repeated dim) does not compile. Typed permute
//! covers ranks 1 to 4; [`transpose`](Dt::transpose) covers dims up to 5.

use super::lift::lift_unary;
use super::markers::{Partial, ReduceMarker, Replicate, Shard};
use super::reduce::Dim;
use super::same::SameLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::Scalar;
use crate::error::Result;
use crate::ops::view::permuted_dim;

/// A tuple of [`Dim`]s that is a permutation of the dims `0..R` of a rank-`R` tensor.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a permutation of the dims of a rank-{R} tensor",
    label = "expected a tuple of {R} distinct `Dim::<d>` with every d < {R}",
    note = "e.g. `(Dim::<0>, Dim::<2>, Dim::<1>, Dim::<3>)` for a rank-4 tensor; typed permute covers ranks 1 to 4"
)]
pub trait Permutation<const R: usize>: Copy {
    /// Output dim `k` is input dim `ORDER[k]`.
    const ORDER: [usize; R];
}

/// The permute rule on one mesh dim (`Ctx` = the order tuple).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "permute of `{Self}` on mesh dim `{Name}` by `{Ctx}` has no typed rule",
    label = "`{Ctx}` is not a permutation that keeps `{Self}`",
    note = "the order must be a permutation of the tensor's dims (ranks 1 to 4)"
)]
pub trait PermuteRule<Name, Ctx> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The permute rule on every mesh dim of a layout.
    #[doc(hidden)]
    PermuteLayout,
    PermuteRule,
    ctx
);

impl<N, P> PermuteRule<N, P> for Replicate {
    type Out = Replicate;
}
impl<N, P, Op: ReduceMarker> PermuteRule<N, P> for Partial<Op> {
    type Out = Partial<Op>;
}

/// Every permutation of each dim list: `Permutation<R>` for the order tuple and
/// `PermuteRule` for `Shard<d>` of each dim `d`.
macro_rules! permutations {
    (@emit $t:ty, $r:literal, $order:tt; $($d:literal)*) => {
        impl Permutation<$r> for $t {
            const ORDER: [usize; $r] = $order;
        }
        $(impl<N> PermuteRule<N, $t> for Shard<$d> {
            type Out = Shard<{ permuted_dim($d, &$order) }>;
        })*
    };
    // `$done` is the order chosen so far, `$rest` the dims still to place.
    (@go $r:literal [$($done:literal)*] []) => {
        permutations!(@emit ($(Dim<$done>,)*), $r, [$($done),*]; $($done)*);
    };
    (@go $r:literal [$($done:literal)*] [$($rest:literal)+]) => {
        permutations!(@pick $r [$($done)*] [] [$($rest)*]);
    };
    // Each dim of `$rest` in turn as the next one (`$before` the dims passed over).
    (@pick $r:literal [$($done:literal)*] [$($before:literal)*] []) => {};
    (@pick $r:literal [$($done:literal)*] [$($before:literal)*] [$x:literal $($after:literal)*]) => {
        permutations!(@go $r [$($done)* $x] [$($before)* $($after)*]);
        permutations!(@pick $r [$($done)*] [$($before)* $x] [$($after)*]);
    };
    ($($r:literal: [$($d:literal)*];)*) => {$(
        permutations!(@go $r [] [$($d)*]);
    )*};
}
permutations! {
    1: [0];
    2: [0 1];
    3: [0 1 2];
    4: [0 1 2 3];
}

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Reorders the dims (PyTorch `permute`): output dim `k` is input dim `order[k]`, e.g.
    /// `[b, s, nh, hd]` → `[b, nh, s, hd]` with `x.permute((Dim::<0>, Dim::<2>, Dim::<1>,
    /// Dim::<3>))`. Shards move with their dims; never communicates.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dim, Dt, Shard};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let g = ndarray::ArrayD::<f32>::zeros(vec![2, 3, 4]);
    ///     let x: Dt<f32, (tp,), (Shard<2>,), 3> = Dt::distribute(&g, &mesh)?;
    ///     let y: Dt<f32, (tp,), (Shard<0>,), 3> = x.permute((Dim::<2>, Dim::<0>, Dim::<1>))?;
    ///     Ok(y.shape().to_vec())
    /// })
    /// .unwrap();
    /// assert_eq!(out[0], vec![4, 2, 3]);
    /// ```
    #[track_caller]
    pub fn permute<P, Lx>(&self, _order: P) -> Result<Dt<T, M, <Lx as PermuteLayout<M, P>>::Out, R>>
    where
        P: Permutation<R>,
        L: SameLayout<Lx>,
        Lx: PermuteLayout<M, P>,
    {
        let order = P::ORDER.map(|d| d as isize);
        Dt::from_op("permute", || self.as_dtensor().permute(&order))
    }
}
