//! Typed `layer_norm` / `rms_norm` over the trailing `K` dims of a rank-`R` tensor, with a
//! `Replicate` weight (and bias) of rank `K`.
//!
//! Per mesh dim: `Replicate` stays; `Shard<D>` of a non-normalised dim stays (every
//! statistic is local); `Shard<D>` of a normalised dim and any `Partial` do not compile. The
//! runtime would all-gather such a shard (or all-reduce the Partial) before normalising; the
//! typed layer never does that silently, so the user calls `.redistribute()` first — there is
//! no two-pass statistic over a sharded normalised dim in either layer. Which shards are kept
//! is the runtime's rule ([`norm_keeps_shard`]); the typed rules are generated from it.

use super::dims::MeshDim;
use super::lift::lift_unary;
use super::markers::{Replicate, Shard};
use super::redistribute::Verdict;
use super::same::SameLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::Element;
use crate::error::Result;
use crate::ops::norm::norm_keeps_shard;

/// Context of the normalisation rule: the input rank `R` and the number `K` of normalised
/// trailing dims.
#[doc(hidden)]
pub enum Normalized<const R: usize, const K: usize> {}

/// Holds when the shard `S` is on a non-normalised dim (implemented for `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "normalisation over a `{S}` dim on mesh dim `{Name}` is not a legal layout: the normalised dims must not be sharded",
    label = "`{S}` on mesh dim `{Name}` shards a normalised (trailing) dim",
    note = "redistribute mesh dim `{Name}` to `Replicate` (or to `Shard` of a non-normalised dim) first: `layer_norm`/`rms_norm` shard only the dims they do not normalise"
)]
pub trait KeepsShard<S, Name> {}
impl<S, Name> KeepsShard<S, Name> for Verdict<true> {}

/// The `layer_norm` / `rms_norm` rule on one mesh dim.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`layer_norm` / `rms_norm` of `{Self}` on mesh dim `{Name}` is not a legal layout: the normalised dims must not be sharded and the input must not be Partial",
    label = "`{Self}` on mesh dim `{Name}` must be redistributed first: call `.redistribute()`",
    note = "redistribute mesh dim `{Name}` to `Replicate`, or to `Shard<D>` of a leading (not normalised) dim, first; the typed layer never gathers or reduces implicitly"
)]
pub trait NormRule<Name, Ctx> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The normalisation rule on every mesh dim of a layout.
    #[doc(hidden)]
    NormLayout,
    NormRule,
    ctx
);

impl<N, const R: usize, const K: usize> NormRule<N, Normalized<R, K>> for Replicate {
    type Out = Replicate;
}

/// `impl NormRule<N, Normalized<r, k>> for Shard<d>` for every `d < r`, `1 ≤ k ≤ r`.
macro_rules! shard_rules {
    (@d $r:literal $k:literal; [$($d:literal)*]) => {$(
        impl<N> NormRule<N, Normalized<$r, $k>> for Shard<$d>
        where
            Verdict<{ norm_keeps_shard($d, $r, $k) }>: KeepsShard<Shard<$d>, N>,
        {
            type Out = Shard<$d>;
        }
    )*};
    ($($r:literal: [$($k:literal)*] $ds:tt;)*) => {$($(
        shard_rules!(@d $r $k; $ds);
    )*)*};
}
shard_rules! {
    1: [1] [0];
    2: [1 2] [0 1];
    3: [1 2 3] [0 1 2];
    4: [1 2 3 4] [0 1 2 3];
    5: [1 2 3 4 5] [0 1 2 3 4];
}

/// A mesh's all-`Replicate` layout: the layout of a norm's weight and bias.
#[doc(hidden)]
pub trait Replicated: MeshDims + Sized {
    /// `(Replicate, ..)`, one per mesh dim.
    type Layout: TypedLayout<Self>;
}
impl<N0: MeshDim> Replicated for (N0,) {
    type Layout = (Replicate,);
}
impl<N0: MeshDim, N1: MeshDim> Replicated for (N0, N1) {
    type Layout = (Replicate, Replicate);
}
impl<N0: MeshDim, N1: MeshDim, N2: MeshDim> Replicated for (N0, N1, N2) {
    type Layout = (Replicate, Replicate, Replicate);
}
impl<N0: MeshDim, N1: MeshDim, N2: MeshDim, N3: MeshDim> Replicated for (N0, N1, N2, N3) {
    type Layout = (Replicate, Replicate, Replicate, Replicate);
}

/// A norm's weight or bias: rank `K`, replicated on every mesh dim.
pub type NormParam<'a, T, M, const K: usize> = Option<&'a Dt<T, M, <M as Replicated>::Layout, K>>;

// The output layouts are projections, spelled out once per method.
#[allow(clippy::type_complexity)]
impl<T: Element, M: MeshDims + Replicated, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Layer normalisation over the trailing `K` dims (PyTorch `F.layer_norm`), with an
    /// optional replicated `weight` and `bias` of shape `normalized_shape`. Keeps the layout;
    /// a shard of a normalised dim or a `Partial` does not compile (see the module).
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dt, Replicate, Shard};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let g = ndarray::ArrayD::from_shape_fn(vec![4, 3], |ix| (ix[0] + 2 * ix[1]) as f64);
    ///     let x: Dt<f64, (tp,), (Shard<0>,), 2> = Dt::distribute(&g, &mesh)?;
    ///     let w: Dt<f64, (tp,), (Replicate,), 1> = Dt::distribute(&ndarray::ArrayD::ones(vec![3]), &mesh)?;
    ///     let y: Dt<f64, (tp,), (Shard<0>,), 2> = x.layer_norm([3], Some(&w), None, 1e-5)?;
    ///     y.full_tensor()
    /// })
    /// .unwrap();
    /// assert!(out[0].sum().abs() < 1e-9); // every row has mean 0
    /// ```
    #[track_caller]
    pub fn layer_norm<const K: usize, Lx>(
        &self,
        normalized_shape: [usize; K],
        weight: NormParam<'_, T, M, K>,
        bias: NormParam<'_, T, M, K>,
        eps: f64,
    ) -> Result<Dt<T, M, <Lx as NormLayout<M, Normalized<R, K>>>::Out, R>>
    where
        L: SameLayout<Lx>,
        Lx: NormLayout<M, Normalized<R, K>>,
    {
        const { assert!(K >= 1 && K <= R, "`layer_norm`: normalized_shape must name 1 to R trailing dims") };
        let (w, b) = (weight.map(Dt::as_dtensor), bias.map(Dt::as_dtensor));
        Dt::from_op("layer_norm", || self.as_dtensor().layer_norm(&normalized_shape, w, b, eps))
    }

    /// RMS normalisation over the trailing `K` dims (PyTorch `F.rms_norm`), with an optional
    /// replicated `weight`; the layouts of [`layer_norm`](Dt::layer_norm).
    #[track_caller]
    pub fn rms_norm<const K: usize, Lx>(
        &self,
        normalized_shape: [usize; K],
        weight: NormParam<'_, T, M, K>,
        eps: f64,
    ) -> Result<Dt<T, M, <Lx as NormLayout<M, Normalized<R, K>>>::Out, R>>
    where
        L: SameLayout<Lx>,
        Lx: NormLayout<M, Normalized<R, K>>,
    {
        const { assert!(K >= 1 && K <= R, "`rms_norm`: normalized_shape must name 1 to R trailing dims") };
        Dt::from_op("rms_norm", || self.as_dtensor().rms_norm(&normalized_shape, weight.map(Dt::as_dtensor), eps))
    }
}
