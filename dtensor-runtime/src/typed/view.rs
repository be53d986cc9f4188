//! Typed views that change the rank: `unsqueeze`, `squeeze`, `flatten` (merge dims `S..=E`)
//! and `unflatten` (split one dim into two). General `reshape` / `view` are typed through these
//! (and [`permute`](Dt::permute)): the types know ranks, not sizes, so a target shape of
//! arbitrary groups has no layout the type system could compute.
//!
//! Rule per mesh dim (PyTorch's view rules; views are linear, so `Replicate` and every
//! `Partial` pass):
//! - `unsqueeze::<D>`: `Shard<d>` → `Shard<d + 1>` for `d ≥ D`, else unchanged.
//! - `squeeze::<D>`: `Shard<d>` → `Shard<d - 1>` for `d > D`; a `Shard<D>` does not compile
//!   (the dim would vanish with its shards).
//! - `flatten::<S, E>`: a shard of a dim outside `S..=E` shifts; `Shard<S>` (the outermost dim
//!   of the group) stays; a shard of an inner dim `S < d ≤ E` does not compile (the runtime
//!   would redistribute).
//! - `unflatten::<D>` into `[a, b]`: `Shard<D>` lands on the outer new dim `D`; shards of
//!   later dims shift by one.
//!
//! Sizes are not types: a merged or split shard must divide evenly by its number of shards
//! (the runtime's rule, [`reshape_keeps`]). That is checked at run time *before* the dynamic op
//! runs, and a violation is an [`Error::TypedMismatch`] naming the caller's line; the typed
//! layer never redistributes silently.

use super::lift::lift_unary;
use super::markers::{Partial, ReduceMarker, Replicate, Shard};
use super::matmul::Rank;
use super::rank::{RankMerged, RankMinus1, RankPlus1};
use super::redistribute::Verdict;
use super::reduce::Dim;
use super::same::SameLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::ops::view::reshape_keeps;
use crate::placement::fmt_placements;

/// The dim range `S..=E` as a type (and a zero-sized value to pass it):
/// `x.flatten(Dims::<2, 3>)`. One argument, so that both ends are known together.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dims<const S: usize, const E: usize>;

/// Context of `unsqueeze`: a size-1 dim inserted at `D`.
#[doc(hidden)]
pub enum Unsqueeze<const D: usize> {}
/// Context of `squeeze`: the size-1 dim `D` removed.
#[doc(hidden)]
pub enum Squeeze<const D: usize> {}
/// Context of `flatten`: dims `S..=E` merged into one.
#[doc(hidden)]
pub enum Flatten<const S: usize, const E: usize> {}
/// Context of `unflatten`: dim `D` split into two.
#[doc(hidden)]
pub enum Unflatten<const D: usize> {}

/// Where `Shard(d)` goes when a new dim appears at `at` (`unsqueeze`; `unflatten` of dim `D`
/// adds its inner dim at `D + 1`).
pub const fn inserted_dim(d: usize, at: usize) -> usize {
    if d >= at {
        d + 1
    } else {
        d
    }
}

/// Whether `squeeze` of dim `dim` keeps a `Shard(d)`: not when it shards the squeezed dim.
pub const fn squeeze_keeps_shard(d: usize, dim: usize) -> bool {
    d != dim
}

/// Where a kept `Shard(d)` goes when dim `dim` is squeezed.
pub const fn squeezed_dim(d: usize, dim: usize) -> usize {
    if d > dim {
        d - 1
    } else {
        d
    }
}

/// Whether `flatten` of dims `s..=e` keeps a `Shard(d)`: not for an inner dim of the group.
pub const fn flatten_keeps_shard(d: usize, s: usize, e: usize) -> bool {
    d <= s || d > e
}

/// Where a kept `Shard(d)` goes when dims `s..=e` are merged.
pub const fn flattened_dim(d: usize, s: usize, e: usize) -> usize {
    if d > e {
        d - (e - s)
    } else if d > s {
        s
    } else {
        d
    }
}

/// Holds when `squeeze` keeps the shard `S` (implemented for `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`squeeze` of a dim that `{S}` shards on mesh dim `{Name}` is not a legal layout: the sharded dim would vanish",
    label = "`{Ctx}` removes the dim that is `{S}` on mesh dim `{Name}`",
    note = "call `.redistribute()` to `Replicate` (or to `Shard` of another dim) on mesh dim `{Name}` first"
)]
pub trait SqueezeKeepsShard<S, Name, Ctx> {}
impl<S, Name, Ctx> SqueezeKeepsShard<S, Name, Ctx> for Verdict<true> {}

/// Holds when `flatten` keeps the shard `S` (implemented for `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`flatten` of a group whose inner dim is `{S}` on mesh dim `{Name}` would redistribute: call `.redistribute()` first",
    label = "`{Ctx}` merges the dim that is `{S}` on mesh dim `{Name}` into an outer one",
    note = "only a shard of the outermost dim of the flattened group stays; redistribute mesh dim `{Name}` to `Replicate` or to `Shard` of that outermost dim first"
)]
pub trait FlattenKeepsShard<S, Name, Ctx> {}
impl<S, Name, Ctx> FlattenKeepsShard<S, Name, Ctx> for Verdict<true> {}

/// The rule of a rank-changing view on one mesh dim.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Ctx}` of `{Self}` on mesh dim `{Name}` has no typed rule: typed views cover tensor dims 0..=5",
    label = "no typed view rule for `{Self}`",
    note = "use the dynamic op on `.as_dtensor()` for higher ranks"
)]
pub trait ViewRule<Name, Ctx> {
    /// Placement of the result on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The view rule on every mesh dim of a layout.
    #[doc(hidden)]
    ViewLayout,
    ViewRule,
    ctx
);

impl<N, C> ViewRule<N, C> for Replicate {
    type Out = Replicate;
}
impl<N, C, Op: ReduceMarker> ViewRule<N, C> for Partial<Op> {
    type Out = Partial<Op>;
}

/// `impl ViewRule<N, ctx> for Shard<d>` for every shard dim `d` and every context.
macro_rules! shard_rules {
    (@at $a:literal [$($d:literal)*]) => {$(
        impl<N> ViewRule<N, Unsqueeze<$a>> for Shard<$d> {
            type Out = Shard<{ inserted_dim($d, $a) }>;
        }
        impl<N> ViewRule<N, Unflatten<$a>> for Shard<$d> {
            type Out = Shard<{ inserted_dim($d, $a + 1) }>;
        }
        impl<N> ViewRule<N, Squeeze<$a>> for Shard<$d>
        where
            Verdict<{ squeeze_keeps_shard($d, $a) }>: SqueezeKeepsShard<Shard<$d>, N, Squeeze<$a>>,
        {
            type Out = Shard<{ squeezed_dim($d, $a) }>;
        }
    )*};
    (@flat $s:literal $e:literal [$($d:literal)*]) => {$(
        impl<N> ViewRule<N, Flatten<$s, $e>> for Shard<$d>
        where
            Verdict<{ flatten_keeps_shard($d, $s, $e) }>: FlattenKeepsShard<Shard<$d>, N, Flatten<$s, $e>>,
        {
            type Out = Shard<{ flattened_dim($d, $s, $e) }>;
        }
    )*};
    // Every pair `s ≤ e` of the dim list (`$before` holds the dims below `e`).
    (@e $ds:tt [$($before:literal)*] []) => {};
    (@e $ds:tt [$($before:literal)*] [$e:literal $($after:literal)*]) => {
        $(shard_rules!(@flat $before $e $ds);)*
        shard_rules!(@flat $e $e $ds);
        shard_rules!(@e $ds [$($before)* $e] [$($after)*]);
    };
    (@ats $ds:tt [$($a:literal)*]) => {
        $(shard_rules!(@at $a $ds);)*
    };
    ([$($d:literal)*] at $ats:tt) => {
        shard_rules!(@ats [$($d)*] $ats);
        shard_rules!(@e [$($d)*] [] [$($d)*]);
    };
}
shard_rules!([0 1 2 3 4 5] at [0 1 2 3 4 5 6]);

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// The run-time half of a view rule: the dynamic reshape of `self` to `out` must keep
    /// exactly `want` without communication (a merged or split shard divides evenly);
    /// otherwise an error naming the caller's line, before anything runs. Then the dynamic op.
    #[track_caller]
    fn view_op<L2: TypedLayout<M>, const R2: usize>(
        &self,
        op: &'static str,
        out: &[usize],
        dynamic: impl FnOnce(&DTensor<T>) -> Result<DTensor<T>>,
    ) -> Result<Dt<T, M, L2, R2>> {
        let at = std::panic::Location::caller();
        let x = self.as_dtensor();
        // Sizes that do not multiply up are the dynamic op's error, reported before it
        // communicates.
        if out.iter().product::<usize>() == x.shape().iter().product::<usize>() {
            let want = L2::placements();
            let kept = reshape_keeps(x.shape(), out, x.device_mesh().shape(), x.placements());
            if kept.as_deref() != Some(want.as_slice()) {
                return Err(Error::TypedMismatch {
                    what: format!(
                        "typed `{op}` (at {at}) of shape {:?} to {out:?} with layout {}",
                        x.shape(),
                        fmt_placements(x.placements())
                    ),
                    expected: format!(
                        "layout {} without communication (a merged or split sharded dim must divide evenly by its number of shards)",
                        fmt_placements(&want)
                    ),
                    actual: match kept {
                        Some(k) => format!("the runtime keeps {}", fmt_placements(&k)),
                        None => "the runtime would redistribute first: call `.redistribute()`".into(),
                    },
                });
            }
        }
        Dt::from_op(op, || dynamic(x))
    }

    /// Inserts a size-1 dim at `D` (`0 ≤ D ≤ R`): `x.unsqueeze(Dim::<1>)`. Shards of dims
    /// `≥ D` shift up by one. The output rank `R + 1` is inferred.
    #[allow(clippy::type_complexity)] // the output layout is a projection, spelled out once
    #[track_caller]
    pub fn unsqueeze<const D: usize, const R2: usize, Lx>(
        &self,
        _dim: Dim<D>,
    ) -> Result<Dt<T, M, <Lx as ViewLayout<M, Unsqueeze<D>>>::Out, R2>>
    where
        L: SameLayout<Lx>,
        Lx: ViewLayout<M, Unsqueeze<D>>,
        Rank<R>: RankPlus1<Out = Rank<R2>>,
    {
        const { assert!(D <= R, "`unsqueeze(Dim::<D>)`: D must be ≤ the tensor rank R") };
        let mut out = self.shape().to_vec();
        out.insert(D, 1);
        self.view_op("unsqueeze", &out, |x| x.unsqueeze(D as isize))
    }

    /// Removes dim `D`, which must have size 1 (checked at run time: the type promises rank
    /// `R - 1`, so a no-op squeeze is an error). A `Shard<D>` does not compile; shards of
    /// later dims shift down by one.
    #[allow(clippy::type_complexity)] // the output layout is a projection, spelled out once
    #[track_caller]
    pub fn squeeze<const D: usize, const R2: usize, Lx>(
        &self,
        _dim: Dim<D>,
    ) -> Result<Dt<T, M, <Lx as ViewLayout<M, Squeeze<D>>>::Out, R2>>
    where
        L: SameLayout<Lx>,
        Lx: ViewLayout<M, Squeeze<D>>,
        Rank<R>: RankMinus1<Out = Rank<R2>>,
    {
        const { assert!(D < R, "`squeeze(Dim::<D>)`: D must be < the tensor rank R") };
        if self.shape()[D] != 1 {
            return Err(Error::TypedMismatch {
                what: format!("typed `squeeze` (at {}) of dim {D}", std::panic::Location::caller()),
                expected: "size 1".into(),
                actual: format!("shape {:?}", self.shape()),
            });
        }
        let mut out = self.shape().to_vec();
        out.remove(D);
        self.view_op("squeeze", &out, |x| x.squeeze(Some(D as isize)))
    }

    /// Merges dims `S..=E` into one (PyTorch `flatten(S, E)`): `[b, s, nh, hd]` →
    /// `[b, s, nh * hd]` with `x.flatten(Dims::<2, 3>)`. A shard of the outermost dim `S`
    /// stays (its size must divide evenly by the number of shards: checked at run time); a
    /// shard of an inner dim does not compile. The output rank is inferred.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dims, Dt, Shard};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let g = ndarray::ArrayD::from_shape_fn(vec![3, 4, 2], |ix| (ix[0] * 8 + ix[1] * 2 + ix[2]) as f32);
    ///     let x: Dt<f32, (tp,), (Shard<1>,), 3> = Dt::distribute(&g, &mesh)?;
    ///     let y: Dt<f32, (tp,), (Shard<1>,), 2> = x.flatten(Dims::<1, 2>)?;
    ///     y.full_tensor()
    /// })
    /// .unwrap();
    /// assert_eq!(out[0].shape(), &[3, 8]);
    /// assert_eq!(out[0][[2, 7]], 23.0);
    /// ```
    #[allow(clippy::type_complexity)] // the output layout is a projection, spelled out once
    #[track_caller]
    pub fn flatten<const S: usize, const E: usize, const R2: usize, Lx>(
        &self,
        _dims: Dims<S, E>,
    ) -> Result<Dt<T, M, <Lx as ViewLayout<M, Flatten<S, E>>>::Out, R2>>
    where
        L: SameLayout<Lx>,
        Lx: ViewLayout<M, Flatten<S, E>>,
        Rank<R>: RankMerged<S, E, Out = Rank<R2>>,
    {
        let shape = self.shape();
        let mut out = shape[..S].to_vec();
        out.push(shape[S..=E].iter().product());
        out.extend_from_slice(&shape[E + 1..]);
        self.view_op("flatten", &out, |x| x.flatten(S as isize, E as isize))
    }

    /// Splits dim `D` into `[outer, inner]` (PyTorch `unflatten(D, (outer, inner))`):
    /// `[b, s, h]` → `[b, s, nh, hd]` with `x.unflatten(Dim::<2>, [nh, hd])`. A `Shard<D>` lands
    /// on the outer new dim (`outer` must divide evenly by its number of shards: checked at run
    /// time); shards of later dims shift up by one. The output rank is inferred.
    #[allow(clippy::type_complexity)] // the output layout is a projection, spelled out once
    #[track_caller]
    pub fn unflatten<const D: usize, const R2: usize, Lx>(
        &self,
        _dim: Dim<D>,
        sizes: [usize; 2],
    ) -> Result<Dt<T, M, <Lx as ViewLayout<M, Unflatten<D>>>::Out, R2>>
    where
        L: SameLayout<Lx>,
        Lx: ViewLayout<M, Unflatten<D>>,
        Rank<R>: RankPlus1<Out = Rank<R2>>,
    {
        const { assert!(D < R, "`unflatten(Dim::<D>, ..)`: D must be < the tensor rank R") };
        let mut out = self.shape()[..D].to_vec();
        out.extend_from_slice(&sizes);
        out.extend_from_slice(&self.shape()[D + 1..]);
        let dyn_sizes = sizes.map(|s| s as isize);
        self.view_op("unflatten", &out, |x| x.unflatten(D as isize, &dyn_sizes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Placement;

    /// The shape-free typed mappings agree with the runtime's reshape rule on shapes where
    /// every sharded dim divides evenly.
    #[test]
    fn typed_view_rules_agree_with_reshape_keeps() {
        let shape = [4usize, 6, 2, 8];
        let mesh = [2usize];
        for d in 0..4 {
            let ps = [Placement::Shard(d as isize)];
            let keeps = |out: &[usize]| reshape_keeps(&shape, out, &mesh, &ps);
            for at in 0..=4 {
                let mut out = shape.to_vec();
                out.insert(at, 1);
                assert_eq!(keeps(&out), Some(vec![Placement::Shard(inserted_dim(d, at) as isize)]), "unsqueeze {at}");
            }
            for s in 0..4 {
                for e in s..4 {
                    let mut out = shape[..s].to_vec();
                    out.push(shape[s..=e].iter().product());
                    out.extend_from_slice(&shape[e + 1..]);
                    let want =
                        flatten_keeps_shard(d, s, e).then(|| vec![Placement::Shard(flattened_dim(d, s, e) as isize)]);
                    assert_eq!(keeps(&out), want, "flatten {s}..={e} of Shard({d})");
                }
            }
            let mut out = shape[..d].to_vec();
            out.extend_from_slice(&[2, shape[d] / 2]);
            out.extend_from_slice(&shape[d + 1..]);
            assert_eq!(keeps(&out), Some(vec![Placement::Shard(d as isize)]), "unflatten {d}");
            for e in 0..4 {
                if e != d {
                    let mut out = shape[..e].to_vec();
                    out.extend_from_slice(&[2, shape[e] / 2]);
                    out.extend_from_slice(&shape[e + 1..]);
                    let want = Placement::Shard(inserted_dim(d, e + 1) as isize);
                    assert_eq!(keeps(&out), Some(vec![want]), "unflatten {e} of Shard({d})");
                }
            }
        }
        let squeezable = [4usize, 1, 6];
        for (d, dim) in [(0, 1), (2, 1)] {
            let want = squeeze_keeps_shard(d, dim).then(|| vec![Placement::Shard(squeezed_dim(d, dim) as isize)]);
            assert_eq!(reshape_keeps(&squeezable, &[4, 6], &mesh, &[Placement::Shard(d as isize)]), want);
        }
    }
}
