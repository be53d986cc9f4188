//! Typed rules for a user's op ([`CustomOp`]): an illegal layout is a compile error with the
//! user's own message, as for the library's ops.
//!
//! A user writes, in their crate, what the library writes for each of its ops:
//!
//! 1. the rule on one mesh dim, a trait with the message rustc shows when it does not hold
//!    (`#[diagnostic::on_unimplemented]`) and one impl per legal placement pair, whose `Out` is
//!    the output placement;
//! 2. [`typed_rule!`](crate::typed_rule) to lift it to whole layouts (one marker per mesh dim);
//! 3. an impl of [`TypedOp1`], [`TypedOp2`] or [`TypedOp3`] (one, two or three inputs) for the
//!    op, naming the input and output ranks and the lifted rule; then `x.apply_op(&op)`,
//!    `x.apply_op2(&op, &y)` or `x.apply_op3(&op, &y, &z)` compile exactly for the layouts the
//!    rule allows.
//!
//! The dynamic rules ([`CustomOp::rules`]) stay the ground truth: the typed call runs the
//! dynamic op, refuses any collective it would run (the typed rule promised none) and checks
//! that the output's placements are the type's. A typed rule that disagrees with the dynamic
//! rules is a run-time [`Error::TypedMismatch`](crate::Error::TypedMismatch) or
//! [`Error::TypedOpCollective`](crate::Error::TypedOpCollective) naming the op.
//!
//! ```
//! use dtensor_runtime::ndarray::ArrayD;
//! use dtensor_runtime::typed::{dims::tp, Dt, MeshDims, PlacementMarker, Replicate, Shard, TypedLayout, TypedOp1};
//! use dtensor_runtime::{CustomOp, DimRule, Element, Placement, Result};
//!
//! /// Normalizes each row to sum 1: rows may be split over ranks, columns may not.
//! #[derive(Clone)]
//! struct RowNormalize;
//!
//! impl<T: Element> CustomOp<T> for RowNormalize {
//!     fn name(&self) -> &'static str {
//!         "row_normalize"
//!     }
//!     fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
//!         Ok(inputs[0].to_vec())
//!     }
//!     fn rules(&self, _: &[&[usize]]) -> Vec<DimRule> {
//!         let r = Placement::Replicate;
//!         vec![DimRule::new(&[r], r), DimRule::new(&[Placement::Shard(0)], Placement::Shard(0))]
//!     }
//!     fn forward(&self, inputs: &[&ArrayD<T>]) -> Result<ArrayD<T>> {
//!         let mut x = inputs[0].clone();
//!         for mut row in x.rows_mut() {
//!             let s = row.sum();
//!             row.mapv_inplace(|v| v / s);
//!         }
//!         Ok(x)
//!     }
//! }
//!
//! /// 1. The rule on one mesh dim, with the message users see.
//! #[diagnostic::on_unimplemented(
//!     message = "row_normalize reads whole rows: `{Self}` on mesh dim `{Name}` splits them",
//!     label = "redistribute to `Shard<0>` or `Replicate` first"
//! )]
//! pub trait RowNormalizeRule<Name> {
//!     type Out: PlacementMarker;
//! }
//! impl<N> RowNormalizeRule<N> for Replicate {
//!     type Out = Replicate;
//! }
//! impl<N> RowNormalizeRule<N> for Shard<0> {
//!     type Out = Shard<0>;
//! }
//! // 2. Lifted to layouts.
//! dtensor_runtime::typed_rule!(unary RowNormalizeLayout = RowNormalizeRule);
//! // 3. The op's typed rule: rank 2 in, rank 2 out.
//! impl<T: Element, M: MeshDims, L: RowNormalizeLayout<M>> TypedOp1<T, M, L, 2, 2> for RowNormalize {
//!     type Out = <L as RowNormalizeLayout<M>>::Out;
//! }
//!
//! let rows = dtensor_runtime::run(2, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
//!     let g = ArrayD::from_shape_fn(vec![3, 2], |i| (i[0] + i[1] + 1) as f64);
//!     let x: Dt<f64, (tp,), (Shard<0>,), 2> = Dt::distribute(&g, &mesh)?;
//!     let y: Dt<f64, (tp,), (Shard<0>,), 2> = x.apply_op(&RowNormalize)?;
//!     // `x.redistribute::<(Shard<1>,)>()?.apply_op(&RowNormalize)` would not compile:
//!     // "row_normalize reads whole rows: `Shard<1>` on mesh dim `tp` splits them"
//!     y.full_tensor()
//! })
//! .unwrap();
//! assert_eq!(rows[0][[1, 0]], 2.0 / 5.0);
//! ```

use super::{Dt, MeshDims, TypedLayout};
use crate::element::Element;
use crate::error::Result;
use crate::ops::custom::{apply_op, CustomOp};

/// The typed rule of a user's op of one input laid out `L` on the mesh `M`, of rank `R`,
/// giving an output of rank `RO` laid out `Out`. Implemented by the user for the layouts the
/// op allows (usually: every `L` that satisfies a rule lifted by
/// [`typed_rule!`](crate::typed_rule)); see the [module docs](self).
pub trait TypedOp1<T: Element, M: MeshDims, L: TypedLayout<M>, const R: usize, const RO: usize>: CustomOp<T> {
    /// The output layout.
    type Out: TypedLayout<M>;
}

/// The typed rule of a user's op of two inputs (laid out `L1`, `L2`, of ranks `R1`, `R2`),
/// giving an output of rank `RO` laid out `Out`; see [`TypedOp1`].
pub trait TypedOp2<
    T: Element,
    M: MeshDims,
    L1: TypedLayout<M>,
    L2: TypedLayout<M>,
    const R1: usize,
    const R2: usize,
    const RO: usize,
>: CustomOp<T>
{
    /// The output layout.
    type Out: TypedLayout<M>;
}

/// The typed rule of a user's op of three inputs (laid out `L1`, `L2`, `L3`, of ranks `R1`,
/// `R2`, `R3`), giving an output of rank `RO` laid out `Out`; see [`TypedOp1`].
pub trait TypedOp3<
    T: Element,
    M: MeshDims,
    L1: TypedLayout<M>,
    L2: TypedLayout<M>,
    L3: TypedLayout<M>,
    const R1: usize,
    const R2: usize,
    const R3: usize,
    const RO: usize,
>: CustomOp<T>
{
    /// The output layout.
    type Out: TypedLayout<M>;
}

/// `typed_rule!(unary Layout = Rule)` / `typed_rule!(binary Layout = Rule)` lifts a user's
/// rule on one mesh dim to whole layouts, as the library lifts its own ops' rules.
///
/// `Rule` is the user's trait: `trait Rule<Name> { type Out: PlacementMarker; }` (one input)
/// or `trait Rule<Rhs, Name> { type Out: PlacementMarker; }` (two inputs), implemented for the
/// legal marker pairs, or `trait Rule<B, C, Name>` (three inputs, `typed_rule!(ternary Layout =
/// Rule)`, which defines `Layout<B, C, M>`). With `, ctx` after the rule, it takes one more parameter, a context
/// type (e.g. [`Rank<R>`](crate::typed::Rank), for rules that depend on the tensor rank):
/// `trait Rule<Rhs, Name, Ctx>`. The macro defines the layout trait `Layout<Rhs, M>` (binary),
/// `Layout<M>` (unary), with one more `Ctx` parameter with `, ctx`, whose `Out` is the output
/// layout; a layout that breaks the rule on some mesh dim fails with the rule's message
/// naming that dim. See [`typed::custom`](crate::typed::custom).
#[macro_export]
macro_rules! typed_rule {
    ($(#[$doc:meta])* unary $Layout:ident = $Rule:ident) => {
        $crate::__lift_unary!($(#[$doc])* $Layout, $Rule);
    };
    ($(#[$doc:meta])* unary $Layout:ident = $Rule:ident, ctx) => {
        $crate::__lift_unary!($(#[$doc])* $Layout, $Rule, ctx);
    };
    ($(#[$doc:meta])* binary $Layout:ident = $Rule:ident) => {
        $crate::__lift_binary!($(#[$doc])* $Layout, $Rule);
        $crate::__never_binary!($Rule);
    };
    ($(#[$doc:meta])* ternary $Layout:ident = $Rule:ident) => {
        $crate::__lift_ternary!($(#[$doc])* $Layout, $Rule);
    };
    ($(#[$doc:meta])* ternary $Layout:ident = $Rule:ident, ctx) => {
        $crate::__lift_ternary!($(#[$doc])* $Layout, $Rule, ctx);
    };
    ($(#[$doc:meta])* binary $Layout:ident = $Rule:ident, ctx) => {
        $crate::__lift_binary!($(#[$doc])* $Layout, $Rule, ctx);
        $crate::__never_binary!($Rule, Ctx);
    };
}

impl<T: Element, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Runs the user's op `op` on this tensor (see [`apply_op`]); its
    /// [`TypedOp1`] rule gives the output layout and rank, and a layout it does not allow does
    /// not compile.
    #[track_caller]
    pub fn apply_op<O, const RO: usize>(&self, op: &O) -> Result<Dt<T, M, O::Out, RO>>
    where
        O: TypedOp1<T, M, L, R, RO>,
    {
        Dt::from_op(op.name(), || apply_op(op, &[self.as_dtensor()]))
    }

    /// Runs the user's op `op` on this tensor and `rhs`; its [`TypedOp2`] rule gives the
    /// output layout and rank, and a pair of layouts it does not allow does not compile.
    #[track_caller]
    pub fn apply_op2<O, L2, const R2: usize, const RO: usize>(
        &self,
        op: &O,
        rhs: &Dt<T, M, L2, R2>,
    ) -> Result<Dt<T, M, O::Out, RO>>
    where
        O: TypedOp2<T, M, L, L2, R, R2, RO>,
        L2: TypedLayout<M>,
    {
        Dt::from_op(op.name(), || apply_op(op, &[self.as_dtensor(), rhs.as_dtensor()]))
    }

    /// Runs the user's op `op` on this tensor, `b` and `c`; its [`TypedOp3`] rule gives the
    /// output layout and rank, and layouts it does not allow do not compile.
    #[track_caller]
    #[allow(clippy::type_complexity)] // the three operands' layouts and ranks
    pub fn apply_op3<O, L2, L3, const R2: usize, const R3: usize, const RO: usize>(
        &self,
        op: &O,
        b: &Dt<T, M, L2, R2>,
        c: &Dt<T, M, L3, R3>,
    ) -> Result<Dt<T, M, O::Out, RO>>
    where
        O: TypedOp3<T, M, L, L2, L3, R, R2, R3, RO>,
        L2: TypedLayout<M>,
        L3: TypedLayout<M>,
    {
        Dt::from_op(op.name(), || apply_op(op, &[self.as_dtensor(), b.as_dtensor(), c.as_dtensor()]))
    }
}
