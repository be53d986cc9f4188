//! Typed rotary position embeddings (the rule of [`ops::rotary`](crate::ops::rotary)) of a
//! tensor `[.., seq, dim]` of rank `R` with replicated tables `[seq, dim]`, per mesh dim:
//! `Replicate` → `Replicate`, `Shard<d>` for `d < R - 1` (batch, heads, sequence) → `Shard<d>`,
//! `Partial<Sum | Avg>` → the same (the map is linear in the tensor). A shard of the feature dim
//! (`R - 1`) does not compile: a rotation pairs features across its shards. No collective runs.

use super::lift::lift_unary;
use super::markers::{Avg, Partial, Replicate, Shard, Sum};
use super::norm::Replicated;
use super::redistribute::Verdict;
use super::same::SameLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::Element;
use crate::error::Result;
use crate::factory::TensorOptions;
use crate::mesh::DeviceMesh;
use crate::ops::rotary::RotaryStyle;

/// Context of the rotary rule: the rank of the rotated tensor.
#[doc(hidden)]
pub enum Rot<const R: usize> {}

/// The rotary rule on one mesh dim.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`apply_rotary` of `{Self}` on mesh dim `{Name}` is not a legal layout",
    label = "`{Self}` on mesh dim `{Name}` must be redistributed first",
    note = "legal per mesh dim: `Replicate`, `Shard<d>` of any dim but the last (features), `Partial<Sum|Avg>`; the tables are replicated"
)]
pub trait RotaryRule<Name, Ctx> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The rotary rule on every mesh dim of a layout.
    #[doc(hidden)]
    RotaryLayout,
    RotaryRule,
    ctx
);

impl<N, const R: usize> RotaryRule<N, Rot<R>> for Replicate {
    type Out = Replicate;
}
impl<N, const R: usize> RotaryRule<N, Rot<R>> for Partial<Sum> {
    type Out = Partial<Sum>;
}
impl<N, const R: usize> RotaryRule<N, Rot<R>> for Partial<Avg> {
    type Out = Partial<Avg>;
}

/// Holds when a rotary embedding keeps the shard `S` (implemented for `Verdict<true>`): `S`
/// is not the feature dim.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`apply_rotary` of a tensor sharded on its feature dim (`{S}` on mesh dim `{Name}`): a rotation pairs features across shards",
    label = "redistribute the features to `Replicate` first, or shard another dim (heads, batch, sequence)",
    note = "legal per mesh dim: `Replicate`, `Shard<d>` of any dim but the last, `Partial<Sum|Avg>`"
)]
pub trait RotaryKeeps<S, Name> {}
impl<S, Name> RotaryKeeps<S, Name> for Verdict<true> {}

/// `impl RotaryRule<N, Rot<r>> for Shard<d>` for `d < r` (legal when `d != r - 1`).
macro_rules! rotary_shard_rules {
    (@r $r:literal; $($d:literal)*) => {$(
        impl<N> RotaryRule<N, Rot<$r>> for Shard<$d>
        where
            Verdict<{ $d + 1 != $r }>: RotaryKeeps<Shard<$d>, N>,
        {
            type Out = Shard<$d>;
        }
    )*};
}
rotary_shard_rules!(@r 2; 0 1);
rotary_shard_rules!(@r 3; 0 1 2);
rotary_shard_rules!(@r 4; 0 1 2 3);
rotary_shard_rules!(@r 5; 0 1 2 3 4);

/// A rotary table `[seq, dim]`, replicated on every mesh dim.
pub type RotaryTable<T, M> = Dt<T, M, <M as Replicated>::Layout, 2>;

/// Cosine and sine tables `[seq_len, dim]` of `style` ([`RotaryStyle::tables`]) for
/// positions `0..seq_len`, replicated on `mesh`, typed.
///
/// ```
/// use dtensor_runtime::{ops::rotary::RotaryStyle, typed::{dims::tp, rotary::rotary_tables, Dt, Shard}};
/// dtensor_runtime::run(2, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
///     // [heads, seq, head_dim], heads sharded over tp.
///     let q: Dt<f32, (tp,), (Shard<0>,), 3> = Dt::distribute(&ndarray::ArrayD::ones(vec![4, 5, 8]), &mesh)?;
///     let (cos, sin) = rotary_tables::<f32, (tp,)>(5, 8, 10000.0, RotaryStyle::Half, &mesh)?;
///     let q: Dt<f32, (tp,), (Shard<0>,), 3> = q.apply_rotary(&cos, &sin, RotaryStyle::Half)?;
///     assert_eq!(q.shape(), &[4, 5, 8]);
///     Ok(())
/// })
/// .unwrap();
/// ```
pub fn rotary_tables<T: Element, M: MeshDims + Replicated>(
    seq_len: usize,
    dim: usize,
    base: f64,
    style: RotaryStyle,
    mesh: &DeviceMesh,
) -> Result<(RotaryTable<T, M>, RotaryTable<T, M>)> {
    let (cos, sin) = style.tables::<T>(seq_len, dim, base, &TensorOptions::new().mesh(mesh))?;
    Ok((Dt::from_dtensor(cos)?, Dt::from_dtensor(sin)?))
}

/// Typed [`RotaryStyle::tables_from_frequencies`]: tables of the given inverse frequencies
/// (a scaled RoPE's, e.g. Llama 3's), replicated on `mesh`.
pub fn rotary_tables_from_frequencies<T: Element, M: MeshDims + Replicated>(
    seq_len: usize,
    inv_freq: &[f64],
    style: RotaryStyle,
    mesh: &DeviceMesh,
) -> Result<(RotaryTable<T, M>, RotaryTable<T, M>)> {
    let (cos, sin) = style.tables_from_frequencies::<T>(seq_len, inv_freq, &TensorOptions::new().mesh(mesh))?;
    Ok((Dt::from_dtensor(cos)?, Dt::from_dtensor(sin)?))
}

impl<T: Element, M: MeshDims + Replicated, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Rotary position embedding of this `[.., seq, dim]` tensor in `style` with tables of the
    /// same style (see the module for the layouts; [`rotary_tables`] makes the tables, and
    /// `narrow` on their dim 0 gives a KV cache's positions).
    #[allow(clippy::type_complexity)] // the output layout is a projection, spelled out once
    #[track_caller]
    pub fn apply_rotary<Lx>(
        &self,
        cos: &RotaryTable<T, M>,
        sin: &RotaryTable<T, M>,
        style: RotaryStyle,
    ) -> Result<Dt<T, M, <Lx as RotaryLayout<M, Rot<R>>>::Out, R>>
    where
        L: SameLayout<Lx>,
        Lx: RotaryLayout<M, Rot<R>>,
    {
        Dt::from_op("apply_rotary", || self.as_dtensor().apply_rotary_with(cos.as_dtensor(), sin.as_dtensor(), style))
    }
}
