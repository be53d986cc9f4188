//! Typed broadcasting `add_broadcast` / `sub_broadcast` / `mul_broadcast` / `div_broadcast`:
//! `self` (rank `R`) has the output's shape, `rhs` (rank `R2 ≤ R`) is the broadcast operand
//! (missing leading dims and size-1 dims, e.g. a `[1, n]` or `[n]` bias).
//!
//! Design: the types know ranks, not sizes. So the broadcast operand is the one that must be
//! `Replicate` (or a `Partial` the same-rank rule combines) wherever `self` is sharded — the
//! runtime's broadcasting rule ([`ops::pointwise`](crate::ops::pointwise)) for a dim the
//! operand broadcasts along, and no communication. Per mesh dim:
//! `Shard<D>` with `Replicate` → `Shard<D>`; any other pair follows the same-rank rule
//! ([`AddRule`] ...: `R+R`, `P±P`, `P±R`, `R±P`, `P*R`, `R*P`, `P/R`). A `Shard` of the
//! broadcast operand does not compile (use the same-rank `add` for two alike-sharded tensors).
//! What only sizes decide is checked at run time *before* the dynamic op runs, as an error
//! naming the op and the caller's line: where `self` is `Shard<D>`, the operand's dim aligned
//! with `D` must be missing or of size 1 (a full-size replicated operand would be sliced by
//! the runtime, a layout change the typed layer never makes silently), and `self` must have
//! the broadcast shape.

use super::lift::lift_binary;
use super::markers::{Partial, ReduceMarker, Replicate, Shard};
use super::pointwise::{AddRule, DivRule, MulRule, SubRule};
use super::{Dt, MeshDims, TypedLayout};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::ops::pointwise::broadcast_shape;
use crate::placement::Placement;

/// One marker per broadcasting op, for the rule's context.
pub mod kinds {
    /// `add_broadcast`.
    pub enum Add {}
    /// `sub_broadcast`.
    pub enum Sub {}
    /// `mul_broadcast`.
    pub enum Mul {}
    /// `div_broadcast`.
    pub enum Div {}
}

/// The broadcasting rule of op `Op` on one mesh dim: `Self` (full-size operand) with `Rhs`
/// (broadcast operand) on mesh dim `Name`.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "broadcast operand `{Rhs}` against `{Self}` on mesh dim `{Name}` is not a legal layout: the broadcast operand must be `Replicate` where the other side is sharded",
    label = "the broadcast operand is `{Rhs}` on mesh dim `{Name}` where the other side is `{Self}`",
    note = "call `.redistribute()` on the broadcast operand to `Replicate` on mesh dim `{Name}` first, or use the same-rank op for two tensors sharded alike"
)]
pub trait BroadcastRule<Rhs, Name, Op> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_binary!(
    /// The broadcasting rule on every mesh dim of a layout.
    #[doc(hidden)]
    BroadcastLayout,
    BroadcastRule,
    ctx
);
// `Shard` has one real impl per op: a hidden second one keeps rustc from inferring the
// operand from it (see `markers::Never`; `Replicate` and `Partial` get theirs through the
// same-rank rules).
#[diagnostic::do_not_recommend]
impl<N, Op, const D: usize> BroadcastRule<super::markers::Never, N, Op> for Shard<D> {
    type Out = Replicate;
}

/// `impl BroadcastRule<_, N, kinds::$k>`: a shard of `self` over a replicated operand stays;
/// `Replicate` and `Partial` on the left follow the same-rank rule `$Rule`.
macro_rules! broadcast_rules {
    ($($k:ident => $Rule:ident),*) => {$(
        impl<N, const D: usize> BroadcastRule<Replicate, N, kinds::$k> for Shard<D> {
            type Out = Shard<D>;
        }
        impl<N, B> BroadcastRule<B, N, kinds::$k> for Replicate
        where
            Replicate: $Rule<B, N>,
        {
            type Out = <Replicate as $Rule<B, N>>::Out;
        }
        impl<N, B, Op: ReduceMarker> BroadcastRule<B, N, kinds::$k> for Partial<Op>
        where
            Partial<Op>: $Rule<B, N>,
        {
            type Out = <Partial<Op> as $Rule<B, N>>::Out;
        }
    )*};
}
broadcast_rules!(Add => AddRule, Sub => SubRule, Mul => MulRule, Div => DivRule);

/// The run-time half of the rule (sizes are not types): `a` has the broadcast shape and, on
/// every mesh dim where `a` is `Shard(d)`, `b` lacks dim `d` or has size 1 there.
#[track_caller]
pub(super) fn check_broadcast(op: &str, a: &[usize], placements: &[Placement], b: &[usize]) -> Result<()> {
    let at = std::panic::Location::caller();
    let out = broadcast_shape(op, a, b)?;
    if out != a {
        return Err(Error::TypedMismatch {
            what: format!("shape of the full-size operand of typed `{op}` (at {at})"),
            expected: format!("{out:?} (the broadcast shape)"),
            actual: format!("{a:?}"),
        });
    }
    let off = a.len() - b.len();
    for (i, p) in placements.iter().enumerate() {
        if let Placement::Shard(d) = *p {
            let d = d as usize;
            if d >= off && b[d - off] != 1 {
                return Err(Error::TypedMismatch {
                    what: format!(
                        "broadcast operand of typed `{op}` (at {at}): its dim {} is not broadcast but the other side is Shard({d}) on mesh dim {i}",
                        d - off
                    ),
                    expected: "size 1 (or a missing dim), or call `.redistribute()` so both sides are sharded alike and use the same-rank op".into(),
                    actual: format!("shape {b:?}"),
                });
            }
        }
    }
    Ok(())
}

/// Typed broadcasting methods: each checks the sizes, then wraps the dynamic op.
macro_rules! broadcast_methods {
    ($($(#[$doc:meta])* $name:ident => $dynamic:ident, $k:ident;)+) => {
        impl<T: Element, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {$(
            $(#[$doc])*
            #[track_caller]
            pub fn $name<L2, const R2: usize>(
                &self,
                rhs: &Dt<T, M, L2, R2>,
            ) -> Result<Dt<T, M, <L as BroadcastLayout<L2, M, kinds::$k>>::Out, R>>
            where
                L: BroadcastLayout<L2, M, kinds::$k>,
                L2: TypedLayout<M>,
            {
                const { assert!(R2 <= R, "the broadcast operand (the argument) must not have more dims than `self`") };
                check_broadcast(stringify!($name), self.shape(), self.placements(), rhs.shape())?;
                Dt::from_op(stringify!($name), || self.as_dtensor().$dynamic(rhs.as_dtensor()))
            }
        )+}
    };
}

broadcast_methods! {
    /// `self + rhs`, `rhs` broadcast to `self`'s shape (a bias): see [`BroadcastRule`]'s
    /// module for the rule. No communication.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dt, Replicate, Shard};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let x: Dt<f32, (tp,), (Shard<0>,), 2> = Dt::distribute(&ndarray::ArrayD::zeros(vec![4, 3]), &mesh)?;
    ///     let bias: Dt<f32, (tp,), (Replicate,), 2> = Dt::distribute(&ndarray::ArrayD::ones(vec![1, 3]), &mesh)?;
    ///     let y: Dt<f32, (tp,), (Shard<0>,), 2> = x.add_broadcast(&bias)?;
    ///     y.full_tensor()
    /// })
    /// .unwrap();
    /// assert!(out[0].iter().all(|&v| v == 1.0));
    /// ```
    add_broadcast => add, Add;
    /// `self - rhs`, `rhs` broadcast to `self`'s shape; the layouts of
    /// [`add_broadcast`](Dt::add_broadcast).
    sub_broadcast => sub, Sub;
    /// `self * rhs`, `rhs` broadcast to `self`'s shape (a scale); `P*R`, `R*P` stay Partial.
    mul_broadcast => mul, Mul;
    /// `self / rhs`, `rhs` broadcast to `self`'s shape; `P/R` stays Partial.
    div_broadcast => div, Div;
}
