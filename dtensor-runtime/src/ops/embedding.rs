//! Embedding lookup and one-hot encoding. Indices are carried in an integer DTensor (`i64`,
//! `i32`) or one of the table's float type (whole numbers; exact up to 2^24 in f32), so they
//! shard and redistribute like any tensor.
//!
//! Rules per mesh dim (table `[V, D]`, ids `[..]` → out `[.., D]`): `(R,R)→R`,
//! `(R,S(d))→S(d)`, `(S(1),R)→S(last)`, `(S(0),R)→Partial(sum)` (vocab-parallel: ids outside
//! this rank's rows give zeros), `(P,R)→P`.

use super::new_output;
use super::strategy::{partial_ops, select, DimRule, Select};
use crate::autograd::{record, recording};
use crate::dtensor::DTensor;
use crate::element::{Element, IndexElement, Scalar};
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::placement::{Placement, ReduceOp};
use std::borrow::Cow;

const R: Placement = Placement::Replicate;
const LINEAR: [ReduceOp; 2] = [ReduceOp::Sum, ReduceOp::Avg];

fn shard(d: usize) -> Placement {
    Placement::Shard(d as isize)
}

/// Gradient of the table: scatter-add of `g`'s rows at `ids`, laid out preferably as `prefer`.
fn embedding_backward<T: Element>(
    g: &DTensor<T>,
    ids: &DTensor<T>,
    vocab: usize,
    prefer: &[Placement],
) -> Result<DTensor<T>> {
    let q = ids.ndim();
    let mut rs =
        vec![DimRule::new(&[R, R], R), DimRule::new(&[R, R], shard(0)), DimRule::new(&[shard(q), R], shard(1))];
    for d in 0..q {
        rs.push(DimRule::new(&[shard(d), shard(d)], Placement::Partial(ReduceOp::Sum)));
    }
    for op in partial_ops(&[g], &LINEAR) {
        rs.push(DimRule::new(&[Placement::Partial(op), R], Placement::Partial(op)));
    }
    let c = select("embedding_backward", &[g, ids], &rs, Select { valid: None, prefer_output: Some(prefer) })?;
    let (gi, ii) = (&*c.inputs[0], &*c.inputs[1]);
    let dim = g.shape[q];
    let shape = vec![vocab, dim];
    let (lshape, loff) = local_shape_and_offset(&shape, gi.mesh.shape(), gi.mesh.coordinate(), &c.output);
    let out = gi.local.embedding_backward(&ii.local, lshape[0], loff[0], vocab)?;
    Ok(new_output(out, &gi.mesh, c.output, shape))
}

/// `ids` as a tensor of the table's element type `T`: the tensor itself when it already is
/// one, else a cast whose every value must convert back unchanged (an id `T` cannot hold
/// exactly is an [`Error::InvalidArgument`] naming `op`; range checks are the kernels').
pub(crate) fn ids_as<'a, T: Scalar, I: IndexElement>(op: &str, ids: &'a DTensor<I>) -> Result<Cow<'a, DTensor<T>>> {
    let t = super::in_type::<T, I>(ids)?;
    if I::DTYPE != T::DTYPE && t.local.cast::<I>()? != *ids.local {
        return Err(Error::InvalidArgument {
            context: op.into(),
            reason: format!("an id of dtype {} is not exactly representable in {}", I::DTYPE, T::DTYPE),
        });
    }
    Ok(t)
}

impl<T: Element> DTensor<T> {
    /// Looks up rows of this table (`[V, D]`) at `ids` (whole numbers in `[0, V)`), giving
    /// `ids.shape + [D]`. With a vocab-sharded table (`Shard(0)`) every rank looks up only
    /// its rows and the result is Partial(sum). `ids` may be `i64`/`i32` or `T` itself;
    /// a negative or out-of-range id is an [`Error::InvalidArgument`].
    pub fn embedding<I: IndexElement>(&self, ids: &DTensor<I>) -> Result<DTensor<T>> {
        let ids = &*ids_as::<T, I>("embedding", ids)?;
        if self.ndim() != 2 {
            return Err(Error::ShapeMismatch {
                context: "embedding: table must be [vocab, dim]".into(),
                expected: vec![0, 0],
                actual: self.shape.clone(),
            });
        }
        let q = ids.ndim();
        let mut rs = vec![DimRule::new(&[R, R], R), DimRule::new(&[shard(1), R], shard(q))];
        rs.push(DimRule::new(&[shard(0), R], Placement::Partial(ReduceOp::Sum)));
        for d in 0..q {
            rs.push(DimRule::new(&[R, shard(d)], shard(d)));
        }
        for op in partial_ops(&[self], &LINEAR) {
            rs.push(DimRule::new(&[Placement::Partial(op), R], Placement::Partial(op)));
        }
        let c = select("embedding", &[self, ids], &rs, Select::default())?;
        let (w, ii) = (&*c.inputs[0], &*c.inputs[1]);
        let vocab = self.shape[0];
        let out = w.local.embedding(&ii.local, w.local_offset()[0], vocab)?;
        let mut shape = ids.shape.clone();
        shape.push(self.shape[1]);
        let out = new_output(out, &w.mesh, c.output, shape);
        if !recording(&[w]) {
            return Ok(out);
        }
        let (sids, wpl) = (ii.detach(), w.placements.clone());
        Ok(record("embedding_backward", out, &[w], move |g| Ok(vec![Some(embedding_backward(g, &sids, vocab, &wpl)?)])))
    }

    /// One-hot encoding of whole-number ids into `classes` classes: `ids.shape + [classes]`.
    /// Layout follows the ids (R → R, S(d) → S(d)). No gradient.
    pub fn one_hot(&self, classes: usize) -> Result<DTensor<T>> {
        let mut rs = vec![DimRule::new(&[R], R)];
        rs.extend((0..self.ndim()).map(|d| DimRule::new(&[shard(d)], shard(d))));
        let c = select("one_hot", &[self], &rs, Select::default())?;
        let ii = &*c.inputs[0];
        let out = ii.local.one_hot(classes)?;
        let mut shape = self.shape.clone();
        shape.push(classes);
        Ok(new_output(out, &ii.mesh, c.output, shape))
    }
}
