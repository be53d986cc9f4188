//! Dropout with the placement-invariant Philox stream.
//!
//! Each call reserves the counter blocks of the whole tensor from this rank's generator (see
//! [`crate::rng`]), so element `i` is dropped exactly when uniform draw `i` of that call is
//! below `p`, whatever the mesh and placements: a sharded dropout equals the single-rank one
//! bit for bit, and every rank stays in step. Rule per mesh dim: every placement is kept
//! (the mask is drawn for the shard), a Partial input is reduced first (PyTorch treats
//! dropout as a non-linear pointwise op). The gradient is the same mask times the gradient.

use super::new_output;
use super::pointwise::{partials_kept, UnaryKind};
use super::strategy::{moved, reduce_partials};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::op::{Distribution, RandomFill, UnaryOp};
use crate::rng;
use crate::storage::Storage;

impl<T: Element> DTensor<T> {
    /// Zeroes each element with probability `p` and scales the others by `1 / (1 - p)` when
    /// `train`; the identity otherwise (PyTorch `F.dropout(x, p, training)`).
    pub fn dropout(&self, p: f64, train: bool) -> Result<DTensor<T>> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::InvalidArgument {
                context: "dropout".into(),
                reason: format!("probability must be in [0, 1], got {p}"),
            });
        }
        if !train || p == 0.0 {
            return Ok(self.clone());
        }
        let keep = reduce_partials(&self.placements, partials_kept(UnaryKind::Dropout));
        let x = moved("dropout", 0, self, &keep, None)?.into_owned();
        let (seed, offset) = rng::reserve(x.numel());
        let fill = RandomFill { seed, offset, dist: Distribution::Uniform };
        let (shape, at) = local_shape_and_offset(&x.shape, x.mesh.shape(), x.mesh.coordinate(), &x.placements);
        let u = Storage::<T>::random(&x.local.target(), &fill, &x.shape, &at, &shape)?;
        let mask = new_output(u.unary(UnaryOp::DropoutScale(p))?, &x.mesh, x.placements.clone(), x.shape.clone());
        x.mul(&mask)
    }
}
