//! Indexing by tensors of ids: `index_select` and `gather`.
//!
//! Ids are `i64`/`i32`, or floats holding whole numbers (as `embedding`'s), read as `i64`
//! whatever the indexed tensor's type (never converted to it: a bf16 or `u8` tensor would
//! round or wrap them); every element type can be indexed, integers included. Rules per mesh
//! dim:
//! `index_select(dim, index)` — the indexed dim of the input must be Replicate; other shards
//! of the input are kept; a sharded (1-D) index with a replicated input shards the output on
//! `dim`; Partial inputs stay Partial (linear). `gather(dim, index)` — input and index sharded
//! alike on a dim `e` ≠ `dim` of equal size keep it; an index sharded on `dim` with the input
//! replicated there shards the output on `dim`; a Partial input with a replicated index stays
//! Partial. The gradients scatter-add the output's gradient back, under the mirrored rules
//! (an output sharded on `dim` gives a Partial(sum) gradient).

use super::embedding::ids_i64;
use super::grad_kernels;
use super::slice::ALL_OPS;
use super::strategy::{partial_ops, select_pair, DimRule, Select};
use super::{new_output, norm_dim};
use crate::autograd::record;
use crate::dtensor::DTensor;
use crate::element::{Element, IndexElement, Scalar};
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::placement::{Placement, ReduceOp};

const R: Placement = Placement::Replicate;

/// Whether `index_select` / `gather` along `dim` keep the input's `Shard(e)`: not a shard of
/// the indexed dim (the ids address the whole dim; it is gathered first), any other one.
pub const fn index_keeps_shard(e: usize, dim: usize) -> bool {
    e != dim
}

fn sh(d: usize) -> Placement {
    Placement::Shard(d as isize)
}

/// Gradient of index_select: `g`'s slices added at `ids` along `d` into zeros of `shape`.
pub(crate) fn index_add<T: Element>(
    g: &DTensor<T>,
    ids: &DTensor<i64>,
    d: usize,
    shape: &[usize],
) -> Result<DTensor<T>> {
    let mut rs = vec![DimRule::new(&[R, R], R)];
    rs.extend((0..g.ndim()).filter(|&e| e != d).map(|e| DimRule::new(&[sh(e), R], sh(e))));
    rs.push(DimRule::new(&[sh(d), sh(0)], Placement::PARTIAL_SUM));
    for o in partial_ops(&[g], &[ReduceOp::Sum, ReduceOp::Avg]) {
        rs.push(DimRule::new(&[Placement::Partial(o), R], Placement::Partial(o)));
    }
    let (gi, ii, output) = select_pair("index_select_backward", g, ids, &rs, Select::default())?;
    let local = gi.local.index_add(d, &ii.local, shape[d])?;
    Ok(new_output(local, &gi.mesh, output, shape.to_vec()))
}

/// Gradient of gather: `g` added at the gathered positions of zeros of `shape`.
pub(crate) fn scatter_add<T: Element>(
    g: &DTensor<T>,
    ids: &DTensor<i64>,
    d: usize,
    shape: &[usize],
) -> Result<DTensor<T>> {
    let mut rs = vec![DimRule::new(&[R, R], R)];
    rs.extend(
        (0..g.ndim()).filter(|&e| e != d && g.shape[e] == shape[e]).map(|e| DimRule::new(&[sh(e), sh(e)], sh(e))),
    );
    rs.push(DimRule::new(&[sh(d), sh(d)], Placement::PARTIAL_SUM));
    for o in partial_ops(&[g], &[ReduceOp::Sum, ReduceOp::Avg]) {
        rs.push(DimRule::new(&[Placement::Partial(o), R], Placement::Partial(o)));
    }
    let (gi, ii, output) = select_pair("gather_backward", g, ids, &rs, Select::default())?;
    let (local_shape, _) = local_shape_and_offset(shape, gi.mesh.shape(), gi.mesh.coordinate(), &output);
    let local = gi.local.scatter_add(d, &ii.local, &local_shape)?;
    Ok(new_output(local, &gi.mesh, output, shape.to_vec()))
}

/// Indexing, for every element type (integer tensors never record a gradient).
impl<T: Scalar> DTensor<T> {
    /// The slices of `dim` at the ids of the 1-D `index` (PyTorch `index_select`); the
    /// gradient flows to `self`. `index` may be `i64`/`i32`, or floats holding whole numbers,
    /// read as `i64` whatever `T` is (a `u8` or bf16 tensor is indexed at any id of its dim);
    /// a negative or out-of-range id, or a float id that is not a whole number, is an
    /// [`Error::InvalidArgument`].
    pub fn index_select<I: IndexElement>(&self, dim: isize, index: &DTensor<I>) -> Result<DTensor<T>> {
        let index = &*ids_i64("index_select", index)?;
        let d = norm_dim("index_select", dim, self.ndim())?;
        if index.ndim() != 1 {
            return Err(Error::ShapeMismatch {
                context: "index_select: the index must be 1-D".into(),
                expected: vec![index.numel()],
                actual: index.shape.clone(),
            });
        }
        let mut rs = vec![DimRule::new(&[R, R], R)];
        rs.extend((0..self.ndim()).filter(|&e| index_keeps_shard(e, d)).map(|e| DimRule::new(&[sh(e), R], sh(e))));
        rs.push(DimRule::new(&[R, sh(0)], sh(d)));
        for o in partial_ops(&[self], &ALL_OPS) {
            rs.push(DimRule::new(&[Placement::Partial(o), R], Placement::Partial(o)));
        }
        let (xi, ii, output) = select_pair("index_select", self, index, &rs, Select::default())?;
        let xi = &*xi;
        let mut shape = xi.shape.clone();
        shape[d] = index.shape[0];
        let out = new_output(xi.local.index_select(d, &ii.local)?, &xi.mesh, output, shape);
        let (ids, in_shape) = (ii.into_owned(), xi.shape.clone());
        Ok(record("index_select_backward", out, &[xi], move |g| {
            Ok(vec![Some((grad_kernels::<T>()?.index_add)(g, &ids, d, &in_shape)?)])
        }))
    }

    /// PyTorch `gather(dim, index)`: `out[i][j] = self[i][index[i][j]]` for `dim = 1`, of the
    /// shape of `index` (same rank; other dims no larger than `self`'s). `index` holds ids as
    /// for [`index_select`](DTensor::index_select), read as `i64`.
    pub fn gather<I: IndexElement>(&self, dim: isize, index: &DTensor<I>) -> Result<DTensor<T>> {
        let index = &*ids_i64("gather", index)?;
        let d = norm_dim("gather", dim, self.ndim())?;
        let fits = index.ndim() == self.ndim() && (0..self.ndim()).all(|e| e == d || index.shape[e] <= self.shape[e]);
        if !fits {
            return Err(Error::ShapeMismatch {
                context: "gather: the index must have the input's rank and no larger dims".into(),
                expected: self.shape.clone(),
                actual: index.shape.clone(),
            });
        }
        let mut rs = vec![DimRule::new(&[R, R], R)];
        rs.extend(
            (0..self.ndim())
                .filter(|&e| index_keeps_shard(e, d) && index.shape[e] == self.shape[e])
                .map(|e| DimRule::new(&[sh(e), sh(e)], sh(e))),
        );
        rs.push(DimRule::new(&[R, sh(d)], sh(d)));
        for o in partial_ops(&[self], &ALL_OPS) {
            rs.push(DimRule::new(&[Placement::Partial(o), R], Placement::Partial(o)));
        }
        let (xi, ii, output) = select_pair("gather", self, index, &rs, Select::default())?;
        let xi = &*xi;
        let out = new_output(xi.local.gather(d, &ii.local)?, &xi.mesh, output, index.shape.clone());
        let (ids, in_shape) = (ii.into_owned(), xi.shape.clone());
        Ok(record("gather_backward", out, &[xi], move |g| {
            Ok(vec![Some((grad_kernels::<T>()?.scatter_add)(g, &ids, d, &in_shape)?)])
        }))
    }
}
