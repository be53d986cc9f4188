//! `softmax` / `log_softmax` along one dim.
//!
//! Rule: R → R and `Shard(e)` → `Shard(e)` for `e` ≠ the softmax dim, computed locally; a
//! Partial input is reduced first. A tensor sharded *on* the softmax dim uses the two-pass
//! trick instead of gathering it: a local max reduced to a Partial(max) of one element per row
//! (all-reduced), then a local sum of exponentials reduced the same way — composed of the
//! dynamic ops, so only `[.., 1]`-sized statistics travel and autograd comes for free.

use super::dispatch::{dispatch, OpDef, Saved};
use super::pointwise::{partials_kept, UnaryKind};
use super::strategy::{reduce_partials, DimRule, Select};
use super::{new_output, norm_dim};
use crate::autograd::no_grad;
use crate::comm::debug::op_scope;
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::Result;
use crate::op::SoftmaxKind;
use crate::placement::Placement;
use crate::storage::Storage;

/// Softmax of a tensor sharded on `d`: two all-reduces of per-row statistics.
fn two_pass<T: Element>(x: &DTensor<T>, d: usize, log: bool) -> Result<DTensor<T>> {
    let dim = d as isize;
    // The per-row statistics are reduced explicitly to `x`'s layout without its shard of `d`,
    // so that the element-wise steps below run as they are laid out and the output keeps
    // `x`'s placements (left to the strategy search, a tie could shard a Replicate mesh dim).
    let stats: Vec<Placement> = x
        .placements
        .iter()
        .map(|p| match p {
            Placement::Shard(e) if *e as usize != d => *p,
            _ => Placement::Replicate,
        })
        .collect();
    // The shift does not change the result, so it carries no gradient.
    let m = no_grad(|| x.max_dim(dim, true)?.redistribute(&stats))?;
    let z = x.sub(&m)?;
    let s = z.exp()?.sum_dim(dim, true)?.redistribute(&stats)?;
    if log {
        z.sub(&s.log()?)
    } else {
        z.exp()?.div(&s)
    }
}

fn softmax_impl<T: Element>(x: &DTensor<T>, dim: isize, log: bool) -> Result<DTensor<T>> {
    let op = if log { "log_softmax" } else { "softmax" };
    let d = norm_dim(op, dim, x.ndim())?;
    if x.placements.iter().any(|p| p.is_shard_on(d)) {
        return op_scope(op, || two_pass(x, d, log));
    }
    let mut rs = vec![DimRule::new(&[Placement::Replicate], Placement::Replicate)];
    for e in (0..x.ndim()).filter(|&e| e != d) {
        rs.push(DimRule::new(&[Placement::Shard(e as isize)], Placement::Shard(e as isize)));
    }
    let keep = reduce_partials(&x.placements, partials_kept(UnaryKind::Softmax));
    let kind = if log { SoftmaxKind::LogSoftmax } else { SoftmaxKind::Softmax };
    let def = OpDef {
        name: op,
        rules: rs,
        knobs: Select { follow: Some(&keep), ..Select::default() },
        out_shape: x.shape.clone(),
        kernel: |l: &[&Storage<T>]| l[0].softmax(d, kind),
        backward: Some((if log { "log_softmax_backward" } else { "softmax_backward" }, |(_, out): Saved<'_, T>| {
            let sy = out.detach();
            let dim = d as isize;
            move |g: &DTensor<T>| {
                // Rows are whole on every rank (the softmax dim is not sharded): when the
                // gradient is laid out like the output, one local kernel computes the whole
                // backward.
                if g.placements == sy.placements && !g.placements.iter().any(|p| p.is_partial()) {
                    let local = sy.local.softmax_backward(&g.local, d, kind)?;
                    return Ok(vec![Some(new_output(local, &sy.mesh, sy.placements.clone(), sy.shape.clone()))]);
                }
                let gx = if log {
                    g.sub(&sy.exp()?.mul(&g.sum_dim(dim, true)?)?)?
                } else {
                    sy.mul(&g.sub(&g.mul(&sy)?.sum_dim(dim, true)?)?)?
                };
                Ok(vec![Some(gx)])
            }
        })),
    };
    dispatch(def, &[x])
}

impl<T: Element> DTensor<T> {
    /// Softmax along `dim`.
    pub fn softmax(&self, dim: isize) -> Result<DTensor<T>> {
        softmax_impl(self, dim, false)
    }

    /// Log-softmax along `dim` (numerically stable).
    pub fn log_softmax(&self, dim: isize) -> Result<DTensor<T>> {
        softmax_impl(self, dim, true)
    }
}
