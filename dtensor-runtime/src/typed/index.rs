//! Typed `index_select` and `gather` (the rules of [`ops::index`](crate::ops::index)): ids are
//! `i64`/`i32`, or whole numbers held in a float type, read as `i64` whatever the indexed
//! tensor's type, as `embedding`'s.
//!
//! Per mesh dim (input, index → output), for the indexed dim `D`:
//! - `index_select` (a rank-1 index): `Replicate`, `Replicate` → `Replicate`; `Shard<e>`
//!   (`e ≠ D`), `Replicate` → `Shard<e>`; `Replicate`, `Shard<0>` → `Shard<D>` (each rank
//!   selects its part of the ids); `Partial<Op>`, `Replicate` → `Partial<Op>` (selection
//!   commutes with every reduction).
//! - `gather` (an index of the input's rank): `Replicate`, `Replicate` → `Replicate`;
//!   `Shard<e>`, `Shard<e>` (`e ≠ D`) → `Shard<e>`; `Replicate`, `Shard<D>` → `Shard<D>`;
//!   `Partial<Op>`, `Replicate` → `Partial<Op>`.
//!
//! An input sharded on the indexed dim does not compile: the ids address the whole dim, so
//! the runtime would gather it first ([`index_keeps_shard`]). Anything else does not compile
//! either. `gather`'s shared shard of dim `e` also needs the index and the input of one size
//! there; sizes are not types, so that is checked at run time before the op runs, and a
//! violation is an [`Error::TypedMismatch`] naming the caller's line.

use super::lift::lift_binary;
use super::markers::{Partial, ReduceMarker, Replicate, Shard};
use super::redistribute::Verdict;
use super::reduce::Dim;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::{IndexElement, Scalar};
use crate::error::{Error, Result};
use crate::ops::index::index_keeps_shard;
use crate::placement::{fmt_placements, Placement};

/// Context of the `index_select` rule along dim `D`.
#[doc(hidden)]
pub enum IndexSelect<const D: usize> {}
/// Context of the `gather` rule along dim `D`.
#[doc(hidden)]
pub enum Gather<const D: usize> {}

/// Holds when indexing along `Ctx`'s dim keeps the input's shard `S` (implemented for
/// `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Ctx}` indexes the dim that is `{S}` on mesh dim `{Name}`: the ids address the whole dim, call `.redistribute()` first",
    label = "`{Ctx}` indexes the dim that mesh dim `{Name}` shards (`{S}`)",
    note = "redistribute the input's mesh dim `{Name}` to `Replicate` (or to `Shard` of another dim) first; the typed layer never gathers implicitly"
)]
pub trait IndexKeepsShard<S, Name, Ctx> {}
impl<S, Name, Ctx> IndexKeepsShard<S, Name, Ctx> for Verdict<true> {}

/// The rule of `index_select` / `gather` on one mesh dim: input `Self` at index `I`.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Ctx}` of a `{Self}` input at a `{I}` index on mesh dim `{Name}` is not a legal layout: call `.redistribute()` first",
    label = "no indexing rule for input `{Self}` with index `{I}` on mesh dim `{Name}`",
    note = "legal per mesh dim (input, index): (Replicate, Replicate); index_select: (Shard<e>, Replicate) for e ≠ the indexed dim, (Replicate, Shard<0>), (Partial, Replicate); gather: (Shard<e>, Shard<e>) for e ≠ the indexed dim, (Replicate, Shard<indexed dim>), (Partial, Replicate)"
)]
pub trait IndexRule<I, Name, Ctx> {
    /// Placement of the output on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_binary!(
    /// The indexing rule on every mesh dim of a layout.
    #[doc(hidden)]
    IndexLayout,
    IndexRule,
    ctx
);

impl<N, C> IndexRule<Replicate, N, C> for Replicate {
    type Out = Replicate;
}
impl<N, C, Op: ReduceMarker> IndexRule<Replicate, N, C> for Partial<Op> {
    type Out = Partial<Op>;
}
impl<N, const D: usize> IndexRule<Shard<0>, N, IndexSelect<D>> for Replicate {
    type Out = Shard<D>;
}
impl<N, const D: usize> IndexRule<Shard<D>, N, Gather<D>> for Replicate {
    type Out = Shard<D>;
}

/// The input-shard rules of both ops for every indexed dim `a` and shard dim `d`.
macro_rules! shard_rules {
    (@at $a:literal [$($d:literal)*]) => {$(
        impl<N> IndexRule<Replicate, N, IndexSelect<$a>> for Shard<$d>
        where
            Verdict<{ index_keeps_shard($d, $a) }>: IndexKeepsShard<Shard<$d>, N, IndexSelect<$a>>,
        {
            type Out = Shard<$d>;
        }
        impl<N> IndexRule<Shard<$d>, N, Gather<$a>> for Shard<$d>
        where
            Verdict<{ index_keeps_shard($d, $a) }>: IndexKeepsShard<Shard<$d>, N, Gather<$a>>,
        {
            type Out = Shard<$d>;
        }
    )*};
    ($ds:tt at [$($a:literal)*]) => {
        $(shard_rules!(@at $a $ds);)*
    };
}
shard_rules!([0 1 2 3 4 5] at [0 1 2 3 4 5]);

/// The output layout of indexing a `L` input at a `Li` index (`Ctx`: the op and dim).
pub type IndexOut<L, Li, M, Ctx> = <L as IndexLayout<Li, M, Ctx>>::Out;

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// The slices of dim `D` at the ids of the rank-1 `index` (PyTorch `index_select(D,
    /// index)`); see the module for the layouts. No communication. Any element type can be
    /// indexed; `index` holds `i64`/`i32` ids or whole-number float ids, read as `i64`.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dim, Dt, Replicate, Shard};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let g = ndarray::ArrayD::from_shape_fn(vec![3, 4], |ix| (4 * ix[0] + ix[1]) as f32);
    ///     let x: Dt<f32, (tp,), (Shard<0>,), 2> = Dt::distribute(&g, &mesh)?;
    ///     let ids: Dt<i64, (tp,), (Replicate,), 1> = Dt::distribute(&ndarray::arr1(&[3, 0]).into_dyn(), &mesh)?;
    ///     let y: Dt<f32, (tp,), (Shard<0>,), 2> = x.index_select(Dim::<1>, &ids)?; // columns 3, 0
    ///     y.full_tensor()
    /// })
    /// .unwrap();
    /// assert_eq!(out[0].index_axis(ndarray::Axis(0), 2).iter().copied().collect::<Vec<_>>(), vec![11.0, 8.0]);
    /// ```
    #[allow(clippy::type_complexity)] // the output layout is a projection, spelled out once
    #[track_caller]
    pub fn index_select<const D: usize, I: IndexElement, Li>(
        &self,
        _dim: Dim<D>,
        index: &Dt<I, M, Li, 1>,
    ) -> Result<Dt<T, M, IndexOut<L, Li, M, IndexSelect<D>>, R>>
    where
        L: IndexLayout<Li, M, IndexSelect<D>>,
        Li: TypedLayout<M>,
    {
        const { assert!(D < R, "`index_select(Dim::<D>, ..)`: D must be < the tensor rank R") };
        Dt::from_op("index_select", || self.as_dtensor().index_select(D as isize, index.as_dtensor()))
    }

    /// PyTorch `gather(D, index)`: `out[i][j] = self[i][index[i][j]]` for `D = 1`, of the
    /// shape of `index` (same rank). A shard shared by input and index must cover dims of
    /// equal size (checked at run time, before the op); see the module for the layouts.
    #[allow(clippy::type_complexity)] // the output layout is a projection, spelled out once
    #[track_caller]
    pub fn gather<const D: usize, I: IndexElement, Li>(
        &self,
        _dim: Dim<D>,
        index: &Dt<I, M, Li, R>,
    ) -> Result<Dt<T, M, IndexOut<L, Li, M, Gather<D>>, R>>
    where
        L: IndexLayout<Li, M, Gather<D>>,
        Li: TypedLayout<M>,
    {
        const { assert!(D < R, "`gather(Dim::<D>, ..)`: D must be < the tensor rank R") };
        let (x, ids) = (self.as_dtensor(), index.as_dtensor());
        // The typed rule keeps a shared shard of dim `e` only where the runtime's does: both
        // tensors of one size on `e` (else the shards would not line up).
        let uneven = L::placements().iter().find_map(|p| match *p {
            Placement::Shard(e) if ids.shape().get(e as usize) != x.shape().get(e as usize) => Some(e),
            _ => None,
        });
        if let Some(e) = uneven {
            return Err(Error::TypedMismatch {
                what: format!(
                    "typed `gather` (at {}) along dim {D} with layout {}",
                    std::panic::Location::caller(),
                    fmt_placements(x.placements())
                ),
                expected: format!("the index of the input's size on the sharded dim {e}: {:?}", x.shape()),
                actual: format!(
                    "index shape {:?}: call `.redistribute()` to `Replicate` on that dim first",
                    ids.shape()
                ),
            });
        }
        Dt::from_op("gather", || x.gather(D as isize, ids))
    }
}
