//! Typed `repeat` (tile) and `repeat_interleave` (grouped-query attention's key/value heads),
//! the rules of [`ops::repeat`](crate::ops::repeat): both keep the layout.
//!
//! Per mesh dim: `Replicate` and every `Shard` stay; a `Partial` stays where `expand` keeps it
//! ([`expand_keeps_partial`]: repeating each rank's part repeats the reduced value), so
//! `Partial<Product>` does not compile. Repeat counts are values, not types, so the part of
//! the rule that depends on them is checked at run time, before the op runs, with an
//! [`Error::TypedMismatch`] naming the caller's line (never a silent redistribution):
//! - `repeat`: a sharded dim must be repeated once (a tiled dim is not a chunk of the
//!   input's; the runtime would replicate it first);
//! - `repeat_interleave` along a sharded dim: the dim and the result must divide evenly by the
//!   number of shards, so that each rank's slices repeat in place (the runtime's reshape rule,
//!   [`reshape_keeps`]); shards of other dims always stay.

use super::lift::lift_unary;
use super::markers::{Avg, Max, Min, Partial, Product, Replicate, Shard, Sum};
use super::redistribute::Verdict;
use super::reduce::Dim;
use super::view::inserted_dim;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::ops::view::{expand_keeps_partial, reshape_keeps};
use crate::placement::{fmt_placements, Placement, ReduceOp};

/// Holds when repetition keeps the Partial `P` (implemented for `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`repeat` / `repeat_interleave` of `{P}` on mesh dim `{Name}` is not a legal layout: call `.redistribute()` first",
    label = "`{P}` on mesh dim `{Name}` must be reduced before it is repeated",
    note = "repetition keeps `Partial<Sum|Avg|Max|Min>`; redistribute mesh dim `{Name}` to `Replicate` first"
)]
pub trait RepeatKeepsPartial<P, Name> {}
impl<P, Name> RepeatKeepsPartial<P, Name> for Verdict<true> {}

/// The repetition rule on one mesh dim: the placement is kept.
#[doc(hidden)]
pub trait RepeatRule<Name> {
    /// Placement of the result on this mesh dim (the input's).
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The repetition rule on every mesh dim of a layout.
    #[doc(hidden)]
    RepeatLayout,
    RepeatRule
);

impl<N> RepeatRule<N> for Replicate {
    type Out = Replicate;
}
impl<N, const D: usize> RepeatRule<N> for Shard<D> {
    type Out = Shard<D>;
}

/// `impl RepeatRule<N> for Partial<Op>`, legal where `expand` keeps the Partial.
macro_rules! partial_rules {
    ($($op:ident)*) => {$(
        impl<N> RepeatRule<N> for Partial<$op>
        where
            Verdict<{ expand_keeps_partial(ReduceOp::$op) }>: RepeatKeepsPartial<Partial<$op>, N>,
        {
            type Out = Partial<$op>;
        }
    )*};
}
partial_rules!(Sum Avg Min Max Product);

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Tiles the tensor `repeats[i]` times along dim `i` (PyTorch `repeat` with one count per
    /// dim); the layout is kept. A sharded dim repeated more than once is a run-time error
    /// naming the caller's line (the runtime would replicate it first).
    #[track_caller]
    pub fn repeat(&self, repeats: [usize; R]) -> Result<Self>
    where
        L: RepeatLayout<M>,
    {
        let x = self.as_dtensor();
        if let Some(d) = (0..R).find(|&d| repeats[d] != 1 && x.placements().iter().any(|p| p.is_shard_on(d))) {
            return Err(Error::TypedMismatch {
                what: format!(
                    "typed `repeat` (at {}) of {repeats:?} with layout {}",
                    std::panic::Location::caller(),
                    fmt_placements(x.placements())
                ),
                expected: format!("sharded dims repeated once, dim {d} repeated {}", repeats[d]),
                actual: "the runtime would replicate that dim first: call `.redistribute()`".into(),
            });
        }
        Dt::from_op("repeat", || x.repeat(&repeats))
    }

    /// Repeats every slice along dim `D` `repeats` times in place (PyTorch
    /// `repeat_interleave(repeats, D)`): `[b, kv_heads, s, hd]` → `[b, kv_heads · n_rep, s, hd]`
    /// for grouped-query attention, heads sharded over `tp` staying sharded. The layout is
    /// kept; see the module for the run-time size condition of a sharded `D`.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dim, Dt, Shard};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let g = ndarray::ArrayD::from_shape_fn(vec![1, 4, 2], |ix| ix[1] as f32);
    ///     let kv: Dt<f32, (tp,), (Shard<1>,), 3> = Dt::distribute(&g, &mesh)?;
    ///     let rep = kv.repeat_interleave(2, Dim::<1>)?; // 8 heads, still `Shard<1>`, no collective
    ///     rep.full_tensor()
    /// })
    /// .unwrap();
    /// let heads: Vec<f32> = out[0].index_axis(ndarray::Axis(2), 0).iter().copied().collect();
    /// assert_eq!(heads, vec![0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn repeat_interleave<const D: usize>(&self, repeats: usize, _dim: Dim<D>) -> Result<Self>
    where
        L: RepeatLayout<M>,
    {
        const { assert!(D < R, "`repeat_interleave(.., Dim::<D>)`: D must be < the tensor rank R") };
        let x = self.as_dtensor();
        // The runtime composes unsqueeze(D + 1), expand and a reshape back: the reshape decides.
        let mut wide = x.shape().to_vec();
        wide.insert(D + 1, repeats);
        let mut out = x.shape().to_vec();
        let Some(n) = out[D].checked_mul(repeats) else {
            return Dt::from_op("repeat_interleave", || x.repeat_interleave(repeats, D as isize));
            // its overflow error
        };
        out[D] = n;
        let unsqueezed: Vec<Placement> = x
            .placements()
            .iter()
            .map(|p| match *p {
                Placement::Shard(e) => Placement::Shard(inserted_dim(e as usize, D + 1) as isize),
                p => p,
            })
            .collect();
        let kept = reshape_keeps(&wide, &out, x.device_mesh().shape(), &unsqueezed);
        if kept.as_deref() != Some(x.placements()) {
            return Err(Error::TypedMismatch {
                what: format!(
                    "typed `repeat_interleave` (at {}) of dim {D} of shape {:?} with layout {}",
                    std::panic::Location::caller(),
                    x.shape(),
                    fmt_placements(x.placements())
                ),
                expected: "the layout kept without communication (the sharded dim and the result divide evenly by its number of shards)".into(),
                actual: "the runtime would redistribute first: call `.redistribute()`".into(),
            });
        }
        Dt::from_op("repeat_interleave", || x.repeat_interleave(repeats, D as isize))
    }
}
