//! Losses, composed of the ops above (so their sharding and gradients come for free).

use crate::dtensor::DTensor;
use crate::element::{Element, IndexElement};
use crate::error::{Error, Result};
use crate::placement::Placement;

impl<T: Element> DTensor<T> {
    /// Mean cross-entropy of logits `[.., C]` against class ids `[..]` (in `[0, C)`), as
    /// PyTorch `cross_entropy(reduction="mean")`. A 0-d result; Partial(sum) when the batch is
    /// sharded (read it with `full_tensor`). `target` may be `i64`/`i32`, or floats holding
    /// whole numbers; it is read as `i64` (never through `T`, so a bf16 model scores every
    /// class of a large vocabulary). A float id that is not a whole number is an
    /// [`Error::InvalidArgument`] naming `cross_entropy`; an id outside `[0, C)` one naming
    /// `one_hot`.
    pub fn cross_entropy<I: IndexElement>(&self, target: &DTensor<I>) -> Result<DTensor<T>> {
        let target = &*super::embedding::ids_i64("cross_entropy", target)?;
        let nd = self.ndim();
        if nd == 0 || target.shape() != &self.shape[..nd - 1] {
            return Err(Error::ShapeMismatch {
                context: "cross_entropy: target must be the logits' shape without the class dim".into(),
                expected: self.shape.get(..nd.saturating_sub(1)).unwrap_or(&[]).to_vec(),
                actual: target.shape().to_vec(),
            });
        }
        let classes = self.shape[nd - 1];
        let count = target.numel().max(1);
        // The one-hot is made from the i64 ids: only its ones and zeros are `T`.
        let onehot = target.one_hot::<T>(classes)?;
        // Loss parallelism: where the logits are sharded on the class dim, cut the one-hot
        // to the same shards (a local slice of a replicated tensor, no collective), so that
        // the `mul` below needs no redistribution of its own.
        let class_dim = Placement::Shard((nd - 1) as isize);
        let want: Vec<Placement> = (self.placements().iter().zip(onehot.placements()))
            .map(|(&x, &t)| if x == class_dim && t == Placement::Replicate { class_dim } else { t })
            .collect();
        let onehot = if want.as_slice() == onehot.placements() { onehot } else { onehot.redistribute(&want)? };
        self.log_softmax(-1)?.mul(&onehot)?.sum()?.mul_scalar(-T::one() / T::of_f64(count as f64))
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
