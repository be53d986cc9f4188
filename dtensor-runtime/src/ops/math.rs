//! Activations and element-wise math: silu, sigmoid, softplus, pow, rsqrt, abs, clamp, GELU
//! in both of PyTorch's forms, and SwiGLU.
//!
//! Rule (per mesh dim, PyTorch's pointwise strategy): every placement of the input is kept
//! (`R → R`, `Shard(d) → Shard(d)`); none of these functions is linear, so a Partial input is
//! all-reduced to Replicate first (their row of [`partials_kept`] is empty). `swiglu` is `silu(gate) * up` and follows `mul`'s rule.

use super::pointwise::{partials_kept, unary, UnaryKind};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::op::UnaryOp;
use std::str::FromStr;

/// The `approximate` argument of PyTorch's `gelu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GeluApproximate {
    /// `x·Φ(x)` with the error function (`approximate="none"`, PyTorch's default).
    #[default]
    None,
    /// The tanh approximation (`approximate="tanh"`).
    Tanh,
}

impl FromStr for GeluApproximate {
    type Err = Error;

    /// PyTorch's spelling: `"none"` or `"tanh"`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(GeluApproximate::None),
            "tanh" => Ok(GeluApproximate::Tanh),
            other => Err(Error::InvalidArgument {
                context: "gelu".into(),
                reason: format!("approximate must be \"none\" or \"tanh\", got {other:?}"),
            }),
        }
    }
}

impl<T: Element> DTensor<T> {
    /// SiLU (swish) `x·σ(x)`.
    pub fn silu(&self) -> Result<DTensor<T>> {
        unary(UnaryOp::Silu, "silu_backward", self, partials_kept(UnaryKind::Silu), |g, x, _| {
            g.mul(&x.map_local(UnaryOp::SiluGrad)?)
        })
    }

    /// Logistic sigmoid `1 / (1 + e⁻ˣ)`.
    pub fn sigmoid(&self) -> Result<DTensor<T>> {
        unary(UnaryOp::Sigmoid, "sigmoid_backward", self, partials_kept(UnaryKind::Sigmoid), |g, _, y| {
            g.mul(&y.map_local(UnaryOp::SigmoidGrad)?)
        })
    }

    /// Softplus with PyTorch's defaults (`beta = 1`, `threshold = 20`).
    pub fn softplus(&self) -> Result<DTensor<T>> {
        self.softplus_with(1.0, 20.0)
    }

    /// `ln(1 + e^(βx)) / β`, reverting to `x` where `βx > threshold` (PyTorch `softplus`).
    pub fn softplus_with(&self, beta: f64, threshold: f64) -> Result<DTensor<T>> {
        if beta == 0.0 || !beta.is_finite() {
            return Err(Error::InvalidArgument { context: "softplus".into(), reason: format!("beta = {beta}") });
        }
        unary(
            UnaryOp::Softplus { beta, threshold },
            "softplus_backward",
            self,
            partials_kept(UnaryKind::Softplus),
            move |g, x, _| g.mul(&x.map_local(UnaryOp::SoftplusGrad { beta, threshold })?),
        )
    }

    /// `selfᵖ` for a scalar exponent (PyTorch `pow(Tensor, Scalar)`).
    pub fn pow(&self, exponent: f64) -> Result<DTensor<T>> {
        unary(UnaryOp::Pow(exponent), "pow_backward", self, partials_kept(UnaryKind::Pow), move |g, x, _| {
            g.mul(&x.map_local(UnaryOp::PowGrad(exponent))?)
        })
    }

    /// `1 / √self`.
    pub fn rsqrt(&self) -> Result<DTensor<T>> {
        unary(UnaryOp::Rsqrt, "rsqrt_backward", self, partials_kept(UnaryKind::Rsqrt), |g, _, y| {
            g.mul(&y.map_local(UnaryOp::RsqrtGrad)?)
        })
    }

    /// `|self|` (gradient `sign(x)`, 0 at 0, as PyTorch).
    pub fn abs(&self) -> Result<DTensor<T>> {
        unary(UnaryOp::Abs, "abs_backward", self, partials_kept(UnaryKind::Abs), |g, x, _| {
            g.mul(&x.map_local(UnaryOp::Sign)?)
        })
    }

    /// `min(max(self, min), max)` with either bound optional (PyTorch `clamp`; the gradient
    /// flows where `min ≤ x ≤ max`). Both bounds absent is an error, as in PyTorch.
    pub fn clamp(&self, min: Option<T>, max: Option<T>) -> Result<DTensor<T>> {
        if min.is_none() && max.is_none() {
            return Err(Error::InvalidArgument {
                context: "clamp".into(),
                reason: "at least one of min and max must be given".into(),
            });
        }
        let lo = min.map_or(f64::NEG_INFINITY, |v| v.as_f64());
        let hi = max.map_or(f64::INFINITY, |v| v.as_f64());
        unary(UnaryOp::Clamp { lo, hi }, "clamp_backward", self, partials_kept(UnaryKind::Clamp), move |g, x, _| {
            g.mul(&x.map_local(UnaryOp::ClampGrad { lo, hi })?)
        })
    }

    /// GELU in the form PyTorch's `approximate` argument names (`gelu()` is the tanh form).
    pub fn gelu_with(&self, approximate: GeluApproximate) -> Result<DTensor<T>> {
        match approximate {
            GeluApproximate::Tanh => self.gelu(),
            GeluApproximate::None => {
                unary(UnaryOp::GeluErf, "gelu_backward", self, partials_kept(UnaryKind::Gelu), |g, x, _| {
                    g.mul(&x.map_local(UnaryOp::GeluErfGrad)?)
                })
            }
        }
    }

    /// SwiGLU gate: `silu(self) * up` (the Llama MLP's `silu(x W₁) * (x W₃)`).
    pub fn swiglu(&self, up: &DTensor<T>) -> Result<DTensor<T>> {
        self.silu()?.mul(up)
    }
}
