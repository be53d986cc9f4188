//! Reductions: sum, mean, max, min over some dims or all; argmax and argmin over one dim.
//!
//! Rules per mesh dim: R → R; `Shard(d)` with `d` reduced → Partial(sum) (sum, mean),
//! Partial(max) (max) or Partial(min) (min); `Shard(d)` otherwise → `Shard(d')` (remapped when
//! the dim is dropped); Partial(sum/avg) stays for sum and mean, Partial(max) for max,
//! Partial(min) for min. `mean` is a sum then a scale by the global count, so it is exact with
//! uneven shards. max and min propagate NaN and, having no identity, refuse an empty reduced
//! dim (PyTorch's error). argmax/argmin cannot combine per-shard answers: the reduced dim is
//! made Replicate first (PyTorch), other shards are kept, a Partial input is reduced.

use super::dispatch::{dispatch, OpDef, Saved};
use super::strategy::{partial_ops, reduce_partials, select, DimRule, Select};
use super::{new_output, norm_dim};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::Result;
use crate::op::Reduction;
use crate::placement::fmt_placements;
use crate::placement::{Placement, ReduceOp};
use crate::storage::empty_reduction;
use crate::storage::Storage;

/// The reductions (`mean` is a sum, then a scale).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ReductionKind {
    /// Sum of the reduced elements.
    Sum,
    /// Largest reduced element.
    Max,
    /// Smallest reduced element.
    Min,
}

/// What a reduction makes of a shard of a reduced dim (`Partial(sum)` / `Partial(max)`), and
/// the Partial inputs it keeps (it commutes with them); any other Partial is reduced first.
/// The one table of these rules: the dynamic ops select with it and the typed layer's rules
/// are generated from it.
pub const fn reduction_rule(kind: ReductionKind) -> (ReduceOp, &'static [ReduceOp]) {
    match kind {
        ReductionKind::Sum => (ReduceOp::Sum, &[ReduceOp::Sum, ReduceOp::Avg]),
        ReductionKind::Max => (ReduceOp::Max, &[ReduceOp::Max]),
        ReductionKind::Min => (ReduceOp::Min, &[ReduceOp::Min]),
    }
}

/// Does reduction `kind` keep a `Partial(op)` input (see [`reduction_rule`])?
pub const fn reduction_keeps(kind: ReductionKind, op: ReduceOp) -> bool {
    crate::placement::contains_op(reduction_rule(kind).1, op)
}

/// Whether argmax / argmin over `dim` keeps a `Shard(d)` input: not a shard of the reduced
/// dim (per-shard indices do not combine; PyTorch replicates that dim first), any other one.
pub const fn arg_reduce_keeps_shard(d: usize, dim: usize) -> bool {
    d != dim
}

/// Whether argmax / argmin keep a `Partial(op)` input: never (the index of a partial value's
/// extreme says nothing about the reduced value's); a Partial input is reduced first.
pub const fn arg_reduce_keeps_partial(_op: ReduceOp) -> bool {
    false
}

fn dims_of(op: &str, dims: &[isize], ndim: usize) -> Result<Vec<usize>> {
    let mut out = dims.iter().map(|&d| norm_dim(op, d, ndim)).collect::<Result<Vec<_>>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn reduce<T: Element>(
    x: &DTensor<T>,
    op: &'static str,
    bwd: &'static str,
    dims: &[usize],
    keepdim: bool,
    kind: ReductionKind,
) -> Result<DTensor<T>> {
    let nd = x.ndim();
    let remap = |d: usize| if keepdim { d } else { d - dims.iter().filter(|&&r| r < d).count() };
    let (reduced, kept_ops) = reduction_rule(kind);
    if kind != ReductionKind::Sum {
        if let Some(&d) = dims.iter().find(|&&d| x.shape[d] == 0) {
            return Err(empty_reduction(op, d));
        }
    }
    let mut rs = vec![DimRule::new(&[Placement::Replicate], Placement::Replicate)];
    for d in 0..nd {
        let out = if dims.contains(&d) { Placement::Partial(reduced) } else { Placement::Shard(remap(d) as isize) };
        rs.push(DimRule::new(&[Placement::Shard(d as isize)], out));
    }
    for o in partial_ops(&[x], kept_ops) {
        rs.push(DimRule::new(&[Placement::Partial(o)], Placement::Partial(o)));
    }
    let keep = reduce_partials(&x.placements, kept_ops);
    let kernel = match kind {
        ReductionKind::Sum => Reduction::Sum,
        ReductionKind::Max => Reduction::Max,
        ReductionKind::Min => Reduction::Min,
    };
    let mut shape = Vec::with_capacity(nd);
    for (d, &s) in x.shape.iter().enumerate() {
        if !dims.contains(&d) {
            shape.push(s);
        } else if keepdim {
            shape.push(1);
        }
    }
    let def = OpDef {
        name: op,
        rules: rs,
        knobs: Select { follow: Some(&keep), ..Select::default() },
        out_shape: shape,
        kernel: |l: &[&Storage<T>]| l[0].reduce(kernel, dims, keepdim),
        backward: Some((bwd, |(ins, out): Saved<'_, T>| {
            let sx = ins[0].detach();
            let sy = out.detach();
            let dims = dims.to_vec();
            move |g: &DTensor<T>| {
                // The gradient with the reduced dims kept as size 1.
                let keep_shape: Vec<usize> =
                    sx.shape.iter().enumerate().map(|(d, &s)| if dims.contains(&d) { 1 } else { s }).collect();
                let gk = if keepdim { g.clone() } else { g.reshape_to(&keep_shape)? };
                let gx = match kind {
                    ReductionKind::Sum => gk.expand_like(&sx)?,
                    ReductionKind::Max | ReductionKind::Min => {
                        // amax semantics: the gradient is shared evenly between tied maxima.
                        let yk = if keepdim { sy.clone() } else { sy.reshape_to(&keep_shape)? };
                        let mask = sx.eq_mask(&yk)?;
                        let count = mask.sum_dims_usize(&dims, true)?;
                        mask.mul(&gk.div(&count)?)?
                    }
                };
                Ok(vec![Some(gx)])
            }
        })),
    };
    dispatch(def, &[x])
}

impl<T: Element> DTensor<T> {
    /// Sum over `dim` (negative counts from the end). Over a sharded dim the result is
    /// Partial(sum) and no communication happens.
    pub fn sum_dim(&self, dim: isize, keepdim: bool) -> Result<DTensor<T>> {
        self.sum_dims(&[dim], keepdim)
    }

    /// Sum over several dims.
    pub fn sum_dims(&self, dims: &[isize], keepdim: bool) -> Result<DTensor<T>> {
        let d = dims_of("sum", dims, self.ndim())?;
        reduce(self, "sum", "sum_backward", &d, keepdim, ReductionKind::Sum)
    }

    pub(crate) fn sum_dims_usize(&self, dims: &[usize], keepdim: bool) -> Result<DTensor<T>> {
        reduce(self, "sum", "sum_backward", dims, keepdim, ReductionKind::Sum)
    }

    /// Sum of every element: a 0-d tensor (Partial(sum) when the input is sharded).
    pub fn sum(&self) -> Result<DTensor<T>> {
        let all: Vec<usize> = (0..self.ndim()).collect();
        reduce(self, "sum", "sum_backward", &all, false, ReductionKind::Sum)
    }

    /// Mean over `dim`.
    pub fn mean_dim(&self, dim: isize, keepdim: bool) -> Result<DTensor<T>> {
        let d = norm_dim("mean", dim, self.ndim())?;
        let n = self.shape[d];
        self.sum_dims_usize(&[d], keepdim)?.mul_scalar(T::one() / T::of_f64(n as f64))
    }

    /// Mean of every element (0-d).
    pub fn mean(&self) -> Result<DTensor<T>> {
        let n = self.numel();
        self.sum()?.mul_scalar(T::one() / T::of_f64(n as f64))
    }

    /// Maximum over `dim` (values; PyTorch `amax`). Over a sharded dim the result is
    /// Partial(max). The gradient is shared evenly between tied maxima.
    pub fn max_dim(&self, dim: isize, keepdim: bool) -> Result<DTensor<T>> {
        let d = norm_dim("max", dim, self.ndim())?;
        reduce(self, "max", "max_backward", &[d], keepdim, ReductionKind::Max)
    }

    /// Maximum of every element (0-d). NaN if any element is NaN; an error for an empty
    /// tensor (PyTorch).
    pub fn max(&self) -> Result<DTensor<T>> {
        let all: Vec<usize> = (0..self.ndim()).collect();
        reduce(self, "max", "max_backward", &all, false, ReductionKind::Max)
    }

    /// Minimum over `dim` (values; PyTorch `amin`). Over a sharded dim the result is
    /// Partial(min). The gradient is shared evenly between tied minima.
    pub fn min_dim(&self, dim: isize, keepdim: bool) -> Result<DTensor<T>> {
        let d = norm_dim("min", dim, self.ndim())?;
        reduce(self, "min", "min_backward", &[d], keepdim, ReductionKind::Min)
    }

    /// Minimum of every element (0-d). NaN if any element is NaN; an error for an empty tensor.
    pub fn min(&self) -> Result<DTensor<T>> {
        let all: Vec<usize> = (0..self.ndim()).collect();
        reduce(self, "min", "min_backward", &all, false, ReductionKind::Min)
    }

    /// Index of the maximum along `dim` (first occurrence; a NaN counts as the maximum), as
    /// an `i64` tensor (PyTorch's int64: an index in the element type would round, e.g. in
    /// bf16 beyond 256); no gradient. An empty `dim` is an error (PyTorch).
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<DTensor<i64>> {
        arg_reduce(self, dim, keepdim, true)
    }

    /// Index of the minimum along `dim` (first occurrence; a NaN counts as the minimum), as
    /// an `i64` tensor, as [`argmax`](DTensor::argmax).
    pub fn argmin(&self, dim: isize, keepdim: bool) -> Result<DTensor<i64>> {
        arg_reduce(self, dim, keepdim, false)
    }
}

/// argmax (`max`) or argmin over `dim`.
fn arg_reduce<T: Element>(x: &DTensor<T>, dim: isize, keepdim: bool, max: bool) -> Result<DTensor<i64>> {
    let op = if max { "argmax" } else { "argmin" };
    let d = norm_dim(op, dim, x.ndim())?;
    if x.shape[d] == 0 {
        return Err(empty_reduction(op, d));
    }
    let remap = |e: usize| if keepdim || e < d { e } else { e - 1 };
    let mut rs = vec![DimRule::new(&[Placement::Replicate], Placement::Replicate)];
    rs.extend(
        (0..x.ndim())
            .filter(|&e| arg_reduce_keeps_shard(e, d))
            .map(|e| DimRule::new(&[Placement::Shard(e as isize)], Placement::Shard(remap(e) as isize))),
    );
    for o in partial_ops(&[x], &super::slice::ALL_OPS).into_iter().filter(|&o| arg_reduce_keeps_partial(o)) {
        rs.push(DimRule::new(&[Placement::Partial(o)], Placement::Partial(o)));
    }
    let c = select(op, &[x], &rs, Select::default())?;
    let xi = &*c.inputs[0];
    debug_assert!(!xi.placements.iter().any(|p| p.is_shard_on(d)), "{op} on {}", fmt_placements(&xi.placements));
    let mut shape = x.shape.clone();
    if keepdim {
        shape[d] = 1;
    } else {
        shape.remove(d);
    }
    Ok(new_output(xi.local.arg_reduce(d, max, keepdim)?, &xi.mesh, c.output, shape))
}
