//! Masking and selection: comparisons returning masks, `where`, `masked_fill`, `tril`/`triu`.
//!
//! Masks hold 1 (true) and 0 (false): tensors of the same element type (`lt_mask`, ...) or
//! byte masks (`DTensor<u8>`, from [`DTensor::compare_mask`]); any non-zero value counts as
//! true where a mask is read, and `where_`/`masked_fill` read a mask of any element type.
//! Comparisons, `where_` and `masked_fill` work on every element type (integer tensors
//! included; they never record a gradient), `tril`/`triu` on floats.
//!
//! Rules per mesh dim: comparisons and `where` follow the element-wise rule of
//! [`pointwise`](super::pointwise) with no Partial strategy (a Partial input is reduced first,
//! as PyTorch's non-linear pointwise ops); the mask never carries a gradient. `tril`/`triu`
//! keep every placement: the kernel reads the shard's global row and column offsets, so a
//! shard of the matrix dims masks its own part without communication (PyTorch replicates the
//! two matrix dims instead); they are linear, so Partial(sum/avg) stays.

use super::dispatch::{dispatch, no_backward, OpDef};
use super::grad_kernels;
use super::new_output;
use super::pointwise::{rules, Linearity};
use super::strategy::{partial_ops, select, DimRule, Select};
use crate::autograd::{input_needs_grad, no_grad, record, recording};
use crate::dtensor::DTensor;
use crate::element::{Element, Scalar};
use crate::error::{Error, Result};
use crate::op::BinaryOp;
use crate::placement::{contains_op, Placement, ReduceOp};
use crate::storage::{broadcast_shape, Storage};
use std::borrow::Cow;

/// A 0-d replicated tensor of value `v` on `like`'s mesh and device (no history).
pub(crate) fn scalar_like<T: Scalar>(like: &DTensor<T>, v: T) -> Result<DTensor<T>> {
    let local = like.local.new_full(&[], v)?;
    Ok(DTensor::new_unchecked(local, like.mesh.clone(), vec![Placement::Replicate; like.mesh.ndim()], vec![], None))
}

/// The comparison `op` of `a` and `b` (broadcasting) as a 0/1 mask of their element type, with
/// no history (a Partial input is reduced first, unrecorded).
fn compare<T: Scalar>(op: BinaryOp, a: &DTensor<T>, b: &DTensor<T>) -> Result<DTensor<T>> {
    let out_shape = broadcast_shape(op.name(), &a.shape, &b.shape)?;
    let rs = rules(&[&a.shape, &b.shape], &out_shape, Linearity::None, &[]);
    let def = OpDef {
        name: op.name(),
        rules: rs,
        knobs: Select::default(),
        out_shape,
        kernel: |l: &[&Storage<T>]| l[0].compare(op, l[1]),
        backward: no_backward(),
    };
    no_grad(|| dispatch(def, &[a, b]))
}

/// The mask `m` as a mask of `T` (what `where_impl` reads: zero or not): `m` itself when it is
/// one of `T`; a plain cast when `m` is an integer mask and `T` a float, since every non-zero
/// integer casts to a non-zero float (this also keeps a `u8` mask off the integer comparison
/// kernels CUDA lacks), unless `m` is Partial (a wrapping integer sum of the partials is not
/// the float sum of their casts); else its non-zero test cast to `T` (a plain cast would read
/// 0.5 as an integer 0, 256 as a `u8` 0 and a tiny f64 as an f32 0).
fn mask_as<T: Scalar, M: Scalar>(m: &DTensor<M>) -> Result<Cow<'_, DTensor<T>>> {
    if M::DTYPE == T::DTYPE {
        return super::in_type::<T, M>(m);
    }
    if !M::DTYPE.is_float() && T::DTYPE.is_float() && !m.placements.iter().any(Placement::is_partial) {
        return no_grad(|| m.cast::<T>()).map(Cow::Owned);
    }
    compare(BinaryOp::Ne, m, &scalar_like(m, M::zero())?)?.cast::<T>().map(Cow::Owned)
}

/// `a` where `cond` is non-zero, else `b`, broadcasting all three.
fn where_impl<T: Scalar>(cond: &DTensor<T>, a: &DTensor<T>, b: &DTensor<T>) -> Result<DTensor<T>> {
    let out_shape = broadcast_shape("where", &broadcast_shape("where", &cond.shape, &a.shape)?, &b.shape)?;
    let rs = rules(&[&cond.shape, &a.shape, &b.shape], &out_shape, Linearity::None, &[]);
    let c = select("where", &[cond, a, b], &rs, Select::default())?;
    let (ci, ai, bi) = (&*c.inputs[0], &*c.inputs[1], &*c.inputs[2]);
    let out = new_output(ci.local.where_(&ai.local, &bi.local)?, &ai.mesh, c.output, out_shape);
    if !recording(&[ai, bi]) {
        return Ok(out);
    }
    let (sc, sa_shape, sb_shape) = (ci.detach(), ai.shape.clone(), bi.shape.clone());
    // The mask is no differentiable input: its slot gets no gradient.
    Ok(record("where_backward", out, &[&ci.detach(), ai, bi], move |g| {
        let k = grad_kernels::<T>()?;
        let zero = scalar_like(g, T::zero())?;
        let ga = if input_needs_grad(1) { Some((k.sum_to)(where_impl(&sc, g, &zero)?, &sa_shape)?) } else { None };
        let gb = if input_needs_grad(2) { Some((k.sum_to)(where_impl(&sc, &zero, g)?, &sb_shape)?) } else { None };
        Ok(vec![None, ga, gb])
    }))
}

/// The Partial reductions `tril`/`triu` keep: the sums and averages (the op is linear).
pub const TRI_PARTIALS: [ReduceOp; 2] = [ReduceOp::Sum, ReduceOp::Avg];

/// Whether `tril`/`triu` keep a `Partial(op)` input as is: the one rule of both layers (the
/// runtime's strategies and the typed layer's `TriRule` are generated from it).
pub const fn tri_keeps_partial(op: ReduceOp) -> bool {
    contains_op(&TRI_PARTIALS, op)
}

fn tri<T: Element>(x: &DTensor<T>, lower: bool, diagonal: i64) -> Result<DTensor<T>> {
    let op = if lower { "tril" } else { "triu" };
    if x.ndim() < 2 {
        return Err(Error::InvalidArgument { context: op.into(), reason: "needs a tensor of at least 2 dims".into() });
    }
    let mut rs = vec![DimRule::new(&[Placement::Replicate], Placement::Replicate)];
    rs.extend((0..x.ndim()).map(|d| DimRule::new(&[Placement::Shard(d as isize)], Placement::Shard(d as isize))));
    rs.extend(
        partial_ops(&[x], &TRI_PARTIALS)
            .into_iter()
            .map(|o| DimRule::new(&[Placement::Partial(o)], Placement::Partial(o))),
    );
    let c = select(op, &[x], &rs, Select::default())?;
    let xi = &*c.inputs[0];
    let off = xi.local_offset();
    let nd = xi.ndim();
    let local = xi.local.tri(lower, diagonal, off[nd - 2], off[nd - 1])?;
    let out = new_output(local, &xi.mesh, c.output, xi.shape.clone());
    Ok(record("tri_backward", out, &[xi], move |g| Ok(vec![Some(tri(g, lower, diagonal)?)])))
}

/// Comparisons and selection, for every element type (integers included).
impl<T: Scalar> DTensor<T> {
    /// 1 where `self == other` (broadcasting), else 0; no gradient.
    pub fn eq_mask(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        compare(BinaryOp::Eq, self, other)
    }

    /// 1 where `self != other` (broadcasting), else 0; no gradient.
    pub fn ne_mask(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        compare(BinaryOp::Ne, self, other)
    }

    /// 1 where `self < other` (broadcasting), else 0; no gradient.
    pub fn lt_mask(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        compare(BinaryOp::Lt, self, other)
    }

    /// 1 where `self <= other` (broadcasting), else 0; no gradient.
    pub fn le_mask(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        compare(BinaryOp::Le, self, other)
    }

    /// 1 where `self > other` (broadcasting), else 0; no gradient.
    pub fn gt_mask(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        compare(BinaryOp::Gt, self, other)
    }

    /// 1 where `self >= other` (broadcasting), else 0; no gradient.
    pub fn ge_mask(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        compare(BinaryOp::Ge, self, other)
    }

    /// The comparison `op` (`Eq`, `Ne`, `Lt`, `Le`, `Gt`, `Ge`) of `self` and `other`
    /// (broadcasting; any element type, integers compare exactly) as a byte mask: 1 where it holds, else 0; no gradient. Any other op is
    /// an [`Error::InvalidArgument`].
    ///
    /// Why `u8` and not `bool`: PyTorch's `torch.bool` mask maps to this `u8` 0/1 mask. Every
    /// element type is `bytemuck::Pod`, so collectives, checkpoints and safetensors files move
    /// its raw bytes; a `bool` holding a byte other than 0 or 1 would be undefined behaviour,
    /// and a received byte is never validated. A `u8` has no invalid values, and mask readers
    /// (`where_`, `masked_fill`) treat any non-zero byte as true.
    pub fn compare_mask(&self, op: BinaryOp, other: &DTensor<T>) -> Result<DTensor<u8>> {
        use BinaryOp::{Eq, Ge, Gt, Le, Lt, Ne};
        if !matches!(op, Eq | Ne | Lt | Le | Gt | Ge) {
            return Err(Error::InvalidArgument {
                context: "compare_mask".into(),
                reason: format!("{op:?} is not a comparison"),
            });
        }
        compare(op, self, other)?.cast::<u8>()
    }

    /// PyTorch `self.where(condition, other)`: `self` where `condition` is non-zero, else
    /// `other` (broadcasting all three). The mask may be of any element type (a `u8` byte
    /// mask, or `T`). Gradients flow to `self` and `other`, not the mask.
    pub fn where_<M: Scalar>(&self, condition: &DTensor<M>, other: &DTensor<T>) -> Result<DTensor<T>> {
        where_impl(&*mask_as::<T, M>(condition)?, self, other)
    }

    /// `value` where `mask` is non-zero, else `self` (PyTorch `masked_fill`; `mask`
    /// broadcasts to `self`). `value` may be infinite (e.g. `-inf` before a softmax).
    /// The mask may be of any element type (a `u8` byte mask, or `T`).
    pub fn masked_fill<M: Scalar>(&self, mask: &DTensor<M>, value: T) -> Result<DTensor<T>> {
        let mask = &*mask_as::<T, M>(mask)?;
        let out = broadcast_shape("masked_fill", &mask.shape, &self.shape)?;
        if out != self.shape {
            return Err(Error::ShapeMismatch {
                context: "masked_fill: the mask must broadcast to the tensor".into(),
                expected: self.shape.clone(),
                actual: mask.shape.clone(),
            });
        }
        where_impl(mask, &scalar_like(self, value)?, self)
    }
}

/// Triangles: float tensors only (their kernels are the float ones).
impl<T: Element> DTensor<T> {
    /// The lower triangle of the last two dims (PyTorch `tril(diagonal)`), zeros above.
    pub fn tril(&self, diagonal: i64) -> Result<DTensor<T>> {
        tri(self, true, diagonal)
    }

    /// The upper triangle of the last two dims (PyTorch `triu(diagonal)`), zeros below.
    pub fn triu(&self, diagonal: i64) -> Result<DTensor<T>> {
        tri(self, false, diagonal)
    }
}
