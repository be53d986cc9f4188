//! `layer_norm` and `rms_norm` over the trailing `normalized_shape` dims, with an optional
//! affine weight (and bias).
//!
//! Rule per mesh dim (PyTorch 2.15's layer-norm strategy): the input may be sharded on a
//! non-normalised dim, which the output keeps; the normalised dims are Replicate (a shard of
//! one is gathered first), as are the weight and bias; a Partial input is reduced first (the
//! op is not linear). On a legal layout every statistic is local: the op then computes
//! `(x - mean)·rsqrt(var + eps)·w + b` (or `x·rsqrt(mean(x²) + eps)·w`) from the dynamic ops,
//! without communication, and autograd differentiates that composition, after reducing a
//! Partial incoming gradient to the output's layout. The weight and bias gradients are sums
//! over the (possibly sharded) batch dims: Partial(sum) until they reach the parameters.

use super::strategy::{select, DimRule, Select};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::placement::Placement;

const R: Placement = Placement::Replicate;

/// Whether `layer_norm` / `rms_norm` of a rank-`ndim` input normalised over its trailing
/// `normalized` dims keeps a `Shard(dim)` of it as is (every statistic then stays local): only
/// a dim it does not normalise. The one rule of both layers: the runtime's strategies and the
/// typed layer's `NormRule` are generated from it.
pub const fn norm_keeps_shard(dim: usize, ndim: usize, normalized: usize) -> bool {
    dim + normalized < ndim
}

fn norm<T: Element>(
    op: &'static str,
    x: &DTensor<T>,
    normalized_shape: &[usize],
    weight: Option<&DTensor<T>>,
    bias: Option<&DTensor<T>>,
    eps: f64,
) -> Result<DTensor<T>> {
    let (nd, k) = (x.ndim(), normalized_shape.len());
    if k == 0 || k > nd || x.shape[nd - k..] != *normalized_shape {
        return Err(Error::ShapeMismatch {
            context: format!("{op}: normalized_shape must be the trailing dims of the input"),
            expected: normalized_shape.to_vec(),
            actual: x.shape.clone(),
        });
    }
    let count: usize = normalized_shape.iter().product();
    if count == 0 {
        return Err(Error::InvalidArgument { context: op.into(), reason: "normalized_shape has no elements".into() });
    }
    for (what, t) in [("weight", weight), ("bias", bias)] {
        if let Some(t) = t {
            if t.shape != normalized_shape {
                return Err(Error::ShapeMismatch {
                    context: format!("{op}: {what} must have the normalized shape"),
                    expected: normalized_shape.to_vec(),
                    actual: t.shape.clone(),
                });
            }
        }
    }
    let mut inputs = vec![x];
    inputs.extend(weight);
    inputs.extend(bias);
    let n = inputs.len();
    let with_rest = |p: Placement| {
        let mut v = vec![R; n];
        v[0] = p;
        v
    };
    let mut rs = vec![DimRule::new(&vec![R; n], R)];
    rs.extend(
        (0..nd)
            .filter(|&e| norm_keeps_shard(e, nd, k))
            .map(|e| DimRule::new(&with_rest(Placement::Shard(e as isize)), Placement::Shard(e as isize))),
    );
    let c = select(op, &inputs, &rs, Select::default())?;
    let xi = &*c.inputs[0];
    let dims: Vec<isize> = (nd - k..nd).map(|d| d as isize).collect();
    let inv = T::of_f64(1.0 / count as f64);
    let eps = T::of_f64(eps);
    let mut y = if op == "rms_norm" {
        let ms = xi.mul(xi)?.sum_dims(&dims, true)?.mul_scalar(inv)?;
        xi.mul(&ms.add_scalar(eps)?.rsqrt()?)?
    } else {
        let xc = xi.sub(&xi.sum_dims(&dims, true)?.mul_scalar(inv)?)?;
        let var = xc.mul(&xc)?.sum_dims(&dims, true)?.mul_scalar(inv)?;
        xc.mul(&var.add_scalar(eps)?.rsqrt()?)?
    };
    // The redistributed weight and bias follow the input, in that order.
    let mut rest = c.inputs[1..].iter();
    if let Some(w) = weight.and_then(|_| rest.next()) {
        y = y.mul(w)?;
    }
    if let Some(b) = bias.and_then(|_| rest.next()) {
        y = y.add(b)?;
    }
    // The gradient follows the output's layout (PyTorch's norm backward strategy): a Partial
    // gradient (the input gradient of a column-parallel layer) is reduced here, once, rather
    // than carried through the composition above, which would leave the weight and bias
    // gradients Partial too, one more reduction each.
    if !y.requires_grad() {
        return Ok(y);
    }
    let placements = y.placements().to_vec();
    crate::autograd::redistribute_op(&y, &placements, op, None)
}

impl<T: Element> DTensor<T> {
    /// Layer normalisation over the trailing `normalized_shape` dims (PyTorch
    /// `F.layer_norm`): `(x - E[x]) / √(Var[x] + eps) · weight + bias`, biased variance.
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&DTensor<T>>,
        bias: Option<&DTensor<T>>,
        eps: f64,
    ) -> Result<DTensor<T>> {
        norm("layer_norm", self, normalized_shape, weight, bias, eps)
    }

    /// Root-mean-square normalisation over the trailing `normalized_shape` dims (PyTorch
    /// `F.rms_norm`): `x / √(E[x²] + eps) · weight`.
    pub fn rms_norm(&self, normalized_shape: &[usize], weight: Option<&DTensor<T>>, eps: f64) -> Result<DTensor<T>> {
        norm("rms_norm", self, normalized_shape, weight, None, eps)
    }
}
