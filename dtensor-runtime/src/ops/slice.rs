//! Slicing: `narrow`, `slice`, `split`, `split_with_sizes`, `chunk`.
//!
//! Rule per mesh dim (PyTorch's slice strategy): `Shard(e)` with `e` ≠ the sliced dim is kept,
//! and so is a shard of the sliced dim when the slice is the whole dim (a no-op); a shard of
//! the sliced dim is otherwise redistributed to Replicate first; R and every Partial are kept
//! (slicing is linear). The gradient is the slice's gradient padded with zeros, under the same
//! rule. `split`/`chunk` unshard the dim once and then slice locally.

use super::strategy::{moved, partial_ops, select, DimRule, Select};
use super::{new_output, norm_dim};
use crate::autograd::record;
use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::placement::{Placement, ReduceOp};

/// Every reduce op: the Partial placements an op that moves or selects elements keeps.
pub(crate) const ALL_OPS: [ReduceOp; 5] =
    [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product];

/// Whether slicing or concatenating along tensor dim `dim` keeps a `Shard(shard_dim)` without
/// communication: only a shard of another dim (a shard of `dim` is gathered first). Also the
/// typed layer's rule for narrow, split, chunk and cat.
pub const fn slice_keeps_shard(shard_dim: usize, dim: usize) -> bool {
    shard_dim != dim
}

/// Rules of an op that keeps every placement except shards of `dim` (unless `dim_ok`).
pub(crate) fn keep_except_dim<T: Scalar>(x: &DTensor<T>, dim: usize, dim_ok: bool, pops: &[ReduceOp]) -> Vec<DimRule> {
    let mut rs = vec![DimRule::new(&[Placement::Replicate], Placement::Replicate)];
    rs.extend(
        (0..x.ndim())
            .filter(|&e| slice_keeps_shard(e, dim) || dim_ok)
            .map(|e| DimRule::new(&[Placement::Shard(e as isize)], Placement::Shard(e as isize))),
    );
    rs.extend(
        partial_ops(&[x], pops).into_iter().map(|o| DimRule::new(&[Placement::Partial(o)], Placement::Partial(o))),
    );
    rs
}

/// `x` with every shard of `dim` redistributed to Replicate (recorded for autograd).
pub(crate) fn unshard_dim<T: Scalar>(x: &DTensor<T>, dim: usize, op: &'static str) -> Result<DTensor<T>> {
    if !x.placements.iter().any(|p| p.is_shard_on(dim)) {
        return Ok(x.clone());
    }
    let to: Vec<Placement> =
        x.placements.iter().map(|p| if p.is_shard_on(dim) { Placement::Replicate } else { *p }).collect();
    Ok(moved(op, 0, x, &to, None)?.into_owned())
}

fn narrow_impl<T: Scalar>(x: &DTensor<T>, d: usize, start: usize, len: usize) -> Result<DTensor<T>> {
    let full = x.shape[d];
    if start.checked_add(len).is_none_or(|end| end > full) {
        return Err(Error::InvalidArgument {
            context: "narrow".into(),
            reason: format!("start {start} + length {len} exceeds dim {d} of size {full}"),
        });
    }
    let rs = keep_except_dim(x, d, start == 0 && len == full, &ALL_OPS);
    let c = select("narrow", &[x], &rs, Select::default())?;
    let xi = &*c.inputs[0];
    let mut shape = xi.shape.clone();
    shape[d] = len;
    let (local_shape, _) = local_shape_and_offset(&shape, xi.mesh.shape(), xi.mesh.coordinate(), &c.output);
    let mut at = vec![0; shape.len()];
    if !xi.placements.iter().any(|p| p.is_shard_on(d)) {
        at[d] = start;
    }
    let out = new_output(xi.local.slice(&at, &local_shape)?, &xi.mesh, c.output, shape);
    Ok(record("narrow_backward", out, &[xi], move |g| Ok(vec![Some(pad_dim(g, d, start, full)?)])))
}

/// The gradient of a narrow: `g` placed at `start` of zeros whose `dim` has size `full`.
fn pad_dim<T: Scalar>(g: &DTensor<T>, d: usize, start: usize, full: usize) -> Result<DTensor<T>> {
    let rs = keep_except_dim(g, d, start == 0 && g.shape[d] == full, &ALL_OPS);
    let c = select("narrow_backward", &[g], &rs, Select::default())?;
    let gi = &*c.inputs[0];
    let mut shape = gi.shape.clone();
    shape[d] = full;
    let (local_shape, _) = local_shape_and_offset(&shape, gi.mesh.shape(), gi.mesh.coordinate(), &c.output);
    let mut at = vec![0; shape.len()];
    if !gi.placements.iter().any(|p| p.is_shard_on(d)) {
        at[d] = start;
    }
    Ok(new_output(gi.local.pad_into(&local_shape, &at)?, &gi.mesh, c.output, shape))
}

impl<T: Scalar> DTensor<T> {
    /// `length` elements of `dim` from `start` (PyTorch `narrow`).
    pub fn narrow(&self, dim: isize, start: usize, length: usize) -> Result<DTensor<T>> {
        let d = norm_dim("narrow", dim, self.ndim())?;
        narrow_impl(self, d, start, length)
    }

    /// `self[.., start:end, ..]` along `dim` with Python's rules: negative indices count from
    /// the end, out-of-range bounds are clamped, an empty range gives an empty dim (step 1).
    pub fn slice(&self, dim: isize, start: isize, end: isize) -> Result<DTensor<T>> {
        let d = norm_dim("slice", dim, self.ndim())?;
        let n = self.shape[d] as isize;
        let clamp = |i: isize| if i < 0 { (i + n).max(0) } else { i.min(n) };
        let (s, e) = (clamp(start), clamp(end));
        narrow_impl(self, d, s as usize, (e - s).max(0) as usize)
    }

    /// Pieces of `sizes` along `dim` (PyTorch `split_with_sizes`; the sizes must add up to
    /// the dim). A shard of `dim` is gathered once, then every piece is a local slice.
    pub fn split_with_sizes(&self, sizes: &[usize], dim: isize) -> Result<Vec<DTensor<T>>> {
        let d = norm_dim("split", dim, self.ndim())?;
        if sizes.iter().sum::<usize>() != self.shape[d] {
            return Err(Error::InvalidArgument {
                context: "split_with_sizes".into(),
                reason: format!("sizes {sizes:?} do not add up to dim {d} of size {}", self.shape[d]),
            });
        }
        let x = unshard_dim(self, d, "split")?;
        let mut start = 0;
        let mut out = Vec::with_capacity(sizes.len());
        for &s in sizes {
            out.push(narrow_impl(&x, d, start, s)?);
            start += s;
        }
        Ok(out)
    }

    /// Pieces of `split_size` along `dim`, the last one smaller (PyTorch `split`).
    pub fn split(&self, split_size: usize, dim: isize) -> Result<Vec<DTensor<T>>> {
        let d = norm_dim("split", dim, self.ndim())?;
        let n = self.shape[d];
        if split_size == 0 && n > 0 {
            return Err(Error::InvalidArgument {
                context: "split".into(),
                reason: "split_size must be positive".into(),
            });
        }
        let mut sizes = vec![split_size; n.checked_div(split_size).unwrap_or(0)];
        if split_size > 0 && !n.is_multiple_of(split_size) {
            sizes.push(n % split_size);
        }
        if sizes.is_empty() {
            sizes.push(0);
        }
        self.split_with_sizes(&sizes, dim)
    }

    /// `chunks` pieces of `ceil(n / chunks)` along `dim` (PyTorch `chunk`: fewer pieces when
    /// the dim is too small).
    pub fn chunk(&self, chunks: usize, dim: isize) -> Result<Vec<DTensor<T>>> {
        let d = norm_dim("chunk", dim, self.ndim())?;
        if chunks == 0 {
            return Err(Error::InvalidArgument { context: "chunk".into(), reason: "chunks must be positive".into() });
        }
        self.split(self.shape[d].div_ceil(chunks).max(1), dim)
    }
}
