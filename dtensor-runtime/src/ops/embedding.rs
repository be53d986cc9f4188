//! Embedding lookup and one-hot encoding. Indices are carried in a DTensor of the same
//! element type (whole numbers; exact up to 2^24 in f32), so they shard and redistribute like
//! any tensor.
//!
//! Rules per mesh dim (table `[V, D]`, ids `[..]` → out `[.., D]`): `(R,R)→R`,
//! `(R,S(d))→S(d)`, `(S(1),R)→S(last)`, `(S(0),R)→Partial(sum)` (vocab-parallel: ids outside
//! this rank's rows give zeros), `(P,R)→P`.

use super::new_output;
use super::strategy::{partial_ops, select, DimRule, Select};
use crate::autograd::{record, recording};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::placement::{Placement, ReduceOp};
use ndarray::{ArrayD, Axis, IxDyn};

const R: Placement = Placement::Replicate;
const LINEAR: [ReduceOp; 2] = [ReduceOp::Sum, ReduceOp::Avg];

fn shard(d: usize) -> Placement {
    Placement::Shard(d as isize)
}

/// Checks one id and converts it to an index.
fn index_of<T: Element>(op: &str, id: T, n: usize) -> Result<usize> {
    let v = id.as_f64();
    if v.fract() != 0.0 || v < 0.0 || v >= n as f64 {
        return Err(Error::InvalidArgument {
            context: op.into(),
            reason: format!("index {v} is not a whole number in [0, {n})"),
        });
    }
    Ok(v as usize)
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
    let mut out = ArrayD::<T>::zeros(IxDyn(&lshape));
    let rows = gi
        .local
        .view()
        .into_shape_with_order(IxDyn(&[ii.local.len(), gi.local.shape()[q]]))
        .map_err(|e| Error::Unsupported { op: "embedding_backward".into(), reason: e.to_string() })?;
    let ids_std = ii.local.as_standard_layout();
    for (row, &id) in rows.axis_iter(Axis(0)).zip(ids_std.iter()) {
        let v = index_of("embedding_backward", id, vocab)?;
        if v >= loff[0] && v < loff[0] + lshape[0] {
            let mut dst = out.index_axis_mut(Axis(0), v - loff[0]);
            dst += &row;
        }
    }
    Ok(new_output(out, &gi.mesh, c.output, shape))
}

impl<T: Element> DTensor<T> {
    /// Looks up rows of this table (`[V, D]`) at `ids` (whole numbers in `[0, V)`), giving
    /// `ids.shape + [D]`. With a vocab-sharded table (`Shard(0)`) every rank looks up only
    /// its rows and the result is Partial(sum).
    pub fn embedding(&self, ids: &DTensor<T>) -> Result<DTensor<T>> {
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
        let (rows, cols) = (w.local.shape()[0], w.local.shape()[1]);
        let row0 = w.local_offset()[0];
        let mut lshape = ii.local.shape().to_vec();
        lshape.push(cols);
        let mut out = ArrayD::<T>::zeros(IxDyn(&[ii.local.len(), cols]));
        for (k, &id) in ii.local.as_standard_layout().iter().enumerate() {
            let v = index_of("embedding", id, vocab)?;
            if v >= row0 && v < row0 + rows {
                out.index_axis_mut(Axis(0), k).assign(&w.local.index_axis(Axis(0), v - row0));
            }
        }
        let out = out
            .into_shape_with_order(IxDyn(&lshape))
            .map_err(|e| Error::Unsupported { op: "embedding".into(), reason: e.to_string() })?;
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
        let mut lshape = ii.local.shape().to_vec();
        lshape.push(classes);
        let mut out = ArrayD::<T>::zeros(IxDyn(&[ii.local.len(), classes]));
        for (k, &id) in ii.local.as_standard_layout().iter().enumerate() {
            out[[k, index_of("one_hot", id, classes)?]] = T::one();
        }
        let out = out
            .into_shape_with_order(IxDyn(&lshape))
            .map_err(|e| Error::Unsupported { op: "one_hot".into(), reason: e.to_string() })?;
        let mut shape = self.shape.clone();
        shape.push(classes);
        Ok(new_output(out, &ii.mesh, c.output, shape))
    }
}
