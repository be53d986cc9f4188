//! Concatenation: `cat` and `stack`.
//!
//! Rule per mesh dim (PyTorch's cat strategy): every input has the same placement; `Shard(e)`
//! with `e` ≠ the cat dim is kept (the inputs have equal sizes there, so their shards line
//! up), a shard of the cat dim is not kept (the inputs are redistributed to Replicate on it),
//! R and Partial (all inputs the same reduce op; cat is linear) are kept. The gradient of each
//! input is its slice of the output's gradient. `stack` is `unsqueeze` then `cat`.

use super::slice::{slice_keeps_shard, ALL_OPS};
use super::strategy::{partial_ops, select, DimRule, Select};
use super::{new_output, norm_dim};
use crate::autograd::record;
use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::placement::Placement;
use crate::storage::Storage;

/// Concatenates `tensors` along `dim` (PyTorch `torch.cat`).
pub fn cat<T: Scalar>(tensors: &[&DTensor<T>], dim: isize) -> Result<DTensor<T>> {
    let Some(first) = tensors.first() else {
        return Err(Error::InvalidArgument { context: "cat".into(), reason: "no tensors to concatenate".into() });
    };
    let d = norm_dim("cat", dim, first.ndim())?;
    for t in tensors {
        let same = t.ndim() == first.ndim() && (0..t.ndim()).all(|e| e == d || t.shape[e] == first.shape[e]);
        if !same {
            return Err(Error::ShapeMismatch {
                context: format!("cat along dim {d}: every other dim must match"),
                expected: first.shape.clone(),
                actual: t.shape.clone(),
            });
        }
    }
    // The output's shape before any data moves: many zero-sized inputs with huge dims can sum
    // past `usize` (or past the shape bound) along `d`.
    let mut shape = first.shape.clone();
    shape[d] = tensors
        .iter()
        .try_fold(0usize, |acc, t| acc.checked_add(t.shape[d]))
        .ok_or_else(|| Error::ShapeOverflow { context: "cat".into(), shape: first.shape.clone() })?;
    crate::shape::checked_numel("cat", &shape)?;
    let n = tensors.len();
    let mut rs = vec![DimRule::new(&vec![Placement::Replicate; n], Placement::Replicate)];
    for e in (0..first.ndim()).filter(|&e| slice_keeps_shard(e, d)) {
        rs.push(DimRule::new(&vec![Placement::Shard(e as isize); n], Placement::Shard(e as isize)));
    }
    for o in partial_ops(tensors, &ALL_OPS) {
        rs.push(DimRule::new(&vec![Placement::Partial(o); n], Placement::Partial(o)));
    }
    let c = select("cat", tensors, &rs, Select::default())?;
    let locals: Vec<&Storage<T>> = c.inputs.iter().map(|x| &*x.local).collect();
    let local = Storage::cat(&locals, d)?;
    let sizes: Vec<usize> = c.inputs.iter().map(|x| x.shape[d]).collect();
    let out = new_output(local, &c.inputs[0].mesh, c.output, shape);
    let ins: Vec<&DTensor<T>> = c.inputs.iter().map(|x| &**x).collect();
    Ok(record("cat_backward", out, &ins, move |g| {
        let mut start = 0;
        let mut grads = Vec::with_capacity(sizes.len());
        for &s in &sizes {
            grads.push(Some(g.narrow(d as isize, start, s)?));
            start += s;
        }
        Ok(grads)
    }))
}

/// Stacks same-shape `tensors` along a new `dim` (PyTorch `torch.stack`).
pub fn stack<T: Scalar>(tensors: &[&DTensor<T>], dim: isize) -> Result<DTensor<T>> {
    let Some(first) = tensors.first() else {
        return Err(Error::InvalidArgument { context: "stack".into(), reason: "no tensors to stack".into() });
    };
    let d = norm_dim("stack", dim, first.ndim() + 1)?;
    let parts = tensors.iter().map(|t| t.unsqueeze(d as isize)).collect::<Result<Vec<_>>>()?;
    if let Some(t) = tensors.iter().find(|t| t.shape != first.shape) {
        return Err(Error::ShapeMismatch {
            context: "stack: every tensor must have the same shape".into(),
            expected: first.shape.clone(),
            actual: t.shape.clone(),
        });
    }
    cat(&parts.iter().collect::<Vec<_>>(), d as isize)
}
