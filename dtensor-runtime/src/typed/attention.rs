//! Typed [`scaled_dot_product_attention`] (the rule of
//! [`ops::attention`](crate::ops::attention)), for q, k, v of one rank `R` (`[.., L, E]`).
//!
//! Per mesh dim, with k and v of one layout: all `Replicate` → `Replicate`; q, k, v sharded
//! alike on a batch or head dim (any dim before the last two) → the output sharded on it;
//! q sharded on its sequence dim (`R - 2`) with k and v `Replicate` → the output sharded on
//! the sequence dim (each rank attends its own queries to every key). Anything else —
//! a `Partial`, a shard of the feature dim, k and v sharded on the sequence dim — does not
//! compile: the runtime would redistribute first. On a legal layout the op issues no
//! collective. Which shards are kept is the runtime's rule ([`attention_keeps_shard`]); the
//! typed rules are generated from it.
//!
//! An additive `attn_mask` ([`scaled_dot_product_attention_masked`]) follows the output's
//! layout, as in the runtime: per mesh dim it is `Replicate` where the output is, and where the
//! output is `Shard<D>` it is either `Shard<D>` (then it has the scores' full shape
//! `[.., Lq, Lk]`) or `Replicate` and broadcast on `D` (size 1 or a missing dim, e.g. a
//! `[Lq, Lk]` mask with heads or batch sharded). Sizes are not types: they are checked before
//! the op runs, an error naming the caller's line. A `Partial` mask does not compile.

use super::lift::{lift_binary, never_binary};
use super::markers::{Never, Replicate, Shard};
use super::mask::check_mask;
use super::redistribute::Verdict;
use super::same::SameLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::Element;
use crate::error::Result;
use crate::ops::attention::attention_keeps_shard;

/// Context of the attention rule: the rank of q, k and v.
#[doc(hidden)]
pub enum Attn<const R: usize> {}

/// Holds when attention keeps q's shard `Q` with k, v `Kv` (implemented for `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`scaled_dot_product_attention` of q `{Q}` with k, v `{Kv}` on mesh dim `{Name}` is not a legal layout",
    label = "q `{Q}` with k, v `{Kv}` on mesh dim `{Name}` needs a redistribute first",
    note = "legal per mesh dim: q, k, v all `Replicate`; q, k, v on the same batch or head `Shard<D>` (D < R - 2); q on its sequence dim `Shard<R - 2>` with k, v `Replicate`"
)]
pub trait AttentionKeeps<Q, Kv, Name> {}
impl<Q, Kv, Name> AttentionKeeps<Q, Kv, Name> for Verdict<true> {}

/// The attention rule on one mesh dim: q `Self` with k and v `Kv`.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`scaled_dot_product_attention` of q `{Self}` with k, v `{Kv}` on mesh dim `{Name}` is not a legal layout: redistribute first",
    label = "no attention rule for q `{Self}` with k, v `{Kv}` on mesh dim `{Name}`",
    note = "legal per mesh dim: q, k, v all `Replicate`; q, k, v on the same batch or head `Shard<D>` (D < R - 2); q on its sequence dim `Shard<R - 2>` with k, v `Replicate`; never a `Partial`"
)]
pub trait AttentionRule<Kv, Name, Ctx> {
    /// Placement of the output on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_binary!(
    /// The attention rule on every mesh dim of a layout.
    #[doc(hidden)]
    AttentionLayout,
    AttentionRule,
    ctx
);
never_binary!(AttentionRule, Ctx);

impl<N, const R: usize> AttentionRule<Replicate, N, Attn<R>> for Replicate {
    type Out = Replicate;
}

/// `impl AttentionRule<_, N, Attn<r>> for Shard<d>` for every `d < r`, both k/v kinds.
macro_rules! shard_rules {
    (@d $r:literal; $($d:literal)*) => {$(
        impl<N> AttentionRule<Shard<$d>, N, Attn<$r>> for Shard<$d>
        where
            Verdict<{ attention_keeps_shard($d, $r, true) }>: AttentionKeeps<Shard<$d>, Shard<$d>, N>,
        {
            type Out = Shard<$d>;
        }
        impl<N> AttentionRule<Replicate, N, Attn<$r>> for Shard<$d>
        where
            Verdict<{ attention_keeps_shard($d, $r, false) }>: AttentionKeeps<Shard<$d>, Replicate, N>,
        {
            type Out = Shard<$d>;
        }
    )*};
    ($($r:literal: [$($d:literal)*];)*) => {$(
        shard_rules!(@d $r; $($d)*);
    )*};
}
shard_rules! {
    2: [0 1];
    3: [0 1 2];
    4: [0 1 2 3];
    5: [0 1 2 3 4];
}

/// The output layout of attention of q `Lq` over k, v `Lkv`, rank `R`.
pub type AttentionOut<Lq, Lkv, M, const R: usize> = <Lq as AttentionLayout<Lkv, M, Attn<R>>>::Out;

/// `softmax(q kᵀ · scale) v` of `q [.., Lq, E]`, `k [.., Lk, E]`, `v [.., Lk, Ev]`
/// (PyTorch `F.scaled_dot_product_attention` without `attn_mask`): `is_causal` hides keys
/// after each query; `scale` defaults to `1/√E`. `v` has `k`'s layout; see the module for
/// the legal layouts. No communication.
///
/// ```
/// use dtensor_runtime::typed::{attention::scaled_dot_product_attention, dims::tp, Dt, Shard};
/// let out = dtensor_runtime::run(2, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
///     // [batch, heads, seq, head_dim], heads sharded on tp (Megatron).
///     let g = ndarray::ArrayD::from_shape_fn(vec![1, 2, 3, 4], |ix| (ix[2] + ix[3]) as f64 / 4.0);
///     let q: Dt<f64, (tp,), (Shard<1>,), 4> = Dt::distribute(&g, &mesh)?;
///     let y: Dt<f64, (tp,), (Shard<1>,), 4> = scaled_dot_product_attention(&q, &q, &q, true, None)?;
///     y.full_tensor()
/// })
/// .unwrap();
/// assert_eq!(out[0].shape(), &[1, 2, 3, 4]);
/// ```
#[track_caller]
pub fn scaled_dot_product_attention<T, M, Lq, Lk, Lv, const R: usize>(
    q: &Dt<T, M, Lq, R>,
    k: &Dt<T, M, Lk, R>,
    v: &Dt<T, M, Lv, R>,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<Dt<T, M, AttentionOut<Lq, Lk, M, R>, R>>
where
    T: Element,
    M: MeshDims,
    Lq: AttentionLayout<Lk, M, Attn<R>>,
    Lk: TypedLayout<M>,
    Lv: TypedLayout<M> + SameLayout<Lk>,
{
    const { assert!(R >= 2, "`scaled_dot_product_attention`: q, k, v need at least 2 dims") };
    Dt::from_op("scaled_dot_product_attention", || {
        crate::ops::attention::scaled_dot_product_attention(
            q.as_dtensor(),
            k.as_dtensor(),
            v.as_dtensor(),
            None,
            is_causal,
            scale,
        )
    })
}

/// The `attn_mask` rule on one mesh dim: output `Self` with mask `Mask`.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`scaled_dot_product_attention` with an output `{Self}` and an `attn_mask` `{Mask}` on mesh dim `{Name}` is not a legal layout: call `.redistribute()` on the mask",
    label = "no attention-mask rule for output `{Self}` with mask `{Mask}` on mesh dim `{Name}`",
    note = "the mask follows the output: `Replicate` where the output is `Replicate`; where the output is `Shard<D>`, the mask is `Shard<D>` (full `[.., Lq, Lk]` shape) or `Replicate` (size 1 on D); never a `Partial`"
)]
pub trait AttnMaskRule<Mask, Name> {
    /// Placement of the output on this mesh dim (unchanged).
    type Out: super::PlacementMarker;
}

lift_binary!(
    /// The attention-mask rule on every mesh dim of a layout.
    #[doc(hidden)]
    AttnMaskLayout,
    AttnMaskRule
);
// No hidden impl for `Partial`: it has no legal one (see `markers::Never`).
#[diagnostic::do_not_recommend]
impl<const D: usize, N> AttnMaskRule<Never, N> for Shard<D> {
    type Out = Replicate;
}
#[diagnostic::do_not_recommend]
impl<N> AttnMaskRule<Never, N> for Replicate {
    type Out = Replicate;
}
impl<N> AttnMaskRule<Replicate, N> for Replicate {
    type Out = Replicate;
}
impl<N, const D: usize> AttnMaskRule<Shard<D>, N> for Shard<D> {
    type Out = Shard<D>;
}
impl<N, const D: usize> AttnMaskRule<Replicate, N> for Shard<D> {
    type Out = Shard<D>;
}

/// [`scaled_dot_product_attention`] with an additive `attn_mask` broadcasting to the scores
/// `[.., Lq, Lk]` (PyTorch's float mask; `-inf` hides a key): `softmax(q kᵀ · scale +
/// attn_mask) v`. q, k, v follow the attention rule; the mask follows the output (see the
/// module), its sizes checked before the op runs. No communication.
///
/// ```
/// use dtensor_runtime::typed::{attention::scaled_dot_product_attention_masked, dims::tp, Dt, Replicate, Shard};
/// let out = dtensor_runtime::run(2, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
///     let g = ndarray::ArrayD::from_shape_fn(vec![1, 2, 3, 4], |ix| (ix[2] + ix[3]) as f64 / 4.0);
///     let q: Dt<f64, (tp,), (Shard<1>,), 4> = Dt::distribute(&g, &mesh)?;
///     // A [Lq, Lk] mask hiding key 2 from every query, replicated (broadcast over the heads).
///     let m = ndarray::ArrayD::from_shape_fn(vec![3, 3], |ix| if ix[1] == 2 { f64::NEG_INFINITY } else { 0.0 });
///     let mask: Dt<f64, (tp,), (Replicate,), 2> = Dt::distribute(&m, &mesh)?;
///     let y: Dt<f64, (tp,), (Shard<1>,), 4> = scaled_dot_product_attention_masked(&q, &q, &q, &mask, None)?;
///     y.full_tensor()
/// })
/// .unwrap();
/// assert_eq!(out[0].shape(), &[1, 2, 3, 4]);
/// ```
#[allow(clippy::type_complexity)] // the output layout is a projection, spelled out once
#[track_caller]
pub fn scaled_dot_product_attention_masked<T, M, Lq, Lk, Lv, Lm, const R: usize, const RM: usize>(
    q: &Dt<T, M, Lq, R>,
    k: &Dt<T, M, Lk, R>,
    v: &Dt<T, M, Lv, R>,
    attn_mask: &Dt<T, M, Lm, RM>,
    scale: Option<f64>,
) -> Result<Dt<T, M, AttentionOut<Lq, Lk, M, R>, R>>
where
    T: Element,
    M: MeshDims,
    Lq: AttentionLayout<Lk, M, Attn<R>>,
    AttentionOut<Lq, Lk, M, R>: AttnMaskLayout<Lm, M>,
    Lk: TypedLayout<M>,
    Lv: TypedLayout<M> + SameLayout<Lk>,
    Lm: TypedLayout<M>,
{
    const { assert!(R >= 2, "`scaled_dot_product_attention_masked`: q, k, v need at least 2 dims") };
    const { assert!(RM <= R, "`scaled_dot_product_attention_masked`: the mask must not have more dims than q") };
    let mut scores = q.shape()[..R - 1].to_vec();
    scores.push(k.shape()[R - 2]);
    let out = <AttentionOut<Lq, Lk, M, R> as TypedLayout<M>>::placements();
    check_mask("scaled_dot_product_attention", &scores, &out, attn_mask.shape(), attn_mask.placements())?;
    Dt::from_op("scaled_dot_product_attention", || {
        crate::ops::attention::scaled_dot_product_attention(
            q.as_dtensor(),
            k.as_dtensor(),
            v.as_dtensor(),
            Some(attn_mask.as_dtensor()),
            false,
            scale,
        )
    })
}
