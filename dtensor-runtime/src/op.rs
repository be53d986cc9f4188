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

/// Calls `$then!` with the unary vocabulary: one entry per element-wise function of one
/// tensor, the only place a new one is added (then its user-facing method in `ops`). Each
/// entry: its docs and variant (with its scalars), `=>` its name, its op code in the CUDA
/// kernels' `dt_unary` switch, its host formula (`|x, s, t|`: the element and the two
/// scalars of `cuda::args::unary_scalars` in the element type `T`), and its CUDA C statement
/// (over `x`, `s`, `t` in the compute type `T`). From it come [`UnaryOp`], [`UnaryOp::name`],
/// [`UnaryOp::code`], [`UNARY_CUDA_CASES`] (the C `switch`) and the host kernel's arms
/// (`storage::cpu::unary`).
macro_rules! with_unary_ops {
    ($then:ident) => {
        $then! {
            /// `-x`
            Neg => "neg", 0, |x, _s, _t| -x, "return -x;";
            /// `eˣ`
            Exp => "exp", 1, |x, _s, _t| x.exp(), "return exp(x);";
            /// `ln x`
            Log => "log", 2, |x, _s, _t| x.ln(), "return log(x);";
            /// `max(x, 0)`
            Relu => "relu", 3, |x, _s, _t| if x > T::zero() { x } else { T::zero() }, "return x > (T)0 ? x : (T)0;";
            /// [`gelu`] (tanh form).
            // In f64 for every element type: the reference formula of every device.
            Gelu => "gelu", 4, |x, _s, _t| T::of_f64(gelu(x.as_f64())),
                "{ double v = (double)x; return (T)(0.5 * v * (1.0 + tanh(GELU_C * (v + GELU_A * v * v * v)))); }";
            /// `tanh x`
            Tanh => "tanh", 5, |x, _s, _t| x.tanh(), "return tanh(x);";
            /// `√x`
            Sqrt => "sqrt", 6, |x, _s, _t| x.sqrt(), "return sqrt(x);";
            /// `x + s`
            AddScalar(f64) => "add_scalar", 7, |x, s, _t| x + s, "return x + s;";
            /// `x · s`
            MulScalar(f64) => "mul_scalar", 8, |x, s, _t| x * s, "return x * s;";
            /// `1` where `x > 0`, else `0` (relu's derivative).
            ReluGrad => "relu_grad", 9, |x, _s, _t| if x > T::zero() { T::one() } else { T::zero() },
                "return x > (T)0 ? (T)1 : (T)0;";
            /// [`gelu_grad`].
            GeluGrad => "gelu_grad", 10, |x, _s, _t| T::of_f64(gelu_grad(x.as_f64())),
                "{ double v = (double)x; double t = tanh(GELU_C * (v + GELU_A * v * v * v)); \
                 return (T)(0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * v * v)); }";
            /// `1 - y²` from the output `y = tanh x`.
            TanhGrad => "tanh_grad", 11, |y, _s, _t| T::one() - y * y, "return (T)1 - x * x;";
            /// `0.5 / y` from the output `y = √x`.
            SqrtGrad => "sqrt_grad", 12, |y, _s, _t| T::of_f64(0.5) / y, "return (T)0.5 / x;";
            /// `x·σ(x)` (SiLU, swish).
            Silu => "silu", 13, |x, _s, _t| x / (T::one() + (-x).exp()), "return x / ((T)1 + exp(-x));";
            /// `σ(x)(1 + x(1 - σ(x)))`, the derivative of SiLU.
            SiluGrad => "silu_grad", 14, |x, _s, _t| {
                let sig = T::one() / (T::one() + (-x).exp());
                sig * (T::one() + x * (T::one() - sig))
            }, "{ T sig = (T)1 / ((T)1 + exp(-x)); return sig * ((T)1 + x * ((T)1 - sig)); }";
            /// `σ(x) = 1 / (1 + e⁻ˣ)`.
            Sigmoid => "sigmoid", 15, |x, _s, _t| T::one() / (T::one() + (-x).exp()), "return (T)1 / ((T)1 + exp(-x));";
            /// `y(1 - y)` from the output `y = σ(x)`.
            SigmoidGrad => "sigmoid_grad", 16, |y, _s, _t| y * (T::one() - y), "return x * ((T)1 - x);";
            /// `ln(1 + e^(βx)) / β`, and `x` where `βx > threshold` (PyTorch `softplus(beta, threshold)`).
            Softplus {
                /// The β of `βx` (PyTorch's default 1).
                beta: f64,
                /// Above this `βx` the linear form is used (PyTorch's default 20).
                threshold: f64,
            } => "softplus", 17, |x, b, t| if b * x > t { x } else { (b * x).exp().ln_1p() / b },
                "{ T bx = s * x; return bx > t ? x : log1p(exp(bx)) / s; }";
            /// `σ(βx)`, and `1` where `βx > threshold`: the derivative of [`UnaryOp::Softplus`].
            SoftplusGrad {
                /// The β of `βx` (PyTorch's default 1).
                beta: f64,
                /// Above this `βx` the linear form is used (PyTorch's default 20).
                threshold: f64,
            } => "softplus_grad", 18, |x, b, t| if b * x > t { T::one() } else { T::one() / (T::one() + (-(b * x)).exp()) },
                "{ T bx = s * x; return bx > t ? (T)1 : (T)1 / ((T)1 + exp(-bx)); }";
            /// `xᵖ` (scalar exponent).
            Pow(f64) => "pow", 19, |x, s, _t| x.powf(s), "return pow(x, s);";
            /// `p·xᵖ⁻¹` (`0` for `p = 0`), the derivative of [`UnaryOp::Pow`].
            PowGrad(f64) => "pow_grad", 20, |x, s, _t| if s == T::zero() { T::zero() } else { s * x.powf(s - T::one()) },
                "return s == (T)0 ? (T)0 : s * pow(x, s - (T)1);";
            /// `1 / √x`.
            Rsqrt => "rsqrt", 21, |x, _s, _t| T::one() / x.sqrt(), "return (T)1 / sqrt(x);";
            /// `-y³ / 2` from the output `y = 1/√x`.
            RsqrtGrad => "rsqrt_grad", 22, |y, _s, _t| -(T::of_f64(0.5) * y * y * y), "return -((T)0.5 * x * x * x);";
            /// `|x|`
            Abs => "abs", 23, |x, _s, _t| x.abs(), "return fabs(x);";
            /// `sign(x)` (`0` at `0`), the derivative of [`UnaryOp::Abs`].
            Sign => "sign", 24, |x, _s, _t| {
                if x > T::zero() {
                    T::one()
                } else if x < T::zero() {
                    -T::one()
                } else {
                    x // ±0 and NaN stay
                }
            }, "return x > (T)0 ? (T)1 : x < (T)0 ? (T)(-1) : x; /* ±0 and NaN stay */";
            /// `min(max(x, lo), hi)`; NaN stays NaN.
            Clamp {
                /// Lower bound (`-∞`: none).
                lo: f64,
                /// Upper bound (`+∞`: none).
                hi: f64,
            } => "clamp", 25, |x, lo, hi| {
                // min(max(x, lo), hi) as PyTorch (hi wins when lo > hi); NaN fails both tests.
                let m = if x < lo { lo } else { x };
                if m > hi {
                    hi
                } else {
                    m
                }
            }, "{ T m = x < s ? s : x; return m > t ? t : m; } /* hi wins when lo > hi; NaN stays */";
            /// `1` where `lo ≤ x ≤ hi`, else `0` (PyTorch's clamp backward).
            ClampGrad {
                /// Lower bound (`-∞`: none).
                lo: f64,
                /// Upper bound (`+∞`: none).
                hi: f64,
            } => "clamp_grad", 26, |x, lo, hi| if x >= lo && x <= hi { T::one() } else { T::zero() },
                "return x >= s && x <= t ? (T)1 : (T)0;";
            /// [`gelu_erf`] (exact form).
            GeluErf => "gelu_erf", 27, |x, _s, _t| T::of_f64(gelu_erf(x.as_f64())),
                "{ double v = (double)x; return (T)(0.5 * v * (1.0 + erf(v * DT_SQRT_HALF))); }";
            /// [`gelu_erf_grad`].
            GeluErfGrad => "gelu_erf_grad", 28, |x, _s, _t| T::of_f64(gelu_erf_grad(x.as_f64())),
                "{ double v = (double)x; double pdf = exp(-0.5 * v * v) * 0.5 * DT_2_SQRT_PI * DT_SQRT_HALF; \
                 return (T)(0.5 * (1.0 + erf(v * DT_SQRT_HALF)) + v * pdf); }";
            /// Dropout scale from a uniform draw `u`: `0` where `u < p`, else `1 / (1 - p)`.
            DropoutScale(f64) => "dropout_scale", 29, |u, p, keep| if u < p { T::zero() } else { keep },
                "return x < s ? (T)0 : t;";
            /// `1` where `x ≠ 0`, else `0` (logical value of a mask).
            NonZero => "nonzero", 30, |x, _s, _t| if x != T::zero() { T::one() } else { T::zero() },
                "return x != (T)0 ? (T)1 : (T)0;";
        }
    };
}
pub(crate) use with_unary_ops;

/// [`UnaryOp`], its name, its CUDA op code and its CUDA `switch` cases, from the vocabulary.
macro_rules! unary_op_items {
    ($(
        $(#[$doc:meta])* $V:ident $( ( $($tup:ty),* ) )? $( { $($fields:tt)* } )?
            => $name:literal, $code:literal, |$x:ident, $s:pat_param, $t:pat_param| $host:expr, $cuda:literal;
    )*) => {
        /// Element-wise functions of one tensor (`y = f(x)`), generated from the one vocabulary
        /// table (`with_unary_ops!` in `op.rs`).
        ///
        /// The `*Grad` variants are the local derivative factors backward multiplies the incoming
        /// gradient by; `TanhGrad`, `SqrtGrad`, `SigmoidGrad` and `RsqrtGrad` take the forward
        /// *output* `y`, the others `x`.
        #[derive(Debug, Clone, Copy, PartialEq)]
        #[non_exhaustive]
        pub enum UnaryOp {$(
            $(#[$doc])*
            $V $( ( $($tup),* ) )? $( { $($fields)* } )?,
        )*}

        impl UnaryOp {
            /// Short name (errors, kernel names).
            pub fn name(self) -> &'static str {
                match self {$( UnaryOp::$V { .. } => $name, )*}
            }

            /// The op code of this function in the CUDA kernels' `dt_unary` switch.
            pub fn code(self) -> i32 {
                match self {$( UnaryOp::$V { .. } => $code, )*}
            }
        }

        /// The CUDA `dt_unary` switch cases: (op code, C statement over `x`, `s`, `t`).
        pub const UNARY_CUDA_CASES: &[(i32, &str)] = &[$( ($code, $cuda), )*];
    };
}
with_unary_ops!(unary_op_items);

impl UnaryOp {
    /// The two scalars `(s, t)` of the vocabulary's formulas, as `f64` (kernels convert them to
    /// the element type once): softplus `(β, threshold)`, clamp `(lo, hi)`, dropout
    /// `(p, 1 / (1 - p))` (the keep scale computed in `f64`), else `(self.scalar(), 0)`.
    pub fn scalars(self) -> (f64, f64) {
        match self {
            UnaryOp::Softplus { beta, threshold } | UnaryOp::SoftplusGrad { beta, threshold } => (beta, threshold),
            UnaryOp::Clamp { lo, hi } | UnaryOp::ClampGrad { lo, hi } => (lo, hi),
            UnaryOp::DropoutScale(p) => (p, 1.0 / (1.0 - p)),
            _ => (self.scalar(), 0.0),
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
    /// Bias correction `1 - β₁ᵗ`, computed by the caller in f64 (as PyTorch).
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
