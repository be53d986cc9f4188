//! Typed `matmul` `[.., m, k] @ [k, n]` (the rule of `ops::matmul`), per mesh dim:
//! `R×R→R`, `S(m or batch)×R→S(same)`, `R×S(n)→S(n)`, `S(k)×S(k)→Partial<Sum>`,
//! `P×R→P`, `R×P→P` for `P` = `Partial<Sum>` or `Partial<Avg>`. Anything else needs a
//! redistribute first. The left operand has rank `LR` (2 to 4), the right one is a matrix.
//!
//! Typed `matmul_batched` `[.., m, k] @ [.., k, n]` (both operands batched, same rank 3 or 4:
//! attention scores and values): the same rules with `n` and `k` at the right operand's own
//! dims, and a batch dim shards through only when both sides are `Shard` on it.
//!
//! Typed `linear` `[.., m, in] · [out, in]ᵀ` (PyTorch `F.linear`, the orientation of Hugging
//! Face `nn.Linear` weights), per mesh dim (input × weight): `R×R→R`, `S(m or batch)×R→S`,
//! `R×S<0>→S(last)` (column-parallel: the weight's output rows), `S(last)×S<1>→Partial<Sum>`
//! (row-parallel: both sides' input features), `P×R→P`, `R×P→P`.

use super::lift::{lift_binary, never_binary};
use super::markers::{Avg, Partial, Replicate, Shard, Sum};
use super::{Dt, MeshDims, PlacementMarker, TypedLayout};
use crate::element::{Element, Scalar};
use crate::error::Result;

/// Context of the matmul rule: the rank of the left operand.
pub enum Rank<const LR: usize> {}

/// Context of the batched matmul rule: the rank of both operands.
pub enum Batched<const R: usize> {}

/// The matmul rule on one mesh dim: `Self @ Rhs` on mesh dim `Name` (hidden from the docs:
/// its impls would fill every marker's page; [`MatmulLayout`] is the bound users meet).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "matmul of `{Self}` × `{Rhs}` on mesh dim `{Name}` is not a legal layout: redistribute one side first",
    label = "no matmul sharding rule for `{Self}` × `{Rhs}` on mesh dim `{Name}`",
    note = "legal per mesh dim ([.., m, k] @ [k, n]): R×R→R, S(m or batch)×R→S, R×S(n)→S(n), S(k)×S(k)→Partial<Sum>, P×R→P, R×P→P (P = Partial<Sum|Avg>); `matmul_batched` ([.., m, k] @ [.., k, n]): batch dims S(b)×S(b)→S(b)"
)]
pub trait MatmulRule<Rhs, Name, Ctx> {
    /// Placement of the product on this mesh dim.
    type Out: PlacementMarker;
}

lift_binary!(
    /// The matmul rule on every mesh dim of a layout.
    MatmulLayout,
    MatmulRule,
    ctx
);
never_binary!(MatmulRule, Ctx);

/// Matmul is linear in each operand: a partial sum / average times a replicated matrix stays one.
macro_rules! linear_partial {
    ($($ctx:ident),+) => {$(
        impl<N, const LR: usize> MatmulRule<Replicate, N, $ctx<LR>> for Replicate {
            type Out = Replicate;
        }
        linear_partial!(@op $ctx; Sum Avg);
    )+};
    (@op $ctx:ident; $($Op:ident)+) => {$(
        impl<N, const LR: usize> MatmulRule<Replicate, N, $ctx<LR>> for Partial<$Op> {
            type Out = Partial<$Op>;
        }
        impl<N, const LR: usize> MatmulRule<Partial<$Op>, N, $ctx<LR>> for Replicate {
            type Out = Partial<$Op>;
        }
    )+};
}
linear_partial!(Rank, Batched);

/// Per left rank: the dims that shard through (batch dims and m), n's dim of the output,
/// and k's dim of the left operand.
macro_rules! rank_rules {
    ($($lr:literal: [$($through:literal),+], n = $n:literal, k = $k:literal;)+) => {$(
        $(impl<N> MatmulRule<Replicate, N, Rank<$lr>> for Shard<$through> {
            type Out = Shard<$through>;
        })+
        impl<N> MatmulRule<Shard<1>, N, Rank<$lr>> for Replicate {
            type Out = Shard<$n>;
        }
        impl<N> MatmulRule<Shard<0>, N, Rank<$lr>> for Shard<$k> {
            type Out = Partial<Sum>;
        }
    )+};
}

rank_rules! {
    2: [0], n = 1, k = 1;
    3: [0, 1], n = 2, k = 2;
    4: [0, 1, 2], n = 3, k = 3;
}

/// Per rank of both batched operands: the batch dims (sharded alike on both sides), m, and
/// the k and n dims of the right operand (the left operand's k is its last dim, `R - 1`).
macro_rules! batched_rules {
    ($($r:literal: [$($b:literal),+], m = $m:literal, bk = $bk:literal, n = $n:literal;)+) => {$(
        $(impl<N> MatmulRule<Shard<$b>, N, Batched<$r>> for Shard<$b> {
            type Out = Shard<$b>;
        })+
        impl<N> MatmulRule<Replicate, N, Batched<$r>> for Shard<$m> {
            type Out = Shard<$m>;
        }
        impl<N> MatmulRule<Shard<$n>, N, Batched<$r>> for Replicate {
            type Out = Shard<$n>;
        }
        impl<N> MatmulRule<Shard<$bk>, N, Batched<$r>> for Shard<$n> {
            type Out = Partial<Sum>;
        }
    )+};
}

batched_rules! {
    3: [0], m = 1, bk = 1, n = 2;
    4: [0, 1], m = 2, bk = 2, n = 3;
}

/// Context of the linear rule: the rank of the input.
pub enum LinearRank<const LR: usize> {}

/// The `linear` rule on one mesh dim: input `Self` times the transpose of weight `W`
/// (`[out, in]`) on mesh dim `Name` ([`LinearLayout`] is the bound users meet).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`linear` of input `{Self}` with weight `{W}` ([out, in]) on mesh dim `{Name}` is not a legal layout: redistribute one side first",
    label = "no linear sharding rule for input `{Self}` with weight `{W}` on mesh dim `{Name}`",
    note = "legal per mesh dim (input [.., in], weight [out, in]): R×R→R, S(m or batch)×R→S, R×S<0>→S(last) (column-parallel), S(last)×S<1>→Partial<Sum> (row-parallel), P×R→P, R×P→P (P = Partial<Sum|Avg>)"
)]
pub trait LinearRule<W, Name, Ctx> {
    /// Placement of the product on this mesh dim.
    type Out: PlacementMarker;
}

lift_binary!(
    /// The linear rule on every mesh dim of a layout.
    LinearLayout,
    LinearRule,
    ctx
);
never_binary!(LinearRule, Ctx);

impl<N, const LR: usize> LinearRule<Replicate, N, LinearRank<LR>> for Replicate {
    type Out = Replicate;
}
/// `linear` is linear in each operand, as matmul.
macro_rules! linear_rule_partial {
    ($($Op:ident)+) => {$(
        impl<N, const LR: usize> LinearRule<Replicate, N, LinearRank<LR>> for Partial<$Op> {
            type Out = Partial<$Op>;
        }
        impl<N, const LR: usize> LinearRule<Partial<$Op>, N, LinearRank<LR>> for Replicate {
            type Out = Partial<$Op>;
        }
    )+};
}
linear_rule_partial!(Sum Avg);

/// Per input rank: the dims that shard through (batch dims and m) and the last (feature) dim.
macro_rules! linear_rank_rules {
    ($($lr:literal: [$($through:literal),+], last = $last:literal;)+) => {$(
        $(impl<N> LinearRule<Replicate, N, LinearRank<$lr>> for Shard<$through> {
            type Out = Shard<$through>;
        })+
        impl<N> LinearRule<Shard<0>, N, LinearRank<$lr>> for Replicate {
            type Out = Shard<$last>;
        }
        impl<N> LinearRule<Shard<1>, N, LinearRank<$lr>> for Shard<$last> {
            type Out = Partial<Sum>;
        }
    )+};
}

linear_rank_rules! {
    2: [0], last = 1;
    3: [0, 1], last = 2;
    4: [0, 1, 2], last = 3;
}

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// `self @ rhs` for a matrix `rhs`; the output layout is computed per mesh dim by
    /// [`MatmulRule`], and an illegal pair does not compile.
    #[allow(clippy::type_complexity)] // the output layout is a projection, spelled out once
    #[track_caller]
    pub fn matmul<L2>(&self, rhs: &Dt<T, M, L2, 2>) -> Result<Dt<T, M, <L as MatmulLayout<L2, M, Rank<R>>>::Out, R>>
    where
        T: Element,
        L: MatmulLayout<L2, M, Rank<R>>,
        L2: TypedLayout<M>,
    {
        Dt::from_op("matmul", || self.as_dtensor().matmul(rhs.as_dtensor()))
    }

    /// `self @ rhs` for two batched operands of the same rank 3 or 4 (`[b, m, k] @ [b, k, n]`,
    /// `[b, h, s, d] @ [b, h, d, s]`): batch dims shard through when both sides are `Shard`
    /// on them; otherwise the rules of [`matmul`](Dt::matmul). An illegal pair does not
    /// compile.
    #[allow(clippy::type_complexity)] // the output layout is a projection, spelled out once
    #[track_caller]
    pub fn matmul_batched<L2>(
        &self,
        rhs: &Dt<T, M, L2, R>,
    ) -> Result<Dt<T, M, <L as MatmulLayout<L2, M, Batched<R>>>::Out, R>>
    where
        T: Element,
        L: MatmulLayout<L2, M, Batched<R>>,
        L2: TypedLayout<M>,
    {
        Dt::from_op("matmul", || self.as_dtensor().matmul(rhs.as_dtensor()))
    }

    /// `self · weightᵀ` for a weight `[out, in]` (PyTorch `F.linear` without bias, Hugging
    /// Face's `nn.Linear` orientation), read through its strides: no transposed copy. The
    /// output layout is computed per mesh dim by [`LinearRule`] (column-parallel: the weight
    /// `Shard<0>`; row-parallel: the input and the weight sharded on their input features); an
    /// illegal pair does not compile. A bias is a typed `add` after it.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dt, Partial, Replicate, Shard, Sum};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let x = ndarray::ArrayD::from_shape_fn(vec![3, 4], |i| (i[0] * 4 + i[1]) as f64);
    ///     let w = ndarray::ArrayD::from_shape_fn(vec![6, 4], |i| (i[0] as f64) - (i[1] as f64));
    ///     let x: Dt<f64, (tp,), (Replicate,), 2> = Dt::distribute(&x, &mesh)?;
    ///     let up: Dt<f64, (tp,), (Shard<0>,), 2> = Dt::distribute(&w, &mesh)?; // column-parallel
    ///     let h: Dt<f64, (tp,), (Shard<1>,), 2> = x.linear(&up)?; // [3, 6], features sharded
    ///     let down: Dt<f64, (tp,), (Shard<1>,), 2> = Dt::distribute(&w.t().to_owned(), &mesh)?;
    ///     let y: Dt<f64, (tp,), (Partial<Sum>,), 2> = h.linear(&down)?; // row-parallel
    ///     y.full_tensor()
    /// })
    /// .unwrap();
    /// assert_eq!(out[0].shape(), &[3, 4]);
    /// ```
    #[allow(clippy::type_complexity)] // the output layout is a projection, spelled out once
    #[track_caller]
    pub fn linear<L2>(
        &self,
        weight: &Dt<T, M, L2, 2>,
    ) -> Result<Dt<T, M, <L as LinearLayout<L2, M, LinearRank<R>>>::Out, R>>
    where
        T: Element,
        L: LinearLayout<L2, M, LinearRank<R>>,
        L2: TypedLayout<M>,
    {
        Dt::from_op("linear", || self.as_dtensor().matmul_t(weight.as_dtensor(), false, true))
    }
}
