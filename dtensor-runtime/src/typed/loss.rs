//! Typed losses (the rules of [`ops::loss`](crate::ops::loss), which composes them from
//! `log_softmax`, `one_hot` (of the `i64` targets), `mul` and a full reduction): a rank-0 result.
//!
//! `cross_entropy` of logits `[.., C]` (rank `R`) against class ids `[..]` (rank `R - 1`),
//! per mesh dim (logits, ids → loss): `Replicate`, `Replicate` → `Replicate`; `Shard<d>`,
//! `Shard<d>` (a batch dim, sharded alike) → `Partial<Sum>`; `Shard<d>` of a batch dim,
//! `Replicate` → `Partial<Sum>`. None of these communicates. Logits sharded on the class dim
//! (`d = R - 1`, loss parallelism) need collectives (`log_softmax` all-reduces per-row
//! statistics), so only [`Dt::cross_entropy_loss_parallel`] takes them, and its name shows it.
//! A `Partial` or a sharded target against unsharded logits does not compile.
//!
//! `cross_entropy_sum` (and its loss-parallel twin) takes the same layouts and an
//! `ignore_index` (Hugging Face's `-100`): the sum of the counted targets' losses. Its mean
//! needs the count of counted targets over the whole batch, a collective where the ids are
//! sharded, so the typed layer makes it two visible steps: `count_ne` of the ids (per mesh dim
//! `Replicate` → `Replicate`, `Shard<d>` → `Partial<Sum>`, never a `Partial`) and a division
//! after the redistributes the code shows (or by a count the data loader already knows).
//!
//! `mse_loss` of two tensors of one layout and shape: `Replicate` → `Replicate`, `Shard<d>` →
//! `Partial<Sum>`; a `Partial` does not compile (the square is not linear).

use super::lift::{lift_binary, lift_unary};
use super::markers::{Partial, Replicate, Shard, Sum};
use super::same::SameLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::element::{Element, IndexElement};
use crate::error::{Error, Result};
use crate::ops::loss::{CrossEntropyOptions, LossReduction};

/// Context of the cross-entropy rule: the rank of the ids (the class dim's index).
#[doc(hidden)]
pub enum Target<const C: usize> {}

/// The cross-entropy rule on one mesh dim: logits `Self` against ids `I`.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`cross_entropy` of `{Self}` logits against `{I}` targets on mesh dim `{Name}` is not a legal layout: redistribute first",
    label = "no cross-entropy rule for logits `{Self}` with targets `{I}` on mesh dim `{Name}`",
    note = "legal per mesh dim (logits, targets): (Replicate, Replicate); (Shard<d>, Shard<d>) on a batch dim; (Shard<d>, Replicate) on a batch dim; class-sharded logits take `cross_entropy_loss_parallel`; never a `Partial`"
)]
pub trait CrossEntropyRule<I, Name, Ctx> {
    /// Placement of the loss on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_binary!(
    /// The cross-entropy rule on every mesh dim of a layout.
    #[doc(hidden)]
    CrossEntropyLayout,
    CrossEntropyRule,
    ctx
);

impl<N, const C: usize> CrossEntropyRule<Replicate, N, Target<C>> for Replicate {
    type Out = Replicate;
}
// `D < C` for the ids' shard holds: the ids' own type checks it.
impl<N, const D: usize, const C: usize> CrossEntropyRule<Shard<D>, N, Target<C>> for Shard<D> {
    type Out = Partial<Sum>;
}
/// Holds when logits sharded on dim `D` against replicated ids need no collective: `D` is a
/// batch dim, not the class dim (implemented for `Verdict<true>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`cross_entropy` of logits sharded on their class dim (`{From}` on mesh dim `{Name}`) is loss parallelism: it communicates",
    label = "use `cross_entropy_loss_parallel`, whose name shows the collectives (two all-reduces of per-row statistics, one in the backward)",
    note = "`cross_entropy` runs no collective: logits sharded on a batch dim, or replicated, are legal"
)]
pub trait CrossEntropyLocal<From, Name> {}
impl<From, Name> CrossEntropyLocal<From, Name> for super::redistribute::Verdict<true> {}

/// `impl CrossEntropyRule<Replicate, N, Target<c>> for Shard<d>` for `d <= c` (the logits have
/// rank `c + 1`), legal for a batch dim (`d < c`).
macro_rules! batch_shard_rules {
    (@c $c:literal; $($d:literal)*) => {$(
        impl<N> CrossEntropyRule<Replicate, N, Target<$c>> for Shard<$d>
        where
            super::redistribute::Verdict<{ $d != $c }>: CrossEntropyLocal<Shard<$d>, N>,
        {
            type Out = Partial<Sum>;
        }
    )*};
    ($($c:literal)*) => {$(
        batch_shard_rules!(@c $c; 0 1 2 3 4 5 6 7);
    )*};
}
batch_shard_rules!(0 1 2 3 4 5 6);

/// The loss-parallel cross-entropy rule on one mesh dim: the rule of `cross_entropy` plus
/// logits sharded on the class dim against replicated ids (`Partial<Sum>`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`cross_entropy_loss_parallel` of `{Self}` logits against `{I}` targets on mesh dim `{Name}` is not a legal layout: redistribute first",
    label = "no cross-entropy rule for logits `{Self}` with targets `{I}` on mesh dim `{Name}`",
    note = "legal per mesh dim (logits, targets): (Replicate, Replicate); (Shard<d>, Shard<d>) on a batch dim; (Shard<d>, Replicate), incl. the class dim; never a `Partial`"
)]
pub trait LossParallelRule<I, Name, Ctx> {
    /// Placement of the loss on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_binary!(
    /// The loss-parallel cross-entropy rule on every mesh dim of a layout.
    #[doc(hidden)]
    LossParallelLayout,
    LossParallelRule,
    ctx
);

impl<N, const C: usize> LossParallelRule<Replicate, N, Target<C>> for Replicate {
    type Out = Replicate;
}
impl<N, const D: usize, const C: usize> LossParallelRule<Shard<D>, N, Target<C>> for Shard<D> {
    type Out = Partial<Sum>;
}
impl<N, const D: usize, const C: usize> LossParallelRule<Replicate, N, Target<C>> for Shard<D> {
    type Out = Partial<Sum>;
}

/// The `mse_loss` rule on one mesh dim.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`mse_loss` of `{Self}` on mesh dim `{Name}` is not a legal layout: the squared error is not linear, reduce the Partial first",
    label = "`{Self}` on mesh dim `{Name}` must be redistributed first: call `.redistribute()`",
    note = "legal per mesh dim: `Replicate` → `Replicate`, `Shard<d>` → `Partial<Sum>`"
)]
pub trait MseRule<Name> {
    /// Placement of the loss on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The `mse_loss` rule on every mesh dim of a layout.
    #[doc(hidden)]
    MseLayout,
    MseRule
);
impl<N> MseRule<N> for Replicate {
    type Out = Replicate;
}
impl<N, const D: usize> MseRule<N> for Shard<D> {
    type Out = Partial<Sum>;
}

/// The rule of `count_ne` on one mesh dim: a full sum of a 0/1 mask of the ids.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`count_ne` of `{Self}` ids on mesh dim `{Name}` is not a legal layout: a Partial of ids is no id",
    label = "`{Self}` ids on mesh dim `{Name}` must be redistributed first",
    note = "legal per mesh dim: `Replicate` → `Replicate`, `Shard<d>` → `Partial<Sum>`"
)]
pub trait CountRule<Name> {
    /// Placement of the count on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The `count_ne` rule on every mesh dim of a layout.
    #[doc(hidden)]
    CountLayout,
    CountRule
);
impl<N> CountRule<N> for Replicate {
    type Out = Replicate;
}
impl<N, const D: usize> CountRule<N> for Shard<D> {
    type Out = Partial<Sum>;
}

/// The loss layout of `cross_entropy` of `L` logits against `Lt` ids of rank `C`.
pub type CrossEntropyOut<L, Lt, M, const C: usize> = <L as CrossEntropyLayout<Lt, M, Target<C>>>::Out;

/// The loss layout of `cross_entropy_loss_parallel` of `L` logits against `Lt` ids of rank `C`.
pub type LossParallelOut<L, Lt, M, const C: usize> = <L as LossParallelLayout<Lt, M, Target<C>>>::Out;

impl<T: Element, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Mean cross-entropy of these logits `[.., C]` against class ids `[..]` of rank `R - 1`
    /// (integers, or whole floats, read as `i64` whatever `T` is; PyTorch
    /// `cross_entropy(reduction="mean")`); see the module for the layouts.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dt, Partial, Replicate, Shard, Sum};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     // Logits and ids sharded alike on the batch dim.
    ///     let x: Dt<f64, (tp,), (Shard<0>,), 2> = Dt::distribute(&ndarray::ArrayD::zeros(vec![2, 4]), &mesh)?;
    ///     let t: Dt<i64, (tp,), (Shard<0>,), 1> = Dt::distribute(&ndarray::arr1(&[0, 3]).into_dyn(), &mesh)?;
    ///     let loss: Dt<f64, (tp,), (Partial<Sum>,), 0> = x.cross_entropy(&t)?;
    ///     loss.full_tensor()
    /// })
    /// .unwrap();
    /// assert!((out[0].sum() - 4f64.ln()).abs() < 1e-12);
    /// ```
    #[track_caller]
    pub fn cross_entropy<I: IndexElement, Lt, Lx, const C: usize>(
        &self,
        target: &Dt<I, M, Lt, C>,
    ) -> Result<Dt<T, M, CrossEntropyOut<Lx, Lt, M, C>, 0>>
    where
        L: SameLayout<Lx>,
        Lx: CrossEntropyLayout<Lt, M, Target<C>>,
        Lt: TypedLayout<M>,
    {
        const { assert!(C + 1 == R, "`cross_entropy`: the targets have the logits' rank - 1") };
        Dt::from_op("cross_entropy", || self.as_dtensor().cross_entropy(target.as_dtensor()))
    }

    /// [`cross_entropy`](Dt::cross_entropy) that also takes logits sharded on the class dim
    /// (loss parallelism, PyTorch's `loss_parallel`): on each mesh dim that shards the classes,
    /// `log_softmax` all-reduces per-row statistics (two all-reduces in the forward, one in
    /// the backward), as the name says, and the classes are never gathered.
    #[track_caller]
    pub fn cross_entropy_loss_parallel<I: IndexElement, Lt, Lx, const C: usize>(
        &self,
        target: &Dt<I, M, Lt, C>,
    ) -> Result<Dt<T, M, LossParallelOut<Lx, Lt, M, C>, 0>>
    where
        L: SameLayout<Lx>,
        Lx: LossParallelLayout<Lt, M, Target<C>>,
        Lt: TypedLayout<M>,
    {
        const { assert!(C + 1 == R, "`cross_entropy_loss_parallel`: the targets have the logits' rank - 1") };
        Dt::from_op("cross_entropy", || self.as_dtensor().cross_entropy(target.as_dtensor()))
    }

    /// Sum of the cross-entropies of these logits `[.., C]` against the class ids `[..]`
    /// whose id is not `ignore_index` (PyTorch `cross_entropy(reduction="sum",
    /// ignore_index=..)`; an ignored id need not be a class). The layouts of
    /// [`cross_entropy`](Dt::cross_entropy), and no collective: the mean over the counted
    /// targets divides by [`count_ne`](Dt::count_ne) of the ids, as the module shows.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::dp, Dt, Partial, Replicate, Shard, Sum};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
    ///     let x: Dt<f64, (dp,), (Shard<0>,), 2> = Dt::distribute(&ndarray::ArrayD::zeros(vec![4, 8]), &mesh)?;
    ///     let ids = ndarray::arr1(&[3, -100, 5, 1]).into_dyn();
    ///     let t: Dt<i64, (dp,), (Shard<0>,), 1> = Dt::distribute(&ids, &mesh)?;
    ///     let total: Dt<f64, (dp,), (Partial<Sum>,), 0> = x.cross_entropy_sum(&t, Some(-100))?;
    ///     let n: Dt<f64, (dp,), (Partial<Sum>,), 0> = t.count_ne(-100)?;
    ///     // The two all-reduces of the mean, shown.
    ///     let (total, n): (Dt<f64, (dp,), (Replicate,), 0>, Dt<f64, (dp,), (Replicate,), 0>) =
    ///         (total.redistribute()?, n.redistribute()?);
    ///     total.div(&n)?.full_tensor()
    /// })
    /// .unwrap();
    /// assert!((out[0].sum() - 8f64.ln()).abs() < 1e-12); // the mean of 3 counted targets
    /// ```
    #[track_caller]
    pub fn cross_entropy_sum<I: IndexElement, Lt, Lx, const C: usize>(
        &self,
        target: &Dt<I, M, Lt, C>,
        ignore_index: Option<i64>,
    ) -> Result<Dt<T, M, CrossEntropyOut<Lx, Lt, M, C>, 0>>
    where
        L: SameLayout<Lx>,
        Lx: CrossEntropyLayout<Lt, M, Target<C>>,
        Lt: TypedLayout<M>,
    {
        const { assert!(C + 1 == R, "`cross_entropy_sum`: the targets have the logits' rank - 1") };
        let opts = summed(ignore_index);
        Dt::from_op("cross_entropy_sum", || self.as_dtensor().cross_entropy_with(target.as_dtensor(), &opts))
    }

    /// [`cross_entropy_sum`](Dt::cross_entropy_sum) that also takes logits sharded on the
    /// class dim (loss parallelism; the collectives of
    /// [`cross_entropy_loss_parallel`](Dt::cross_entropy_loss_parallel)).
    #[track_caller]
    pub fn cross_entropy_sum_loss_parallel<I: IndexElement, Lt, Lx, const C: usize>(
        &self,
        target: &Dt<I, M, Lt, C>,
        ignore_index: Option<i64>,
    ) -> Result<Dt<T, M, LossParallelOut<Lx, Lt, M, C>, 0>>
    where
        L: SameLayout<Lx>,
        Lx: LossParallelLayout<Lt, M, Target<C>>,
        Lt: TypedLayout<M>,
    {
        const { assert!(C + 1 == R, "`cross_entropy_sum_loss_parallel`: the targets have the logits' rank - 1") };
        let opts = summed(ignore_index);
        Dt::from_op("cross_entropy_sum", || self.as_dtensor().cross_entropy_with(target.as_dtensor(), &opts))
    }

    /// Mean squared error against `target` (same layout and shape); see the module.
    #[track_caller]
    pub fn mse_loss<Lt, Lx>(&self, target: &Dt<T, M, Lt, R>) -> Result<Dt<T, M, <Lx as MseLayout<M>>::Out, 0>>
    where
        L: SameLayout<Lx>,
        Lx: MseLayout<M>,
        Lt: TypedLayout<M> + SameLayout<L>,
    {
        if self.shape() != target.shape() {
            return Err(Error::TypedMismatch {
                what: format!("shape of the target of typed `mse_loss` (at {})", std::panic::Location::caller()),
                expected: format!("{:?}", self.shape()),
                actual: format!("{:?}", target.shape()),
            });
        }
        Dt::from_op("mse_loss", || self.as_dtensor().mse_loss(target.as_dtensor()))
    }
}

/// The options of the typed summed cross-entropy.
fn summed(ignore_index: Option<i64>) -> CrossEntropyOptions {
    let opts = CrossEntropyOptions::new().reduction(LossReduction::Sum);
    match ignore_index {
        Some(i) => opts.ignore_index(i),
        None => opts,
    }
}

impl<I: IndexElement, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<I, M, L, R> {
    /// How many of these ids differ from `value`, as a rank-0 `U` (the denominator of a mean
    /// cross-entropy with `ignore_index = value`): per mesh dim `Replicate` → `Replicate`,
    /// `Shard<d>` → `Partial<Sum>`; see [`cross_entropy_sum`](Dt::cross_entropy_sum). Exact
    /// while the count fits `U`'s mantissa (count in f32 or f64 for a bf16 model).
    #[track_caller]
    pub fn count_ne<U: Element, Lx>(&self, value: i64) -> Result<Dt<U, M, <Lx as CountLayout<M>>::Out, 0>>
    where
        L: SameLayout<Lx>,
        Lx: CountLayout<M>,
    {
        Dt::from_op("count_ne", || self.as_dtensor().count_ne::<U>(value))
    }
}
