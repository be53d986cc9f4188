//! The op enums of the kernel surface: *what* a kernel computes, as plain data, so that every
//! device implements the same list and an op is a `match` arm, not a closure.
//!
//! Scalars travel as `f64` (exact for every element type's own values) and are converted to
//! the element type once per kernel call, never per element.

use std::fmt;

/// `√(2/π)`, the scale of the tanh GELU.
pub const GELU_C: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh GELU.
pub const GELU_A: f64 = 0.044_715;

/// GELU, tanh form (PyTorch `gelu(approximate="tanh")`): the one formula every device uses.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + (GELU_C * (x + GELU_A * x * x * x)).tanh())
}

/// Derivative of [`gelu`].
pub fn gelu_grad(x: f64) -> f64 {
    let t = (GELU_C * (x + GELU_A * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * x * x)
}

/// GELU, exact form (PyTorch `gelu(approximate="none")`): `x·Φ(x) = ½x(1 + erf(x/√2))`.
pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))
}

/// Derivative of [`gelu_erf`]: `Φ(x) + x·φ(x)`.
pub fn gelu_erf_grad(x: f64) -> f64 {
    let pdf = (-0.5 * x * x).exp() * 0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;
    0.5 * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2)) + x * pdf
}

/// Element-wise functions of one tensor (`y = f(x)`).
///
/// The `*Grad` variants are the local derivative factors backward multiplies the incoming
/// gradient by; `TanhGrad` and `SqrtGrad` take the forward *output* `y`, the others `x`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `eˣ`
    Exp,
    /// `ln x`
    Log,
    /// `max(x, 0)`
    Relu,
    /// [`gelu`] (tanh form).
    Gelu,
    /// `tanh x`
    Tanh,
    /// `√x`
    Sqrt,
    /// `x + s`
    AddScalar(f64),
    /// `x · s`
    MulScalar(f64),
    /// `1` where `x > 0`, else `0` (relu's derivative).
    ReluGrad,
    /// [`gelu_grad`].
    GeluGrad,
    /// `1 - y²` from the output `y = tanh x`.
    TanhGrad,
    /// `0.5 / y` from the output `y = √x`.
    SqrtGrad,
    /// `x·σ(x)` (SiLU, swish).
    Silu,
    /// `σ(x)(1 + x(1 - σ(x)))`, the derivative of SiLU.
    SiluGrad,
    /// `σ(x) = 1 / (1 + e⁻ˣ)`.
    Sigmoid,
    /// `y(1 - y)` from the output `y = σ(x)`.
    SigmoidGrad,
    /// `ln(1 + e^(βx)) / β`, and `x` where `βx > threshold` (PyTorch `softplus(beta, threshold)`).
    Softplus {
        /// The β of `βx` (PyTorch's default 1).
        beta: f64,
        /// Above this `βx` the linear form is used (PyTorch's default 20).
        threshold: f64,
    },
    /// `σ(βx)`, and `1` where `βx > threshold`: the derivative of [`UnaryOp::Softplus`].
    SoftplusGrad {
        /// The β of `βx` (PyTorch's default 1).
        beta: f64,
        /// Above this `βx` the linear form is used (PyTorch's default 20).
        threshold: f64,
    },
    /// `xᵖ` (scalar exponent).
    Pow(f64),
    /// `p·xᵖ⁻¹` (`0` for `p = 0`), the derivative of [`UnaryOp::Pow`].
    PowGrad(f64),
    /// `1 / √x`.
    Rsqrt,
    /// `-y³ / 2` from the output `y = 1/√x`.
    RsqrtGrad,
    /// `|x|`
    Abs,
    /// `sign(x)` (`0` at `0`), the derivative of [`UnaryOp::Abs`].
    Sign,
    /// `min(max(x, lo), hi)`; NaN stays NaN.
    Clamp {
        /// Lower bound (`-∞`: none).
        lo: f64,
        /// Upper bound (`+∞`: none).
        hi: f64,
    },
    /// `1` where `lo ≤ x ≤ hi`, else `0` (PyTorch's clamp backward).
    ClampGrad {
        /// Lower bound (`-∞`: none).
        lo: f64,
        /// Upper bound (`+∞`: none).
        hi: f64,
    },
    /// [`gelu_erf`] (exact form).
    GeluErf,
    /// [`gelu_erf_grad`].
    GeluErfGrad,
    /// Dropout scale from a uniform draw `u`: `0` where `u < p`, else `1 / (1 - p)`.
    DropoutScale(f64),
    /// `1` where `x ≠ 0`, else `0` (logical value of a mask).
    NonZero,
}

impl UnaryOp {
    /// Short name (errors, kernel names).
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::AddScalar(_) => "add_scalar",
            UnaryOp::MulScalar(_) => "mul_scalar",
            UnaryOp::ReluGrad => "relu_grad",
            UnaryOp::GeluGrad => "gelu_grad",
            UnaryOp::TanhGrad => "tanh_grad",
            UnaryOp::SqrtGrad => "sqrt_grad",
            UnaryOp::Silu => "silu",
            UnaryOp::SiluGrad => "silu_grad",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::SigmoidGrad => "sigmoid_grad",
            UnaryOp::Softplus { .. } => "softplus",
            UnaryOp::SoftplusGrad { .. } => "softplus_grad",
            UnaryOp::Pow(_) => "pow",
            UnaryOp::PowGrad(_) => "pow_grad",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::RsqrtGrad => "rsqrt_grad",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Clamp { .. } => "clamp",
            UnaryOp::ClampGrad { .. } => "clamp_grad",
            UnaryOp::GeluErf => "gelu_erf",
            UnaryOp::GeluErfGrad => "gelu_erf_grad",
            UnaryOp::DropoutScale(_) => "dropout_scale",
            UnaryOp::NonZero => "nonzero",
        }
    }

    /// The scalar operand (0 for ops without one).
    pub fn scalar(self) -> f64 {
        match self {
            UnaryOp::AddScalar(s)
            | UnaryOp::MulScalar(s)
            | UnaryOp::Pow(s)
            | UnaryOp::PowGrad(s)
            | UnaryOp::DropoutScale(s) => s,
            _ => 0.0,
        }
    }
}

impl fmt::Display for UnaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Element-wise functions of two tensors with numpy broadcasting (`z = f(a, b)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a · b`
    Mul,
    /// `a / b`
    Div,
    /// `1` where `a == b`, else `0`.
    Eq,
    /// `1` where `a != b`, else `0`.
    Ne,
    /// `1` where `a < b`, else `0`.
    Lt,
    /// `1` where `a <= b`, else `0`.
    Le,
    /// `1` where `a > b`, else `0`.
    Gt,
    /// `1` where `a >= b`, else `0`.
    Ge,
    /// `max(a, b)`, NaN if either is NaN (PyTorch `maximum`).
    Maximum,
    /// `min(a, b)`, NaN if either is NaN (PyTorch `minimum`).
    Minimum,
}

impl BinaryOp {
    /// Short name (errors, kernel names).
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
        }
    }
}

impl fmt::Display for BinaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reductions over some dims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reduction {
    /// Sum.
    Sum,
    /// Sum divided by the number of reduced elements.
    Mean,
    /// Maximum (`-∞` over an empty dim); NaN if any element is NaN.
    Max,
    /// Minimum (`+∞` over an empty dim); NaN if any element is NaN.
    Min,
}

impl Reduction {
    /// Short name (errors, kernel names).
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Sum => "sum",
            Reduction::Mean => "mean",
            Reduction::Max => "max",
            Reduction::Min => "min",
        }
    }
}

/// Softmax flavour of a row-wise softmax kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SoftmaxKind {
    /// `e^(x - max) / Σ e^(x - max)`
    Softmax,
    /// `x - max - ln Σ e^(x - max)`
    LogSoftmax,
}

/// Distribution of a random fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Distribution {
    /// Uniform in (0, 1).
    Uniform,
    /// Standard normal (Box–Muller on Philox word pairs).
    Normal,
}

/// A counter-based random fill: global element `i` of the tensor takes the value
/// `crate::rng::Stream::new(seed, offset)` gives element `i`, whatever the local shard, so a
/// sharded fill equals the single-rank one bit for bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RandomFill {
    /// Generator seed.
    pub seed: u64,
    /// Philox counter block of global element 0.
    pub offset: u64,
    /// Distribution.
    pub dist: Distribution,
}

/// One SGD update of a parameter shard (PyTorch `optim.SGD`):
/// `d = g + wd·w; if momentum: b = first ? d : m·b + d, d = b; w -= lr·d`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdStep {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0: no momentum buffer).
    pub momentum: f64,
    /// Coupled weight decay.
    pub weight_decay: f64,
    /// The momentum buffer is fresh: it starts at `d` (PyTorch).
    pub first: bool,
}

/// One AdamW update of a parameter shard (PyTorch `optim.AdamW`):
/// `w -= lr·wd·w; m = β₁m + (1-β₁)g; v = β₂v + (1-β₂)g²; w -= lr·(m/c₁)/(√(v/c₂) + eps)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay β₁.
    pub beta1: f64,
    /// Second-moment decay β₂.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Bias correction `1 - β₁ᵗ`, computed by the caller in the element type.
    pub bias_correction1: f64,
    /// Bias correction `1 - β₂ᵗ`.
    pub bias_correction2: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_derivative_matches_finite_difference() {
        for &x in &[-3.0, -0.5, 0.0, 0.7, 2.5] {
            let h = 1e-6;
            let fd = (gelu(x + h) - gelu(x - h)) / (2.0 * h);
            assert!((fd - gelu_grad(x)).abs() < 1e-8, "x={x}");
        }
    }

    #[test]
    fn gelu_is_the_tanh_form() {
        // PyTorch: gelu(1.0, approximate="tanh") = 0.8411919906082768; erf form: 0.8413447460685429.
        assert!((gelu(1.0) - 0.841_191_990_608_276_8).abs() < 1e-15);
        assert_eq!(gelu(0.0), 0.0);
    }
}
