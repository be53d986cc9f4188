//! Typed `narrow`, `split`, `chunk` (and the rule [`cat`](Dt::cat) shares): slicing along a
//! tensor dim `D` keeps the layout when no mesh dim shards `D` ([`slice_keeps_shard`], the
//! runtime's rule). Per mesh dim: `Replicate` and every `Partial` pass (slicing is linear),
//! `Shard<d>` with `d ≠ D` stays, and a `Shard<D>` does not compile — the runtime would gather
//! the dim first; the typed layer never does that silently.

use super::lift::lift_unary;
use super::markers::{Partial, ReduceMarker, Replicate, Shard};
use super::redistribute::Verdict;
use super::reduce::Dim;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::Scalar;
use crate::error::Result;
use crate::ops::slice::slice_keeps_shard;

/// Context of the slicing rule: `narrow` along dim `D`.
#[doc(hidden)]
pub enum Narrow<const D: usize> {}
/// Context of the slicing rule: `split` / `chunk` along dim `D`.
#[doc(hidden)]
pub enum Split<const D: usize> {}
/// Context of the slicing rule: `cat` along dim `D`.
#[doc(hidden)]
pub enum Cat<const D: usize> {}

/// Holds when slicing or concatenating along `Ctx`'s dim keeps the shard `S` (implemented for
/// `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Ctx}` along the dim that is `{S}` on mesh dim `{Name}` would gather it: call `.redistribute()` first",
    label = "`{Ctx}` slices or concatenates the dim that mesh dim `{Name}` shards (`{S}`)",
    note = "redistribute mesh dim `{Name}` to `Replicate` (or to `Shard` of another dim) first; the typed layer never gathers implicitly"
)]
pub trait KeepsShardAlong<S, Name, Ctx> {}
impl<S, Name, Ctx> KeepsShardAlong<S, Name, Ctx> for Verdict<true> {}

/// The rule of slicing / concatenating along a dim, on one mesh dim.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Ctx}` of `{Self}` on mesh dim `{Name}` has no typed rule: typed slicing covers tensor dims 0..=5",
    label = "no typed slicing rule for `{Self}`",
    note = "use the dynamic op on `.as_dtensor()` for higher ranks"
)]
pub trait AlongRule<Name, Ctx> {
    /// Placement of the result on this mesh dim (the input's).
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The slicing rule on every mesh dim of a layout.
    #[doc(hidden)]
    AlongLayout,
    AlongRule,
    ctx
);

impl<N, C> AlongRule<N, C> for Replicate {
    type Out = Replicate;
}
impl<N, C, Op: ReduceMarker> AlongRule<N, C> for Partial<Op> {
    type Out = Partial<Op>;
}

/// `impl AlongRule<N, ctx<a>> for Shard<d>` for every context, dim `a` and shard dim `d`.
macro_rules! shard_rules {
    (@at $ctx:ident $a:literal [$($d:literal)*]) => {$(
        impl<N> AlongRule<N, $ctx<$a>> for Shard<$d>
        where
            Verdict<{ slice_keeps_shard($d, $a) }>: KeepsShardAlong<Shard<$d>, N, $ctx<$a>>,
        {
            type Out = Shard<$d>;
        }
    )*};
    (@ctx $ctx:ident $ds:tt [$($a:literal)*]) => {
        $(shard_rules!(@at $ctx $a $ds);)*
    };
    ($ds:tt for [$($ctx:ident)*]) => {
        $(shard_rules!(@ctx $ctx $ds $ds);)*
    };
}
shard_rules!([0 1 2 3 4 5] for [Narrow Split Cat]);

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// `length` elements of dim `D` from `start` (PyTorch `narrow`); the layout is kept, a
    /// `Shard<D>` does not compile.
    #[track_caller]
    pub fn narrow<const D: usize>(&self, _dim: Dim<D>, start: usize, length: usize) -> Result<Self>
    where
        L: AlongLayout<M, Narrow<D>>,
    {
        const { assert!(D < R, "`narrow(Dim::<D>, ..)`: D must be < the tensor rank R") };
        Dt::from_op("narrow", || self.as_dtensor().narrow(D as isize, start, length))
    }

    /// Pieces of `split_size` along dim `D`, the last one smaller (PyTorch `split`), each with
    /// this layout; a `Shard<D>` does not compile.
    #[track_caller]
    pub fn split<const D: usize>(&self, split_size: usize, _dim: Dim<D>) -> Result<Vec<Self>>
    where
        L: AlongLayout<M, Split<D>>,
    {
        const { assert!(D < R, "`split(.., Dim::<D>)`: D must be < the tensor rank R") };
        let parts = {
            let _typed = crate::ops::implicit::typed_op("split", std::panic::Location::caller());
            self.as_dtensor().split(split_size, D as isize)?
        };
        parts.into_iter().map(|p| Dt::from_op("split", || Ok(p))).collect()
    }

    /// `chunks` pieces of `ceil(n / chunks)` along dim `D` (PyTorch `chunk`: fewer when the
    /// dim is too small), each with this layout; a `Shard<D>` does not compile.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dim, Dt, Shard};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let g = ndarray::ArrayD::<f32>::zeros(vec![4, 6]);
    ///     let qkv: Dt<f32, (tp,), (Shard<0>,), 2> = Dt::distribute(&g, &mesh)?;
    ///     let parts = qkv.chunk(3, Dim::<1>)?; // q, k, v: each `(Shard<0>,)`, [4, 2]
    ///     Ok(parts.iter().map(|p| p.shape().to_vec()).collect::<Vec<_>>())
    /// })
    /// .unwrap();
    /// assert_eq!(out[0], vec![vec![4, 2]; 3]);
    /// ```
    #[track_caller]
    pub fn chunk<const D: usize>(&self, chunks: usize, _dim: Dim<D>) -> Result<Vec<Self>>
    where
        L: AlongLayout<M, Split<D>>,
    {
        const { assert!(D < R, "`chunk(.., Dim::<D>)`: D must be < the tensor rank R") };
        let parts = {
            let _typed = crate::ops::implicit::typed_op("chunk", std::panic::Location::caller());
            self.as_dtensor().chunk(chunks, D as isize)?
        };
        parts.into_iter().map(|p| Dt::from_op("chunk", || Ok(p))).collect()
    }
}
