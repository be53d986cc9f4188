//! Typed reductions `sum` / `mean` / `max` / `min`, over one tensor dim (kept, size 1, so the
//! rank stays a type-level constant) or over every dim (`*_all`, a rank-0 result). Per mesh
//! dim: `Replicate` stays; a `Shard` of a reduced dim becomes `Partial<Sum>` (sum, mean),
//! `Partial<Max>` (max) or `Partial<Min>` (min); a `Shard` of another dim stays; a `Partial`
//! stays when the reduction commutes with it. What a reduction makes of a shard and which
//! Partials it keeps is the runtime's table ([`reduction_rule`]); the rules here are generated
//! from it.
//!
//! `argmax` / `argmin` over one dim (kept) are not linear: per-shard indices cannot be
//! combined by any reduction, so a `Shard` of the reduced dim and every `Partial` do not
//! compile (the runtime would redistribute first; [`arg_reduce_keeps_shard`]); `Replicate` and
//! shards of other dims stay.

use super::lift::lift_unary;
use super::markers::{Avg, Max, Min, Partial, Product, Replicate, Shard, Sum};
use super::redistribute::Verdict;
use super::same::SameLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::{Element, Scalar};
use crate::error::Result;
use crate::ops::reduction::{
    arg_reduce_keeps_partial, arg_reduce_keeps_shard, reduction_keeps, reduction_rule, ReductionKind,
};
use crate::placement::ReduceOp;

/// A tensor dim as a type (and a zero-sized value to pass it): `x.sum(Dim::<1>)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dim<const DIM: usize>;

/// Every tensor dim (the context of `sum_all`, `mean_all`, `max_all`).
#[doc(hidden)]
pub enum All {}

/// The reduction `K` over `D` (`Dim<DIM>` or [`All`]): the context of [`ReduceRule`].
#[doc(hidden)]
pub struct Over<K, D>(std::marker::PhantomData<(K, D)>);

/// One marker per reduction kind.
pub mod kinds {
    /// `sum` (and `mean`: a sum, then a scale).
    pub enum SumOf {}
    /// `max`.
    pub enum MaxOf {}
    /// `min`.
    pub enum MinOf {}
    /// `argmax`.
    pub enum ArgMax {}
    /// `argmin`.
    pub enum ArgMin {}
}

/// A reduction kind: which runtime kind it is and the Partial marker a reduced shard becomes.
#[doc(hidden)]
pub trait ReductionMarker {
    /// The reduce-op marker of `Partial` for a shard of a reduced dim.
    type Partial: super::ReduceMarker;
}
impl ReductionMarker for kinds::SumOf {
    type Partial = Sum;
}
impl ReductionMarker for kinds::MaxOf {
    type Partial = Max;
}
impl ReductionMarker for kinds::MinOf {
    type Partial = Min;
}

// The markers must say what the runtime's table says.
const _: () = {
    assert!(reduction_rule(ReductionKind::Sum).0 as u8 == ReduceOp::Sum as u8);
    assert!(reduction_rule(ReductionKind::Max).0 as u8 == ReduceOp::Max as u8);
    assert!(reduction_rule(ReductionKind::Min).0 as u8 == ReduceOp::Min as u8);
};

/// Holds when the reduction `Kind` keeps the Partial `From` (implemented for `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Kind}` of `{From}` on mesh dim `{Name}` is not a legal layout: the reduction does not commute with that Partial",
    label = "`{From}` on mesh dim `{Name}` must be reduced first",
    note = "sum and mean keep `Partial<Sum|Avg>`, max keeps `Partial<Max>`, min keeps `Partial<Min>`; call `.redistribute()` on mesh dim `{Name}` to `Replicate` or `Shard<D>` first"
)]
pub trait ReductionKeeps<From, Kind, Name> {}
impl<From, Kind, Name> ReductionKeeps<From, Kind, Name> for Verdict<true> {}

/// The rule of a reduction on one mesh dim (`Ctx` = [`Over`]`<kind, dims>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "reduction of `{Self}` on mesh dim `{Name}` has no typed rule: typed reductions cover tensor dims 0..=7",
    label = "no typed reduction rule for `{Self}`"
)]
pub trait ReduceRule<Name, Ctx> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The reduction rule on every mesh dim of a layout.
    #[doc(hidden)]
    ReduceLayout,
    ReduceRule,
    ctx
);

impl<N, K, D> ReduceRule<N, Over<K, D>> for Replicate {
    type Out = Replicate;
}
impl<N, K: ReductionMarker, const S: usize> ReduceRule<N, Over<K, All>> for Shard<S> {
    type Out = Partial<K::Partial>;
}

/// `impl ReduceRule<N, Over<kinds::K, D>> for Partial<Op>`, legal where the runtime's table
/// says so.
macro_rules! partial_rules {
    (@op $k:ident $rk:ident; $($op:ident)*) => {$(
        impl<N, D> ReduceRule<N, Over<kinds::$k, D>> for Partial<$op>
        where
            Verdict<{ reduction_keeps(ReductionKind::$rk, ReduceOp::$op) }>: ReductionKeeps<Partial<$op>, kinds::$k, N>,
        {
            type Out = Partial<$op>;
        }
    )*};
    ($($k:ident => $rk:ident),*) => {$(
        partial_rules!(@op $k $rk; Sum Avg Min Max Product);
    )*};
}
partial_rules!(SumOf => Sum, MaxOf => Max, MinOf => Min);

/// Chooses the output of `Shard<D>` from whether `D` is the reduced dim.
#[doc(hidden)]
pub enum Same<const B: bool> {}
#[doc(hidden)]
pub trait Pick<S, K> {
    type Out: super::PlacementMarker;
}
impl<S, K: ReductionMarker> Pick<S, K> for Same<true> {
    type Out = Partial<K::Partial>;
}
impl<S: super::PlacementMarker, K> Pick<S, K> for Same<false> {
    type Out = S;
}

/// `impl ReduceRule<N, Over<K, Dim<dim>>> for Shard<d>` for every pair of the list.
macro_rules! shard_rules {
    (@row $dim:literal; $($d:literal)*) => {$(
        impl<N, K> ReduceRule<N, Over<K, Dim<$dim>>> for Shard<$d>
        where
            Same<{ $d == $dim }>: Pick<Shard<$d>, K>,
        {
            type Out = <Same<{ $d == $dim }> as Pick<Shard<$d>, K>>::Out;
        }
    )*};
    ($($dim:literal)*) => {$(
        shard_rules!(@row $dim; 0 1 2 3 4 5 6 7);
    )*};
}
shard_rules!(0 1 2 3 4 5 6 7);

/// Context of `argmax` / `argmin` (`K` = [`kinds::ArgMax`] / [`kinds::ArgMin`]) over `D`
/// (a [`Dim`]).
#[doc(hidden)]
pub struct Arg<K, D>(std::marker::PhantomData<(K, D)>);

/// Holds when argmax / argmin keeps the shard `S` (implemented for `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Ctx}` over the dim that is `{S}` on mesh dim `{Name}` is not a legal layout: per-shard indices do not combine",
    label = "`{Ctx}` reduces the dim that mesh dim `{Name}` shards (`{S}`): call `.redistribute()` first",
    note = "argmax / argmin are not linear; redistribute mesh dim `{Name}` to `Replicate` (or to `Shard` of another dim) first"
)]
pub trait ArgKeepsShard<S, Name, Ctx> {}
impl<S, Name, Ctx> ArgKeepsShard<S, Name, Ctx> for Verdict<true> {}

/// Holds when argmax / argmin keeps the Partial `P` (implemented for `Verdict<true>`; the
/// runtime's [`arg_reduce_keeps_partial`] keeps none).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Kind}` of `{P}` on mesh dim `{Name}` is not a legal layout: argmax / argmin do not commute with a Partial",
    label = "`{P}` on mesh dim `{Name}` must be reduced first: call `.redistribute()`",
    note = "redistribute mesh dim `{Name}` to `Replicate` (all-reduce) or to `Shard` of a dim other than the reduced one (reduce-scatter) first"
)]
pub trait ArgKeepsPartial<P, Name, Kind> {}
impl<P, Name, Kind> ArgKeepsPartial<P, Name, Kind> for Verdict<true> {}

/// The rule of argmax / argmin on one mesh dim (`Ctx` = [`Arg`]).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Ctx}` of `{Self}` on mesh dim `{Name}` has no typed rule: typed argmax / argmin cover tensor dims 0..=7",
    label = "no typed argmax / argmin rule for `{Self}`"
)]
pub trait ArgReduceRule<Name, Ctx> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The argmax / argmin rule on every mesh dim of a layout.
    #[doc(hidden)]
    ArgReduceLayout,
    ArgReduceRule,
    ctx
);

impl<N, K, D> ArgReduceRule<N, Arg<K, D>> for Replicate {
    type Out = Replicate;
}

/// `impl ArgReduceRule<N, Arg<K, Dim<dim>>> for Shard<d>` for every pair of the list.
macro_rules! arg_shard_rules {
    (@row $dim:literal; $($d:literal)*) => {$(
        impl<N, K> ArgReduceRule<N, Arg<K, Dim<$dim>>> for Shard<$d>
        where
            Verdict<{ arg_reduce_keeps_shard($d, $dim) }>: ArgKeepsShard<Shard<$d>, N, Arg<K, Dim<$dim>>>,
        {
            type Out = Shard<$d>;
        }
    )*};
    ($($dim:literal)*) => {$(
        arg_shard_rules!(@row $dim; 0 1 2 3 4 5 6 7);
    )*};
}
arg_shard_rules!(0 1 2 3 4 5 6 7);

/// `impl ArgReduceRule<N, Arg<kinds::K, D>> for Partial<Op>`, legal where the runtime says so.
macro_rules! arg_partial_rules {
    (@op $k:ident; $($op:ident)*) => {$(
        impl<N, D> ArgReduceRule<N, Arg<kinds::$k, D>> for Partial<$op>
        where
            Verdict<{ arg_reduce_keeps_partial(ReduceOp::$op) }>: ArgKeepsPartial<Partial<$op>, N, kinds::$k>,
        {
            type Out = Partial<$op>;
        }
    )*};
    ($($k:ident)*) => {$(
        arg_partial_rules!(@op $k; Sum Avg Min Max Product);
    )*};
}
arg_partial_rules!(ArgMax ArgMin);

/// The output layout of reduction `K` over `D`.
type Reduced<Lx, M, K, D> = <Lx as ReduceLayout<M, Over<K, D>>>::Out;

// The output layouts are projections, spelled out once per method.
#[allow(clippy::type_complexity)]
impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Sum over tensor dim `DIM`, keeping it (size 1): `x.sum(Dim::<1>)`. A `Shard<DIM>`
    /// becomes `Partial<Sum>`. `DIM ≥ R` fails at `cargo build`.
    ///
    /// (The dim is a value argument rather than a turbofish so that the layout can go through
    /// [`SameLayout`]: rustc then reports the broken rule with its message instead of
    /// "method exists but its trait bounds were not satisfied".)
    #[track_caller]
    pub fn sum<const DIM: usize, Lx>(
        &self,
        _dim: Dim<DIM>,
    ) -> Result<Dt<T, M, Reduced<Lx, M, kinds::SumOf, Dim<DIM>>, R>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: ReduceLayout<M, Over<kinds::SumOf, Dim<DIM>>>,
    {
        const { assert!(DIM < R, "`sum(Dim::<DIM>)`: DIM must be a dim of the tensor (DIM < R)") };
        Dt::from_op("sum", || self.as_dtensor().sum_dim(DIM as isize, true))
    }

    /// Mean over tensor dim `DIM`, keeping it; the layouts of [`sum`](Dt::sum).
    #[track_caller]
    pub fn mean<const DIM: usize, Lx>(
        &self,
        _dim: Dim<DIM>,
    ) -> Result<Dt<T, M, Reduced<Lx, M, kinds::SumOf, Dim<DIM>>, R>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: ReduceLayout<M, Over<kinds::SumOf, Dim<DIM>>>,
    {
        const { assert!(DIM < R, "`mean(Dim::<DIM>)`: DIM must be a dim of the tensor (DIM < R)") };
        Dt::from_op("mean", || self.as_dtensor().mean_dim(DIM as isize, true))
    }

    /// Maximum over tensor dim `DIM`, keeping it: a `Shard<DIM>` becomes `Partial<Max>`.
    #[track_caller]
    pub fn max<const DIM: usize, Lx>(
        &self,
        _dim: Dim<DIM>,
    ) -> Result<Dt<T, M, Reduced<Lx, M, kinds::MaxOf, Dim<DIM>>, R>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: ReduceLayout<M, Over<kinds::MaxOf, Dim<DIM>>>,
    {
        const { assert!(DIM < R, "`max(Dim::<DIM>)`: DIM must be a dim of the tensor (DIM < R)") };
        Dt::from_op("max", || self.as_dtensor().max_dim(DIM as isize, true))
    }

    /// Minimum over tensor dim `DIM`, keeping it: a `Shard<DIM>` becomes `Partial<Min>`.
    #[track_caller]
    pub fn min<const DIM: usize, Lx>(
        &self,
        _dim: Dim<DIM>,
    ) -> Result<Dt<T, M, Reduced<Lx, M, kinds::MinOf, Dim<DIM>>, R>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: ReduceLayout<M, Over<kinds::MinOf, Dim<DIM>>>,
    {
        const { assert!(DIM < R, "`min(Dim::<DIM>)`: DIM must be a dim of the tensor (DIM < R)") };
        Dt::from_op("min", || self.as_dtensor().min_dim(DIM as isize, true))
    }

    /// Index of the maximum over tensor dim `DIM` (kept, size 1; first occurrence), as an
    /// `i64` tensor (PyTorch's int64: an index in the element type would round, e.g. in bf16
    /// beyond 256). A `Shard<DIM>` or a `Partial` does not compile; other shards stay.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dim, Dt, Shard};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let g = ndarray::ArrayD::from_shape_fn(vec![3, 4], |ix| ((ix[0] + 2 * ix[1]) % 4) as f32);
    ///     let x: Dt<f32, (tp,), (Shard<0>,), 2> = Dt::distribute(&g, &mesh)?;
    ///     let i: Dt<i64, (tp,), (Shard<0>,), 2> = x.argmax(Dim::<1>)?; // rows stay sharded
    ///     i.full_tensor()
    /// })
    /// .unwrap();
    /// assert_eq!(out[0].as_slice().unwrap(), &[1, 1, 0]);
    /// ```
    #[track_caller]
    pub fn argmax<const DIM: usize, Lx>(
        &self,
        _dim: Dim<DIM>,
    ) -> Result<Dt<i64, M, <Lx as ArgReduceLayout<M, Arg<kinds::ArgMax, Dim<DIM>>>>::Out, R>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: ArgReduceLayout<M, Arg<kinds::ArgMax, Dim<DIM>>>,
    {
        const { assert!(DIM < R, "`argmax(Dim::<DIM>)`: DIM must be a dim of the tensor (DIM < R)") };
        Dt::from_op("argmax", || self.as_dtensor().argmax(DIM as isize, true))
    }

    /// Index of the minimum over tensor dim `DIM`, as an `i64` tensor; the layouts of
    /// [`argmax`](Dt::argmax).
    #[track_caller]
    pub fn argmin<const DIM: usize, Lx>(
        &self,
        _dim: Dim<DIM>,
    ) -> Result<Dt<i64, M, <Lx as ArgReduceLayout<M, Arg<kinds::ArgMin, Dim<DIM>>>>::Out, R>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: ArgReduceLayout<M, Arg<kinds::ArgMin, Dim<DIM>>>,
    {
        const { assert!(DIM < R, "`argmin(Dim::<DIM>)`: DIM must be a dim of the tensor (DIM < R)") };
        Dt::from_op("argmin", || self.as_dtensor().argmin(DIM as isize, true))
    }

    /// Sum of every element (rank 0): every `Shard` becomes `Partial<Sum>`.
    #[track_caller]
    pub fn sum_all<Lx>(&self) -> Result<Dt<T, M, Reduced<Lx, M, kinds::SumOf, All>, 0>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: ReduceLayout<M, Over<kinds::SumOf, All>>,
    {
        Dt::from_op("sum", || self.as_dtensor().sum())
    }

    /// Mean of every element (rank 0); the layouts of [`sum_all`](Dt::sum_all).
    #[track_caller]
    pub fn mean_all<Lx>(&self) -> Result<Dt<T, M, Reduced<Lx, M, kinds::SumOf, All>, 0>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: ReduceLayout<M, Over<kinds::SumOf, All>>,
    {
        Dt::from_op("mean", || self.as_dtensor().mean())
    }

    /// Maximum of every element (rank 0): every `Shard` becomes `Partial<Max>`.
    #[track_caller]
    pub fn max_all<Lx>(&self) -> Result<Dt<T, M, Reduced<Lx, M, kinds::MaxOf, All>, 0>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: ReduceLayout<M, Over<kinds::MaxOf, All>>,
    {
        Dt::from_op("max", || self.as_dtensor().max())
    }

    /// Minimum of every element (rank 0): every `Shard` becomes `Partial<Min>`.
    #[track_caller]
    pub fn min_all<Lx>(&self) -> Result<Dt<T, M, Reduced<Lx, M, kinds::MinOf, All>, 0>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: ReduceLayout<M, Over<kinds::MinOf, All>>,
    {
        Dt::from_op("min", || self.as_dtensor().min())
    }
}
