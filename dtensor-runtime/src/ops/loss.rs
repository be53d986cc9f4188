//! Losses, composed of the ops above (so their sharding and gradients come for free).

use crate::dtensor::DTensor;
use crate::element::{Element, IndexElement};
use crate::error::{Error, Result};
use crate::placement::Placement;
use std::borrow::Cow;

/// How a loss reduces its per-element values (PyTorch's `reduction=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossReduction {
    /// The mean over the elements that count (for `cross_entropy`, those whose target is not
    /// the ignored index).
    #[default]
    Mean,
    /// The sum.
    Sum,
    /// No reduction: one value per target element (0 where the target is ignored).
    None,
}

/// The options of [`DTensor::cross_entropy_with`], PyTorch `cross_entropy`'s keywords.
///
/// ```
/// use dtensor_runtime::ops::loss::{CrossEntropyOptions, LossReduction};
/// // Hugging Face's causal-LM labels: -100 marks a position without a target.
/// let o = CrossEntropyOptions::new().ignore_index(-100).reduction(LossReduction::Sum);
/// assert_eq!((o.ignore_index, o.reduction), (Some(-100), LossReduction::Sum));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct CrossEntropyOptions {
    /// Targets equal to this id add nothing to the loss nor to the mean's count (PyTorch's
    /// `ignore_index`, `-100` in Hugging Face labels). `None`: every target counts and must
    /// be a class id.
    pub ignore_index: Option<i64>,
    /// How the per-target losses are reduced.
    pub reduction: LossReduction,
    /// Label smoothing `ε` in `[0, 1]`: the target distribution is `(1 - ε)·one_hot + ε/C`.
    pub label_smoothing: f64,
}

impl CrossEntropyOptions {
    /// The mean, no smoothing, and no ignored id. (PyTorch ignores -100 by default; here an
    /// id is ignored only when asked, so a stray -100 is an error naming `one_hot`, not a
    /// target silently dropped.)
    pub fn new() -> Self {
        Self::default()
    }

    /// Targets equal to `id` are ignored.
    pub fn ignore_index(mut self, id: i64) -> Self {
        self.ignore_index = Some(id);
        self
    }

    /// The reduction.
    pub fn reduction(mut self, reduction: LossReduction) -> Self {
        self.reduction = reduction;
        self
    }

    /// Label smoothing `ε` (checked when the loss runs: in `[0, 1]`).
    pub fn label_smoothing(mut self, eps: f64) -> Self {
        self.label_smoothing = eps;
        self
    }
}

/// A Partial of ids is no id: `op` (which reads ids shard by shard) refuses it.
fn no_partial_ids(op: &str, ids: &DTensor<i64>) -> Result<()> {
    if ids.placements().iter().any(|p| p.is_partial()) {
        return Err(Error::InvalidArgument {
            context: op.into(),
            reason: format!(
                "the ids are {} (a Partial of ids is no id): redistribute them first",
                crate::placement::fmt_placements(ids.placements())
            ),
        });
    }
    Ok(())
}

impl<T: Element> DTensor<T> {
    /// Mean cross-entropy of logits `[.., C]` against class ids `[..]` (in `[0, C)`), as
    /// PyTorch `cross_entropy(reduction="mean")`. A 0-d result; Partial(sum) when the batch is
    /// sharded (read it with `full_tensor`). `target` may be `i64`/`i32`, or floats holding
    /// whole numbers; it is read as `i64` (never through `T`, so a bf16 model scores every
    /// class of a large vocabulary). A float id that is not a whole number is an
    /// [`Error::InvalidArgument`] naming `cross_entropy`; an id outside `[0, C)` one naming
    /// `one_hot`. An empty batch gives NaN (0/0), as PyTorch. For ignored targets (Hugging
    /// Face's `-100`), other reductions or label smoothing see
    /// [`cross_entropy_with`](Self::cross_entropy_with).
    pub fn cross_entropy<I: IndexElement>(&self, target: &DTensor<I>) -> Result<DTensor<T>> {
        self.cross_entropy_with(target, &CrossEntropyOptions::new())
    }

    /// Cross-entropy of logits `[.., C]` against class ids `[..]` with PyTorch's options
    /// ([`CrossEntropyOptions`]): `ignore_index`, `reduction`, `label_smoothing`.
    ///
    /// Layouts are those of [`cross_entropy`](Self::cross_entropy); `LossReduction::None`
    /// gives `[..]`: sharded where the logits' or the targets' batch dims are, Partial(sum) on
    /// a mesh dim that shards the classes. The mean with an ignored index divides by the number of
    /// targets that count over the whole batch: where the target is sharded that count is
    /// all-reduced (a collective of one scalar, refused inside a `#[distribute]` function,
    /// whose typed ops spell it out: `cross_entropy_sum` and `count_ne`). Every target ignored
    /// gives NaN (0/0), as PyTorch. Only the classes the target distribution weighs are read,
    /// so a `-inf` logit elsewhere (a masked class) leaves the loss finite, as PyTorch; with
    /// label smoothing every class is weighed, so it makes the loss infinite, as PyTorch.
    ///
    /// ```
    /// use dtensor_runtime::{distribute_tensor, ndarray::{arr1, arr2}, ops::loss::CrossEntropyOptions, run, Shard};
    /// let out = run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
    ///     let x = distribute_tensor(&arr2(&[[0.0f64, 0.0], [5.0, 0.0]]).into_dyn(), &mesh, &[Shard(0)], None)?;
    ///     let t = distribute_tensor(&arr1(&[1i64, -100]).into_dyn(), &mesh, &[Shard(0)], None)?;
    ///     x.cross_entropy_with(&t, &CrossEntropyOptions::new().ignore_index(-100))?.full_tensor()
    /// })
    /// .unwrap();
    /// assert!((out[0].sum() - 2f64.ln()).abs() < 1e-12); // only the first row counts
    /// ```
    pub fn cross_entropy_with<I: IndexElement>(
        &self,
        target: &DTensor<I>,
        opts: &CrossEntropyOptions,
    ) -> Result<DTensor<T>> {
        let target = &*super::embedding::ids_i64("cross_entropy", target)?;
        let nd = self.ndim();
        if nd == 0 || target.shape() != &self.shape[..nd - 1] {
            return Err(Error::ShapeMismatch {
                context: "cross_entropy: target must be the logits' shape without the class dim".into(),
                expected: self.shape.get(..nd.saturating_sub(1)).unwrap_or(&[]).to_vec(),
                actual: target.shape().to_vec(),
            });
        }
        let eps = opts.label_smoothing;
        if !(0.0..=1.0).contains(&eps) {
            return Err(Error::InvalidArgument {
                context: "cross_entropy".into(),
                reason: format!("label_smoothing {eps} is not in [0, 1]"),
            });
        }
        no_partial_ids("cross_entropy", target)?;
        let classes = self.shape[nd - 1];
        // Ignored targets become class 0 for the one-hot, whose row is then zeroed by `keep`
        // (1 where the target counts): no id is read on the host, so device ids stay there.
        let (ids, keep) = match opts.ignore_index {
            None => (Cow::Borrowed(target), None),
            Some(ignored) => {
                let keep = target.ne_mask(&super::mask::scalar_like(target, ignored)?)?;
                let ids = target.where_(&keep, &super::mask::scalar_like(target, 0)?)?;
                (Cow::Owned(ids), Some(keep))
            }
        };
        // The target distribution, made from the i64 ids: only its values are `T`.
        let mut dist = ids.one_hot::<T>(classes)?;
        if eps > 0.0 {
            dist = dist.mul_scalar(T::of_f64(1.0 - eps))?.add_scalar(T::of_f64(eps / classes as f64))?;
        }
        let keep_t = keep.as_ref().map(|k| k.cast::<T>()).transpose()?;
        if let Some(k) = &keep_t {
            dist = dist.mul(&k.unsqueeze(-1)?)?;
        }
        // Loss parallelism: where the logits are sharded on the class dim, cut the target
        // distribution to the same shards (a local slice of a replicated tensor, no
        // collective), so that the `mul` below needs no redistribution of its own.
        let class_dim = Placement::Shard((nd - 1) as isize);
        let want: Vec<Placement> = (self.placements().iter().zip(dist.placements()))
            .map(|(&x, &t)| if x == class_dim && t == Placement::Replicate { class_dim } else { t })
            .collect();
        let dist = if want.as_slice() == dist.placements() { dist } else { dist.redistribute(&want)? };
        // Only the classes the target weighs are read: a log-probability of -inf (a masked or
        // padded class) where the weight is 0 would otherwise give 0·(-inf) = NaN, where
        // PyTorch's gather reads the target's entry alone.
        let unweighted = dist.eq_mask(&super::mask::scalar_like(&dist, T::zero())?)?;
        let scored = self.log_softmax(-1)?.masked_fill(&unweighted, T::zero())?.mul(&dist)?;
        match (opts.reduction, keep) {
            (LossReduction::None, _) => scored.sum_dim(-1, false)?.neg(),
            (LossReduction::Sum, _) => scored.sum()?.neg(),
            (LossReduction::Mean, None) => scored.sum()?.mul_scalar(-T::one() / T::of_f64(target.numel() as f64)),
            (LossReduction::Mean, Some(keep)) => {
                // The count, summed exactly in f64 and all-reduced where the target is sharded
                // (the one implicit move of this op, through the guarded path of every op).
                let count = keep.cast::<f64>()?.sum()?;
                let replicated = vec![Placement::Replicate; count.placements().len()];
                let count = super::strategy::moved("cross_entropy", 1, &count, &replicated, None)?;
                scored.sum()?.div(&count.cast::<T>()?)?.neg()
            }
        }
    }

    /// Mean squared error against `target` (same shape).
    pub fn mse_loss(&self, target: &DTensor<T>) -> Result<DTensor<T>> {
        if self.shape() != target.shape() {
            return Err(Error::ShapeMismatch {
                context: "mse_loss: target".into(),
                expected: self.shape.clone(),
                actual: target.shape().to_vec(),
            });
        }
        let d = self.sub(target)?;
        d.mul(&d)?.mean()
    }
}

impl<I: IndexElement> DTensor<I> {
    /// How many of these ids differ from `value`, as a 0-d `T`: the denominator of a mean
    /// cross-entropy with `ignore_index = value` (Hugging Face's `num_items_in_batch`).
    /// Partial(sum) on each mesh dim that shards the ids, so it is all-reduced only where the
    /// caller says so. Exact while the count fits `T`'s mantissa (2²⁴ in f32, 2⁸ in bf16:
    /// count in f32 or f64 for a bf16 model). Partial ids are an [`Error::InvalidArgument`].
    ///
    /// ```
    /// use dtensor_runtime::{distribute_tensor, ndarray::arr1, run, Shard};
    /// let out = run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
    ///     let ids = distribute_tensor(&arr1(&[3i64, -100, 7, -100, 1]).into_dyn(), &mesh, &[Shard(0)], None)?;
    ///     ids.count_ne::<f32>(-100)?.full_tensor()
    /// })
    /// .unwrap();
    /// assert_eq!(out[0].sum(), 3.0);
    /// ```
    pub fn count_ne<T: Element>(&self, value: i64) -> Result<DTensor<T>> {
        let ids = &*super::embedding::ids_i64("count_ne", self)?;
        no_partial_ids("count_ne", ids)?;
        ids.ne_mask(&super::mask::scalar_like(ids, value)?)?.cast::<T>()?.sum()
    }
}
