//! Typed `embedding` (the rule of [`ops::embedding`](crate::ops::embedding)): a table
//! `[V, D]` looked up at ids of rank `Q` gives `[.., D]` of rank `Q + 1`.
//!
//! Per mesh dim (table, ids → output): `Replicate`, `Replicate` → `Replicate`;
//! `Replicate`, `Shard<d>` → `Shard<d>` (the ids' layout passes); `Shard<1>`, `Replicate` →
//! `Shard<Q>` (the embedding dim, the output's last); `Shard<0>`, `Replicate` →
//! `Partial<Sum>` (vocab-parallel: ids outside this rank's rows give zeros);
//! `Partial<Sum|Avg>`, `Replicate` → the same Partial (the lookup is linear in the table).
//! Anything else (a sharded table with sharded ids, a `Partial` id) does not compile: the
//! runtime would redistribute first. No communication; the typed rules are the runtime's
//! strategy list, and the tests compare the two on every combination.

use super::lift::{lift_binary, never_binary};
use super::markers::{Avg, Partial, Replicate, Shard, Sum};
use super::{Dt, MeshDims, TypedLayout};
use crate::element::{Element, IndexElement};
use crate::error::Result;

/// Context of the embedding rule: the rank of the ids.
#[doc(hidden)]
pub enum Ids<const Q: usize> {}

/// The embedding rule on one mesh dim: table `Self` at ids `I`.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`embedding` of a `{Self}` table at `{I}` ids on mesh dim `{Name}` is not a legal layout: redistribute first",
    label = "no embedding rule for table `{Self}` with ids `{I}` on mesh dim `{Name}`",
    note = "legal per mesh dim (table, ids): (Replicate, Replicate), (Replicate, Shard<d>), (Shard<1>, Replicate) → the last dim, (Shard<0>, Replicate) → Partial<Sum> (vocab-parallel), (Partial<Sum|Avg>, Replicate)"
)]
pub trait EmbeddingRule<I, Name, Ctx> {
    /// Placement of the output on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_binary!(
    /// The embedding rule on every mesh dim of a layout.
    #[doc(hidden)]
    EmbeddingLayout,
    EmbeddingRule,
    ctx
);
never_binary!(EmbeddingRule, Ctx);

impl<N, const Q: usize> EmbeddingRule<Replicate, N, Ids<Q>> for Replicate {
    type Out = Replicate;
}
// `D < Q` holds: the ids' own type checks it.
impl<N, const D: usize, const Q: usize> EmbeddingRule<Shard<D>, N, Ids<Q>> for Replicate {
    type Out = Shard<D>;
}
impl<N, const Q: usize> EmbeddingRule<Replicate, N, Ids<Q>> for Shard<1> {
    type Out = Shard<Q>;
}
impl<N, const Q: usize> EmbeddingRule<Replicate, N, Ids<Q>> for Shard<0> {
    type Out = Partial<Sum>;
}
impl<N, const Q: usize> EmbeddingRule<Replicate, N, Ids<Q>> for Partial<Sum> {
    type Out = Partial<Sum>;
}
impl<N, const Q: usize> EmbeddingRule<Replicate, N, Ids<Q>> for Partial<Avg> {
    type Out = Partial<Avg>;
}

/// The output layout of a lookup in a `Lw` table at `Li` ids of rank `Q`.
pub type EmbeddingOut<Lw, Li, M, const Q: usize> = <Lw as EmbeddingLayout<Li, M, Ids<Q>>>::Out;

impl<T: Element, M: MeshDims, L: TypedLayout<M>> Dt<T, M, L, 2> {
    /// Looks up rows of this table `[V, D]` at `ids` (integers, or whole floats, in `[0, V)`;
    /// read as `i64` whatever `T` is, so a bf16 table serves every id), giving
    /// `ids.shape + [D]`; the output rank `RO` is `Q + 1` (checked at `cargo build`; name it
    /// in the result's type). See the module for the layouts.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dt, Partial, Replicate, Shard, Sum};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let table = ndarray::ArrayD::from_shape_fn(vec![5, 3], |ix| (3 * ix[0] + ix[1]) as f64);
    ///     // Vocab-parallel: each rank holds some rows and looks up only those.
    ///     let w: Dt<f64, (tp,), (Shard<0>,), 2> = Dt::distribute(&table, &mesh)?;
    ///     let ids: Dt<i64, (tp,), (Replicate,), 1> = Dt::distribute(&ndarray::arr1(&[4, 0]).into_dyn(), &mesh)?;
    ///     let y: Dt<f64, (tp,), (Partial<Sum>,), 2> = w.embedding(&ids)?;
    ///     y.full_tensor()
    /// })
    /// .unwrap();
    /// assert_eq!(out[0].index_axis(ndarray::Axis(0), 0).iter().copied().collect::<Vec<_>>(), vec![12.0, 13.0, 14.0]);
    /// ```
    #[track_caller]
    pub fn embedding<I: IndexElement, Li, const Q: usize, const RO: usize>(
        &self,
        ids: &Dt<I, M, Li, Q>,
    ) -> Result<Dt<T, M, EmbeddingOut<L, Li, M, Q>, RO>>
    where
        L: EmbeddingLayout<Li, M, Ids<Q>>,
        Li: TypedLayout<M>,
    {
        const { assert!(RO == Q + 1, "`embedding`: the output rank is the ids' rank + 1") };
        Dt::from_op("embedding", || self.as_dtensor().embedding(ids.as_dtensor()))
    }
}
