//! Typed `matmul` `[.., m, k] @ [k, n]` (the rule of `ops::matmul`), per mesh dim:
//! `R×R→R`, `S(m or batch)×R→S(same)`, `R×S(n)→S(n)`, `S(k)×S(k)→Partial<Sum>`,
//! `P×R→P`, `R×P→P` for `P` = `Partial<Sum>` or `Partial<Avg>`. Anything else needs a
//! redistribute first. The left operand has rank `LR` (2 to 4), the right one is a matrix.
//!
//! Typed `matmul_batched` `[.., m, k] @ [.., k, n]` (both operands batched, same rank 3 or 4:
//! attention scores and values): the same rules with `n` and `k` at the right operand's own
//! dims, and a batch dim shards through only when both sides are `Shard` on it.

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
}
