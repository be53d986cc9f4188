//! Typed one-input element-wise ops (`neg`, `exp`, `log`, `tanh`, `sqrt`, `relu`, `gelu`,
//! scalar `+ - * /`, `silu`, `sigmoid`, `softplus`, `pow`, `rsqrt`, `abs`, `clamp`,
//! `gelu_with`, and `dropout`): every op keeps `Replicate` and `Shard<D>`; a `Partial<Op>` is kept only
//! when the op commutes with that reduction. Which ones do is the runtime's table
//! ([`partials_kept`](crate::ops::pointwise::partials_kept)); the rules here are generated from it, so the typed op compiles exactly
//! when the dynamic op would run without an implicit all-reduce.

use super::lift::lift_unary;
use super::markers::{Avg, Max, Min, Partial, Product, Replicate, Shard, Sum};
use super::redistribute::Verdict;
use super::reduce::Dim;
use super::same::SameLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::{Element, Scalar};
use crate::error::Result;
use crate::ops::math::GeluApproximate;
use crate::ops::pointwise::{keeps_partial, UnaryKind};
use crate::placement::ReduceOp;

/// One marker type per op, for the rule's messages and its context.
pub mod kinds {
    macro_rules! kinds {
        ($($(#[$doc:meta])* $name:ident),*) => {$(
            $(#[$doc])*
            pub enum $name {}
        )*};
    }
    crate::ops::pointwise::with_unary_kinds!(kinds);
}

/// Holds when the op `Kind` keeps the Partial `From` (implemented for `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Kind}` of `{From}` on mesh dim `{Name}` is not a legal layout: the op does not commute with that reduction",
    label = "`{From}` on mesh dim `{Name}` must be reduced before this op: call `.redistribute()`",
    note = "redistribute mesh dim `{Name}` to `Replicate` (all-reduce) or `Shard<D>` (reduce-scatter) first; `neg`/`mul_scalar` keep Partial<Sum|Avg>, `add_scalar` keeps Partial<Avg|Max|Min>, other element-wise ops keep no Partial"
)]
pub trait KeepsPartial<From, Kind, Name> {}
impl<From, Kind, Name> KeepsPartial<From, Kind, Name> for Verdict<true> {}

/// The rule of the one-input op `Kind` on one mesh dim.
#[doc(hidden)]
pub trait UnaryRule<Name, Kind> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The one-input element-wise rule on every mesh dim of a layout.
    #[doc(hidden)]
    UnaryLayout,
    UnaryRule,
    ctx
);

impl<N, K> UnaryRule<N, K> for Replicate {
    type Out = Replicate;
}
impl<N, K, const D: usize> UnaryRule<N, K> for Shard<D> {
    type Out = Shard<D>;
}

/// `impl UnaryRule<N, kinds::K> for Partial<Op>`, legal where the runtime's table says so.
macro_rules! partial_rules {
    (@op $k:ident; $($op:ident)*) => {$(
        impl<N> UnaryRule<N, kinds::$k> for Partial<$op>
        where
            Verdict<{ keeps_partial(UnaryKind::$k, ReduceOp::$op) }>: KeepsPartial<Partial<$op>, kinds::$k, N>,
        {
            type Out = Partial<$op>;
        }
    )*};
    ($($(#[$doc:meta])* $k:ident),*) => {$(
        partial_rules!(@op $k; Sum Avg Min Max Product);
    )*};
}
crate::ops::pointwise::with_unary_kinds!(partial_rules);

/// Typed methods over the dynamic op of the same name.
macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) => $kind:ident;)*) => {
        impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {$(
            $(#[$doc])*
            #[track_caller]
            pub fn $name<Lx>(&self $(, $arg: $ty)*) -> Result<Dt<T, M, <Lx as UnaryLayout<M, kinds::$kind>>::Out, R>>
            where
                T: Element,
                L: SameLayout<Lx>,
                Lx: UnaryLayout<M, kinds::$kind>,
            {
                Dt::from_op(stringify!($name), || self.as_dtensor().$name($($arg),*))
            }
        )*}
    };
}

unary_methods! {
    /// `-self`; keeps `Partial<Sum|Avg>`.
    neg() => Neg;
    /// `e^self`; does not compile on a `Partial` layout.
    exp() => Exp;
    /// Natural logarithm; does not compile on a `Partial` layout.
    log() => Log;
    /// `max(x, 0)`; does not compile on a `Partial` layout.
    relu() => Relu;
    /// GELU (tanh approximation); does not compile on a `Partial` layout.
    gelu() => Gelu;
    /// Hyperbolic tangent; does not compile on a `Partial` layout.
    tanh() => Tanh;
    /// Square root; does not compile on a `Partial` layout.
    sqrt() => Sqrt;
    /// `self + s`; keeps `Partial<Avg|Max|Min>`.
    add_scalar(s: T) => AddScalar;
    /// `self - s`; keeps `Partial<Avg|Max|Min>`.
    sub_scalar(s: T) => AddScalar;
    /// `self * s`; keeps `Partial<Sum|Avg>`.
    mul_scalar(s: T) => MulScalar;
    /// `self / s` (`s = 0` is an error); keeps `Partial<Sum|Avg>`.
    div_scalar(s: T) => MulScalar;
    /// SiLU `x·σ(x)`; does not compile on a `Partial` layout.
    silu() => Silu;
    /// Logistic sigmoid; does not compile on a `Partial` layout.
    sigmoid() => Sigmoid;
    /// Softplus (`beta = 1`, `threshold = 20`); does not compile on a `Partial` layout.
    softplus() => Softplus;
    /// Softplus with PyTorch's `beta` and `threshold`; does not compile on a `Partial` layout.
    softplus_with(beta: f64, threshold: f64) => Softplus;
    /// `selfᵖ` for a scalar exponent; does not compile on a `Partial` layout.
    pow(exponent: f64) => Pow;
    /// `1 / √self`; does not compile on a `Partial` layout.
    rsqrt() => Rsqrt;
    /// `|self|`; does not compile on a `Partial` layout.
    abs() => Abs;
    /// `min(max(self, min), max)` (both bounds absent is a run-time error); does not compile
    /// on a `Partial` layout.
    clamp(min: Option<T>, max: Option<T>) => Clamp;
    /// GELU in the form PyTorch's `approximate` names; does not compile on a `Partial` layout.
    gelu_with(approximate: GeluApproximate) => Gelu;
    /// Dropout with probability `p` when `train` (the identity otherwise); keeps the layout
    /// (the mask is drawn per shard from the placement-invariant stream); does not compile on
    /// a `Partial` layout.
    dropout(p: f64, train: bool) => Dropout;
}

/// Holds when a softmax over tensor dim `Over` keeps the shard `From` without communicating:
/// the shard is of another dim (implemented for `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "softmax over `{Over}` of a tensor sharded on that dim (`{From}` on mesh dim `{Name}`) communicates: two all-reduces of per-row statistics",
    label = "use `softmax_across_shards` / `log_softmax_across_shards`, whose name shows the collectives",
    note = "`softmax`/`log_softmax` run no collective; a shard of another dim is kept"
)]
pub trait SoftmaxLocal<From, Over, Name> {}
impl<From, Over, Name> SoftmaxLocal<From, Over, Name> for Verdict<true> {}

/// The rule of `softmax`/`log_softmax` over tensor dim `Ctx = Dim<DIM>` on one mesh dim: a
/// shard of another dim and `Replicate` stay; a shard of `DIM` (that would communicate) and a
/// `Partial` do not compile.
#[doc(hidden)]
pub trait SoftmaxRule<Name, Ctx> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The local softmax rule on every mesh dim of a layout.
    #[doc(hidden)]
    SoftmaxLayout,
    SoftmaxRule,
    ctx
);

impl<N, const DIM: usize> SoftmaxRule<N, Dim<DIM>> for Replicate {
    type Out = Replicate;
}
impl<N, Op: super::ReduceMarker, const DIM: usize> SoftmaxRule<N, Dim<DIM>> for Partial<Op>
where
    Partial<Op>: UnaryRule<N, kinds::Softmax>,
{
    type Out = <Partial<Op> as UnaryRule<N, kinds::Softmax>>::Out;
}

/// `impl SoftmaxRule<N, Dim<dim>> for Shard<d>` for every pair of the list, legal when `d != dim`.
macro_rules! softmax_shard_rules {
    (@d $dim:literal; $($d:literal)*) => {$(
        impl<N> SoftmaxRule<N, Dim<$dim>> for Shard<$d>
        where
            Verdict<{ $d != $dim }>: SoftmaxLocal<Shard<$d>, Dim<$dim>, N>,
        {
            type Out = Shard<$d>;
        }
    )*};
    ($($dim:literal)*) => {$(
        softmax_shard_rules!(@d $dim; 0 1 2 3 4 5 6 7);
    )*};
}
softmax_shard_rules!(0 1 2 3 4 5 6 7);

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Softmax along tensor dim `DIM`: `x.softmax(Dim::<1>)`. Runs no collective: keeps every
    /// `Shard` of another dim; a shard of `DIM` itself does not compile (use
    /// [`softmax_across_shards`](Dt::softmax_across_shards)), nor does a `Partial` layout.
    /// `DIM ≥ R` fails at `cargo build`.
    #[track_caller]
    pub fn softmax<const DIM: usize, Lx>(
        &self,
        _dim: Dim<DIM>,
    ) -> Result<Dt<T, M, <Lx as SoftmaxLayout<M, Dim<DIM>>>::Out, R>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: SoftmaxLayout<M, Dim<DIM>>,
    {
        const { assert!(DIM < R, "`softmax(Dim::<DIM>)`: DIM must be a dim of the tensor (DIM < R)") };
        Dt::from_op("softmax", || self.as_dtensor().softmax(DIM as isize))
    }

    /// Log-softmax along tensor dim `DIM`; the layouts of [`softmax`](Dt::softmax).
    #[track_caller]
    pub fn log_softmax<const DIM: usize, Lx>(
        &self,
        _dim: Dim<DIM>,
    ) -> Result<Dt<T, M, <Lx as SoftmaxLayout<M, Dim<DIM>>>::Out, R>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: SoftmaxLayout<M, Dim<DIM>>,
    {
        const { assert!(DIM < R, "`log_softmax(Dim::<DIM>)`: DIM must be a dim of the tensor (DIM < R)") };
        Dt::from_op("log_softmax", || self.as_dtensor().log_softmax(DIM as isize))
    }

    /// Softmax along tensor dim `DIM` of a tensor that may be sharded on `DIM`: on each mesh
    /// dim that shards it, the runtime's two-pass rule all-reduces per-row statistics (a max,
    /// then a sum of exponentials: two all-reduces of `[.., 1]`-sized tensors, and one in the
    /// backward), as the name says. Keeps every `Shard`; a `Partial` layout does not compile.
    #[track_caller]
    pub fn softmax_across_shards<const DIM: usize, Lx>(
        &self,
        _dim: Dim<DIM>,
    ) -> Result<Dt<T, M, <Lx as UnaryLayout<M, kinds::Softmax>>::Out, R>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: UnaryLayout<M, kinds::Softmax>,
    {
        const { assert!(DIM < R, "`softmax_across_shards(Dim::<DIM>)`: DIM must be a dim of the tensor (DIM < R)") };
        Dt::from_op("softmax", || self.as_dtensor().softmax(DIM as isize))
    }

    /// Log-softmax along tensor dim `DIM`; the layouts and collectives of
    /// [`softmax_across_shards`](Dt::softmax_across_shards).
    #[track_caller]
    pub fn log_softmax_across_shards<const DIM: usize, Lx>(
        &self,
        _dim: Dim<DIM>,
    ) -> Result<Dt<T, M, <Lx as UnaryLayout<M, kinds::Softmax>>::Out, R>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: UnaryLayout<M, kinds::Softmax>,
    {
        const { assert!(DIM < R, "`log_softmax_across_shards(Dim::<DIM>)`: DIM must be a dim of the tensor (DIM < R)") };
        Dt::from_op("log_softmax", || self.as_dtensor().log_softmax(DIM as isize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typed::dims::{dp, tp};

    #[allow(clippy::extra_unused_type_parameters)] // the bound is what is tested
    fn typed<L: UnaryLayout<(dp, tp), K>, K>() -> bool {
        true
    }

    #[test]
    fn rules_follow_the_runtime_table() {
        assert!(typed::<(Shard<0>, Partial<Sum>), kinds::Neg>());
        assert!(typed::<(Partial<Avg>, Replicate), kinds::MulScalar>());
        assert!(typed::<(Partial<Max>, Shard<1>), kinds::AddScalar>());
        assert!(typed::<(Shard<1>, Replicate), kinds::Exp>());
        assert!(keeps_partial(UnaryKind::Neg, ReduceOp::Sum));
        assert!(!keeps_partial(UnaryKind::Exp, ReduceOp::Sum));
        assert!(!keeps_partial(UnaryKind::AddScalar, ReduceOp::Sum));
    }
}
