//! Typed masking and selection (the rules of [`ops::mask`](crate::ops::mask)): comparisons
//! `eq_mask` … `ge_mask`, `where_`, `masked_fill`, `tril` / `triu`.
//!
//! Per mesh dim:
//! - comparisons of two tensors of the same rank and shape: `Replicate` with `Replicate` and
//!   `Shard<D>` with `Shard<D>` keep it; a `Partial` does not compile (a comparison is not
//!   linear, so the runtime would all-reduce it first — PyTorch's rule for non-linear
//!   element-wise ops);
//! - `where_` / `masked_fill`: the data (`self`, and `where_`'s `other` with `self`'s layout)
//!   follows the comparison rule; the mask is either sharded like the data (then it has the
//!   data's shape) or `Replicate` (a broadcast mask, e.g. a `[L, L]` causal mask against
//!   `[B, H, L, L]` scores, whose dim aligned with a sharded one must be missing or of size 1:
//!   sizes are not types, so this is checked at run time, before any communication);
//!   a `Partial` data or mask does not compile;
//! - `tril` / `triu` keep every `Shard` (the kernel reads the shard's global row and column
//!   offsets) and the Partials of the runtime's table ([`tri_keeps_partial`]).

use super::broadcast::check_broadcast;
use super::lift::{lift_binary, lift_unary};
use super::markers::{Avg, Max, Min, Never, Partial, Product, Replicate, Shard, Sum};
use super::redistribute::Verdict;
use super::same::SameLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::{Element, Scalar};
use crate::error::{Error, Result};
use crate::op::BinaryOp;
use crate::ops::mask::tri_keeps_partial;
use crate::placement::{Placement, ReduceOp};

/// A hidden, uninhabited impl of `$Rule` for `Shard` and `Replicate` (see `markers::Never`).
/// `Partial` gets none: it has no legal impl here, and a single hidden one would make rustc
/// infer the operand from it instead of reporting the rule.
macro_rules! never_rules {
    ($Rule:ident) => {
        #[diagnostic::do_not_recommend]
        impl<const D: usize, N> $Rule<Never, N> for Shard<D> {
            type Out = Replicate;
        }
        #[diagnostic::do_not_recommend]
        impl<N> $Rule<Never, N> for Replicate {
            type Out = Replicate;
        }
    };
}

/// The rule of a comparison (`eq_mask`, `lt_mask`, ...) on one mesh dim.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "comparison of `{Self}` with `{Rhs}` on mesh dim `{Name}` is not a legal layout: both sides need the same `Shard<D>` or `Replicate`",
    label = "no comparison rule for `{Self}` with `{Rhs}` on mesh dim `{Name}`",
    note = "a comparison is not linear: a `Partial` must be reduced first; call `.redistribute()` so both sides have the same `Shard<D>` or `Replicate` on mesh dim `{Name}`"
)]
pub trait CompareRule<Rhs, Name> {
    /// Placement of the mask on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_binary!(
    /// The comparison rule on every mesh dim of a layout.
    #[doc(hidden)]
    CompareLayout,
    CompareRule
);
never_rules!(CompareRule);
impl<N> CompareRule<Replicate, N> for Replicate {
    type Out = Replicate;
}
impl<N, const D: usize> CompareRule<Shard<D>, N> for Shard<D> {
    type Out = Shard<D>;
}

/// The rule of `where_` / `masked_fill` on one mesh dim: data `Self` with mask `Mask`.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`where_` / `masked_fill` of data `{Self}` with mask `{Mask}` on mesh dim `{Name}` is not a legal layout: the mask must be sharded like the data or `Replicate`, and neither may be Partial",
    label = "no masking rule for data `{Self}` with mask `{Mask}` on mesh dim `{Name}`",
    note = "masking is not linear: reduce a `Partial` first, and call `.redistribute()` so the mask is `Replicate` or the data's `Shard<D>` on mesh dim `{Name}`"
)]
pub trait MaskRule<Mask, Name> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_binary!(
    /// The masking rule on every mesh dim of a layout.
    #[doc(hidden)]
    MaskLayout,
    MaskRule
);
never_rules!(MaskRule);
impl<N> MaskRule<Replicate, N> for Replicate {
    type Out = Replicate;
}
impl<N, const D: usize> MaskRule<Shard<D>, N> for Shard<D> {
    type Out = Shard<D>;
}
impl<N, const D: usize> MaskRule<Replicate, N> for Shard<D> {
    type Out = Shard<D>;
}

/// Holds when `tril`/`triu` keep the Partial `From` (implemented for `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`tril` / `triu` of `{From}` on mesh dim `{Name}` is not a legal layout: only `Partial<Sum>` and `Partial<Avg>` are kept",
    label = "`{From}` on mesh dim `{Name}` must be reduced first: call `.redistribute()`",
    note = "redistribute mesh dim `{Name}` to `Replicate` or `Shard<D>` first"
)]
pub trait TriKeepsPartial<From, Name> {}
impl<From, Name> TriKeepsPartial<From, Name> for Verdict<true> {}

/// The rule of `tril` / `triu` on one mesh dim.
#[doc(hidden)]
pub trait TriRule<Name> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The `tril` / `triu` rule on every mesh dim of a layout.
    #[doc(hidden)]
    TriLayout,
    TriRule
);
impl<N> TriRule<N> for Replicate {
    type Out = Replicate;
}
impl<N, const D: usize> TriRule<N> for Shard<D> {
    type Out = Shard<D>;
}
/// `impl TriRule<N> for Partial<Op>`, legal where the runtime's table says so.
macro_rules! tri_partial_rules {
    ($($op:ident)*) => {$(
        impl<N> TriRule<N> for Partial<$op>
        where
            Verdict<{ tri_keeps_partial(ReduceOp::$op) }>: TriKeepsPartial<Partial<$op>, N>,
        {
            type Out = Partial<$op>;
        }
    )*};
}
tri_partial_rules!(Sum Avg Min Max Product);

/// The run-time half of the comparison rule: both sides have one shape (a same-rank
/// broadcast would make the runtime gather the size-1 side).
#[track_caller]
fn check_same_shape(op: &str, what: &str, a: &[usize], b: &[usize]) -> Result<()> {
    if a != b {
        return Err(Error::TypedMismatch {
            what: format!("shape of {what} of typed `{op}` (at {})", std::panic::Location::caller()),
            expected: format!("{a:?} (the same shape)"),
            actual: format!("{b:?}"),
        });
    }
    Ok(())
}

/// The run-time half of the masking rule: a mask sharded on some mesh dim has the data's
/// shape; a `Replicate` mask broadcasts to the data and lacks (or has size 1 in) the dims the
/// data is sharded on there.
#[track_caller]
pub(super) fn check_mask(
    op: &str,
    data: &[usize],
    data_pl: &[Placement],
    mask: &[usize],
    mask_pl: &[Placement],
) -> Result<()> {
    if mask_pl.iter().any(|p| p.is_shard()) {
        check_same_shape(op, "the sharded mask", data, mask)?;
    }
    // Only the mesh dims where the mask is Replicate and the data sharded constrain sizes.
    let pl: Vec<Placement> =
        data_pl.iter().zip(mask_pl).map(|(d, m)| if m.is_shard() { Placement::Replicate } else { *d }).collect();
    check_broadcast(op, data, &pl, mask)
}

/// The comparison methods: each checks the shapes, then wraps the dynamic op.
macro_rules! compare_methods {
    ($($(#[$doc:meta])* $name:ident;)+) => {
        impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {$(
            $(#[$doc])*
            #[track_caller]
            pub fn $name<L2, Lx>(&self, other: &Dt<T, M, L2, R>) -> Result<Dt<T, M, <Lx as CompareLayout<L2, M>>::Out, R>>
            where
                L: SameLayout<Lx>,
                Lx: CompareLayout<L2, M>,
                L2: TypedLayout<M>,
            {
                check_same_shape(stringify!($name), "the right operand", self.shape(), other.shape())?;
                Dt::from_op(stringify!($name), || self.as_dtensor().$name(other.as_dtensor()))
            }
        )+}
    };
}

compare_methods! {
    /// 1 where `self == other` (same shape), else 0; no gradient. See [`CompareRule`].
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dt, Shard};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let a: Dt<f32, (tp,), (Shard<0>,), 1> = Dt::distribute(&ndarray::arr1(&[1.0, 2.0, 3.0]).into_dyn(), &mesh)?;
    ///     let b: Dt<f32, (tp,), (Shard<0>,), 1> = Dt::distribute(&ndarray::arr1(&[1.0, 0.0, 3.0]).into_dyn(), &mesh)?;
    ///     let m: Dt<f32, (tp,), (Shard<0>,), 1> = a.eq_mask(&b)?;
    ///     m.full_tensor()
    /// })
    /// .unwrap();
    /// assert_eq!(out[0].as_slice().unwrap(), &[1.0, 0.0, 1.0]);
    /// ```
    eq_mask;
    /// 1 where `self != other` (same shape), else 0; the layouts of [`eq_mask`](Dt::eq_mask).
    ne_mask;
    /// 1 where `self < other` (same shape), else 0; the layouts of [`eq_mask`](Dt::eq_mask).
    lt_mask;
    /// 1 where `self <= other` (same shape), else 0; the layouts of [`eq_mask`](Dt::eq_mask).
    le_mask;
    /// 1 where `self > other` (same shape), else 0; the layouts of [`eq_mask`](Dt::eq_mask).
    gt_mask;
    /// 1 where `self >= other` (same shape), else 0; the layouts of [`eq_mask`](Dt::eq_mask).
    ge_mask;
}

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// The comparison `op` (`Eq`, `Ne`, `Lt`, `Le`, `Gt`, `Ge`) of `self` and `other` (same
    /// shape) as a `u8` byte mask, 1 where it holds; the layouts of [`eq_mask`](Dt::eq_mask).
    /// Any element type (integers compare exactly); no gradient.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dt, Shard};
    /// use dtensor_runtime::op::BinaryOp;
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let a: Dt<i64, (tp,), (Shard<0>,), 1> = Dt::distribute(&ndarray::arr1(&[1, 5, 3]).into_dyn(), &mesh)?;
    ///     let b: Dt<i64, (tp,), (Shard<0>,), 1> = Dt::distribute(&ndarray::arr1(&[2, 5, 1]).into_dyn(), &mesh)?;
    ///     let m: Dt<u8, (tp,), (Shard<0>,), 1> = a.compare_mask(BinaryOp::Le, &b)?;
    ///     m.full_tensor()
    /// })
    /// .unwrap();
    /// assert_eq!(out[0].as_slice().unwrap(), &[1, 1, 0]);
    /// ```
    #[track_caller]
    pub fn compare_mask<L2, Lx>(
        &self,
        op: BinaryOp,
        other: &Dt<T, M, L2, R>,
    ) -> Result<Dt<u8, M, <Lx as CompareLayout<L2, M>>::Out, R>>
    where
        L: SameLayout<Lx>,
        Lx: CompareLayout<L2, M>,
        L2: TypedLayout<M>,
    {
        check_same_shape("compare_mask", "the right operand", self.shape(), other.shape())?;
        Dt::from_op("compare_mask", || self.as_dtensor().compare_mask(op, other.as_dtensor()))
    }

    /// PyTorch `self.where(condition, other)`: `self` where `condition` is non-zero, else
    /// `other` (which has `self`'s layout and shape); any element type, and the condition of
    /// any element type too (a `u8` byte mask, or `T`). The condition is sharded like `self`
    /// (same shape) or `Replicate` and broadcast (see the module); a `Partial` does not
    /// compile.
    #[track_caller]
    pub fn where_<C: Scalar, Lc, Lo, Lx, const RC: usize>(
        &self,
        condition: &Dt<C, M, Lc, RC>,
        other: &Dt<T, M, Lo, R>,
    ) -> Result<Dt<T, M, <Lx as MaskLayout<Lc, M>>::Out, R>>
    where
        L: SameLayout<Lx>,
        Lx: MaskLayout<Lc, M>,
        Lc: TypedLayout<M>,
        Lo: TypedLayout<M> + SameLayout<L>,
    {
        const { assert!(RC <= R, "`where_`: the condition must not have more dims than `self`") };
        check_same_shape("where_", "`other`", self.shape(), other.shape())?;
        check_mask("where_", self.shape(), self.placements(), condition.shape(), condition.placements())?;
        Dt::from_op("where_", || self.as_dtensor().where_(condition.as_dtensor(), other.as_dtensor()))
    }

    /// `value` where `mask` is non-zero, else `self` (PyTorch `masked_fill`); `value` may be
    /// infinite. Any element type, and a mask of any element type. The mask is sharded like `self` (same shape) or `Replicate` and broadcast
    /// (see the module); a `Partial` does not compile.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dt, Replicate, Shard};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let x: Dt<f32, (tp,), (Shard<0>,), 2> = Dt::distribute(&ndarray::ArrayD::zeros(vec![4, 2]), &mesh)?;
    ///     let m: Dt<f32, (tp,), (Replicate,), 2> = Dt::distribute(&ndarray::arr2(&[[0.0, 1.0]]).into_dyn(), &mesh)?;
    ///     let y: Dt<f32, (tp,), (Shard<0>,), 2> = x.masked_fill(&m, f32::NEG_INFINITY)?;
    ///     y.full_tensor()
    /// })
    /// .unwrap();
    /// assert!(out[0].index_axis(ndarray::Axis(1), 1).iter().all(|v| v.is_infinite()));
    /// ```
    #[track_caller]
    pub fn masked_fill<C: Scalar, Lm, Lx, const RM: usize>(
        &self,
        mask: &Dt<C, M, Lm, RM>,
        value: T,
    ) -> Result<Dt<T, M, <Lx as MaskLayout<Lm, M>>::Out, R>>
    where
        L: SameLayout<Lx>,
        Lx: MaskLayout<Lm, M>,
        Lm: TypedLayout<M>,
    {
        const { assert!(RM <= R, "`masked_fill`: the mask must not have more dims than `self`") };
        check_mask("masked_fill", self.shape(), self.placements(), mask.shape(), mask.placements())?;
        Dt::from_op("masked_fill", || self.as_dtensor().masked_fill(mask.as_dtensor(), value))
    }
}

/// Triangles: float tensors only (`T: Element` on each method, so that an integer tensor gets
/// the element type's message rather than a missing method).
impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// The lower triangle of the last two dims (PyTorch `tril(diagonal)`); keeps every
    /// `Shard` and `Partial<Sum|Avg>` (see the module).
    #[track_caller]
    pub fn tril<Lx>(&self, diagonal: i64) -> Result<Dt<T, M, <Lx as TriLayout<M>>::Out, R>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: TriLayout<M>,
    {
        const { assert!(R >= 2, "`tril`: needs a tensor of at least 2 dims") };
        Dt::from_op("tril", || self.as_dtensor().tril(diagonal))
    }

    /// The upper triangle of the last two dims (PyTorch `triu(diagonal)`); the layouts of
    /// [`tril`](Dt::tril).
    #[track_caller]
    pub fn triu<Lx>(&self, diagonal: i64) -> Result<Dt<T, M, <Lx as TriLayout<M>>::Out, R>>
    where
        T: Element,
        L: SameLayout<Lx>,
        Lx: TriLayout<M>,
    {
        const { assert!(R >= 2, "`triu`: needs a tensor of at least 2 dims") };
        Dt::from_op("triu", || self.as_dtensor().triu(diagonal))
    }
}
