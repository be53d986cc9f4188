//! Element-wise ops with broadcasting.
//!
//! Rule (per mesh dim): all inputs Replicate → Replicate; output `Shard(d)` ← every input
//! that has dim `d` at full size is `Shard` on it, broadcast inputs are Replicate. Partial is
//! linear: `P + P → P`, `P - P → P`, `P * R → P`, `R * P → P`, `P / R → P` (sum and avg), a
//! Replicate operand of `+`/`-` becomes Partial locally; nonlinear ops (`relu`, `exp`, ...)
//! have no Partial rule: a Partial input is all-reduced to Replicate first (as PyTorch), and
//! every other placement of a one-input op is kept.

use super::dispatch::{dispatch, OpDef, Saved};
use super::strategy::{partial_ops, reduce_partials, DimRule, Select};
use super::{new_output, sum_to};
use crate::autograd::input_needs_grad;
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::op::{BinaryOp, UnaryOp};
use crate::placement::{Placement, ReduceOp};
pub(crate) use crate::storage::broadcast_shape;
use crate::storage::Storage;

const R: Placement = Placement::Replicate;
/// Partial reduce ops a linear op keeps.
const LINEAR: [ReduceOp; 2] = [ReduceOp::Sum, ReduceOp::Avg];

/// Calls `$then!` with the list of one-input op kinds (doc, name). The one list of these
/// kinds: [`UnaryKind`] here and the typed layer's marker types and rules are generated from it.
macro_rules! with_unary_kinds {
    ($then:ident) => {
        $then! {
            /// `-x`.
            Neg,
            /// `e^x`.
            Exp,
            /// Natural logarithm `ln x`.
            Log,
            /// `max(x, 0)`.
            Relu,
            /// Gaussian error linear unit (tanh approximation).
            Gelu,
            /// Hyperbolic tangent.
            Tanh,
            /// Square root.
            Sqrt,
            /// `x + c` for a scalar `c` (`add_scalar` / `sub_scalar`).
            AddScalar,
            /// `x * c` for a scalar `c` (`mul_scalar` / `div_scalar`).
            MulScalar,
            /// Softmax (and log-softmax) along one tensor dim.
            Softmax,
            /// `x·σ(x)`.
            Silu,
            /// Logistic sigmoid `σ(x)`.
            Sigmoid,
            /// `ln(1 + e^(βx)) / β`.
            Softplus,
            /// `xᵖ` for a scalar `p`.
            Pow,
            /// `1 / √x`.
            Rsqrt,
            /// `|x|`.
            Abs,
            /// `x` clamped to `[lo, hi]`.
            Clamp,
            /// Dropout (zeros and a `1/(1-p)` scale).
            Dropout
        }
    };
}
pub(crate) use with_unary_kinds;

macro_rules! unary_kind_enum {
    ($($(#[$doc:meta])* $name:ident),*) => {
        /// The one-input element-wise ops (and softmax, dropout), for their table of kept Partials.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum UnaryKind {$(
            $(#[$doc])*
            $name,
        )*}
    };
}
with_unary_kinds!(unary_kind_enum);

/// The Partial reduce ops a one-input op keeps, because it commutes with that reduction
/// (`-Σx = Σ-x`, `mean(x) + c = mean(x + c)`); any other Partial input is reduced first.
/// The one table of these rules: the dynamic ops select with it and the typed layer's rules
/// are generated from it.
pub const fn partials_kept(kind: UnaryKind) -> &'static [ReduceOp] {
    match kind {
        UnaryKind::Neg | UnaryKind::MulScalar => &LINEAR,
        UnaryKind::AddScalar => &[ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min],
        UnaryKind::Exp
        | UnaryKind::Log
        | UnaryKind::Relu
        | UnaryKind::Gelu
        | UnaryKind::Tanh
        | UnaryKind::Sqrt
        | UnaryKind::Softmax
        | UnaryKind::Silu
        | UnaryKind::Sigmoid
        | UnaryKind::Softplus
        | UnaryKind::Pow
        | UnaryKind::Rsqrt
        | UnaryKind::Abs
        | UnaryKind::Clamp
        | UnaryKind::Dropout => &[],
    }
}

/// Does `kind` keep a `Partial(op)` input (see [`partials_kept`])?
pub const fn keeps_partial(kind: UnaryKind, op: ReduceOp) -> bool {
    crate::placement::contains_op(partials_kept(kind), op)
}

/// Which Partial inputs a binary op accepts.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Linearity {
    /// None (nonlinear).
    None,
    /// Every input Partial (`+`, `-`).
    All,
    /// Exactly one input Partial, the others Replicate (`*`).
    AnyOne,
    /// Only the first input Partial (`/`).
    First,
}

/// Per-mesh-dim rules of an element-wise op over inputs of `shapes` giving `out`.
pub(super) fn rules(shapes: &[&[usize]], out: &[usize], lin: Linearity, pops: &[ReduceOp]) -> Vec<DimRule> {
    let n = shapes.len();
    let mut r = vec![DimRule::new(&vec![R; n], R)];
    for d in 0..out.len() {
        let ins: Vec<Placement> = shapes
            .iter()
            .map(|s| {
                let off = out.len() - s.len();
                if d >= off && s[d - off] == out[d] {
                    Placement::Shard((d - off) as isize)
                } else {
                    R
                }
            })
            .collect();
        r.push(DimRule::new(&ins, Placement::Shard(d as isize)));
    }
    for &op in pops {
        let p = Placement::Partial(op);
        match lin {
            Linearity::None => {}
            Linearity::All => r.push(DimRule::new(&vec![p; n], p)),
            Linearity::AnyOne => {
                for j in 0..n {
                    let ins: Vec<Placement> = (0..n).map(|i| if i == j { p } else { R }).collect();
                    r.push(DimRule::new(&ins, p));
                }
            }
            Linearity::First => {
                let ins: Vec<Placement> = (0..n).map(|i| if i == 0 { p } else { R }).collect();
                r.push(DimRule::new(&ins, p));
            }
        }
    }
    r
}

/// Input gradients of a binary op: (g, a, b, which inputs need one) → (ga, gb).
pub(super) type BinaryBackward<T> =
    fn(&DTensor<T>, &DTensor<T>, &DTensor<T>, [bool; 2]) -> Result<(Option<DTensor<T>>, Option<DTensor<T>>)>;

/// `f()` when `need`, else `None`.
pub(super) fn when<T: Element>(need: bool, f: impl FnOnce() -> Result<DTensor<T>>) -> Result<Option<DTensor<T>>> {
    if need {
        f().map(Some)
    } else {
        Ok(None)
    }
}

pub(super) fn binary<T: Element>(
    kernel: BinaryOp,
    bwd: &'static str,
    a: &DTensor<T>,
    b: &DTensor<T>,
    lin: Linearity,
    backward: BinaryBackward<T>,
) -> Result<DTensor<T>> {
    let op = kernel.name();
    let out_shape = broadcast_shape(op, &a.shape, &b.shape)?;
    let pops = if lin == Linearity::None { vec![] } else { partial_ops(&[a, b], &LINEAR) };
    let def = OpDef {
        name: op,
        rules: rules(&[&a.shape, &b.shape], &out_shape, lin, &pops),
        knobs: Select::default(),
        out_shape,
        kernel: |l: &[&Storage<T>]| l[0].binary(kernel, l[1]),
        backward: Some((bwd, |(ins, _): Saved<'_, T>| {
            let (sa, sb) = (ins[0].detach(), ins[1].detach());
            move |g: &DTensor<T>| {
                let (ga, gb) = backward(g, &sa, &sb, [input_needs_grad(0), input_needs_grad(1)])?;
                let ga = ga.map(|ga| sum_to(ga, &sa.shape)).transpose()?;
                let gb = gb.map(|gb| sum_to(gb, &sb.shape)).transpose()?;
                Ok(vec![ga, gb])
            }
        })),
    };
    dispatch(def, &[a, b])
}

/// An element-wise op of one input. `partial_ok`: Partial reduce ops it commutes with; any
/// other Partial input is reduced to Replicate first, other placements are kept.
pub(super) fn unary<T: Element>(
    kernel: UnaryOp,
    bwd: &'static str,
    x: &DTensor<T>,
    partial_ok: &[ReduceOp],
    backward: impl Fn(&DTensor<T>, &DTensor<T>, &DTensor<T>) -> Result<DTensor<T>> + Send + Sync + 'static,
) -> Result<DTensor<T>> {
    let op = kernel.name();
    let pops = partial_ops(&[x], partial_ok);
    let mut rs = vec![DimRule::new(&[R], R)];
    rs.extend((0..x.ndim()).map(|d| DimRule::new(&[Placement::Shard(d as isize)], Placement::Shard(d as isize))));
    rs.extend(pops.into_iter().map(|o| DimRule::new(&[Placement::Partial(o)], Placement::Partial(o))));
    let keep = reduce_partials(&x.placements, partial_ok);
    let def = OpDef {
        name: op,
        rules: rs,
        knobs: Select { follow: Some(&keep), ..Select::default() },
        out_shape: x.shape.clone(),
        kernel: |l: &[&Storage<T>]| l[0].unary(kernel),
        backward: Some((bwd, |(ins, out): Saved<'_, T>| {
            let (sx, sy) = (ins[0].detach(), out.detach());
            move |g: &DTensor<T>| Ok(vec![Some(backward(g, &sx, &sy)?)])
        })),
    };
    dispatch(def, &[x])
}

impl<T: Element> DTensor<T> {
    /// Same placements, `op` applied to every local element, no history. Only for tensors
    /// that are not Partial (or for `op` linear).
    pub(crate) fn map_local(&self, op: UnaryOp) -> Result<DTensor<T>> {
        Ok(new_output(self.local.unary(op)?, &self.mesh, self.placements.clone(), self.shape.clone()))
    }

    /// Element-wise `self + other` (broadcasting). `P + P → P`; `P + R → P` (the Replicate
    /// operand is made Partial locally).
    pub fn add(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        binary(BinaryOp::Add, "add_backward", self, other, Linearity::All, |g, _, _, n| {
            Ok((when(n[0], || Ok(g.clone()))?, when(n[1], || Ok(g.clone()))?))
        })
    }

    /// Element-wise `self - other` (broadcasting).
    pub fn sub(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        binary(BinaryOp::Sub, "sub_backward", self, other, Linearity::All, |g, _, _, n| {
            Ok((when(n[0], || Ok(g.clone()))?, when(n[1], || g.neg())?))
        })
    }

    /// Element-wise `self * other` (broadcasting). `P * R → P`, `R * P → P`.
    pub fn mul(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        binary(BinaryOp::Mul, "mul_backward", self, other, Linearity::AnyOne, |g, a, b, n| {
            Ok((when(n[0], || g.mul(b))?, when(n[1], || g.mul(a))?))
        })
    }

    /// Element-wise `self / other` (broadcasting). `P / R → P`.
    pub fn div(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        binary(BinaryOp::Div, "div_backward", self, other, Linearity::First, |g, a, b, n| {
            Ok((when(n[0], || g.div(b))?, when(n[1], || g.mul(a)?.div(&b.mul(b)?)?.neg())?))
        })
    }

    /// `-self`. Keeps Partial(sum/avg).
    pub fn neg(&self) -> Result<DTensor<T>> {
        unary(UnaryOp::Neg, "neg_backward", self, partials_kept(UnaryKind::Neg), |g, _, _| g.neg())
    }

    /// `e^self`.
    pub fn exp(&self) -> Result<DTensor<T>> {
        unary(UnaryOp::Exp, "exp_backward", self, partials_kept(UnaryKind::Exp), |g, _, y| g.mul(y))
    }

    /// Natural logarithm.
    pub fn log(&self) -> Result<DTensor<T>> {
        unary(UnaryOp::Log, "log_backward", self, partials_kept(UnaryKind::Log), |g, x, _| g.div(x))
    }

    /// `max(x, 0)`. A Partial input is reduced first (relu is not linear).
    pub fn relu(&self) -> Result<DTensor<T>> {
        unary(UnaryOp::Relu, "relu_backward", self, partials_kept(UnaryKind::Relu), |g, x, _| {
            g.mul(&x.map_local(UnaryOp::ReluGrad)?)
        })
    }

    /// GELU, tanh approximation (PyTorch `gelu(approximate="tanh")`). A Partial input is
    /// reduced first.
    pub fn gelu(&self) -> Result<DTensor<T>> {
        unary(UnaryOp::Gelu, "gelu_backward", self, partials_kept(UnaryKind::Gelu), |g, x, _| {
            g.mul(&x.map_local(UnaryOp::GeluGrad)?)
        })
    }

    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<DTensor<T>> {
        unary(UnaryOp::Tanh, "tanh_backward", self, partials_kept(UnaryKind::Tanh), |g, _, y| {
            g.mul(&y.map_local(UnaryOp::TanhGrad)?)
        })
    }

    /// Square root.
    pub fn sqrt(&self) -> Result<DTensor<T>> {
        unary(UnaryOp::Sqrt, "sqrt_backward", self, partials_kept(UnaryKind::Sqrt), |g, _, y| {
            g.mul(&y.map_local(UnaryOp::SqrtGrad)?)
        })
    }

    /// `self + s`. Keeps Partial(avg/max/min) (adding a constant commutes with them).
    pub fn add_scalar(&self, s: T) -> Result<DTensor<T>> {
        unary(
            UnaryOp::AddScalar(s.as_f64()),
            "add_scalar_backward",
            self,
            partials_kept(UnaryKind::AddScalar),
            |g, _, _| Ok(g.clone()),
        )
    }

    /// `self - s`.
    pub fn sub_scalar(&self, s: T) -> Result<DTensor<T>> {
        self.add_scalar(-s)
    }

    /// `self * s`. Keeps Partial(sum/avg).
    pub fn mul_scalar(&self, s: T) -> Result<DTensor<T>> {
        unary(
            UnaryOp::MulScalar(s.as_f64()),
            "mul_scalar_backward",
            self,
            partials_kept(UnaryKind::MulScalar),
            move |g, _, _| g.mul_scalar(s),
        )
    }

    /// `self / s`.
    pub fn div_scalar(&self, s: T) -> Result<DTensor<T>> {
        if s == T::zero() {
            return Err(Error::InvalidArgument { context: "div_scalar".into(), reason: "division by zero".into() });
        }
        self.mul_scalar(T::one() / s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_shapes() {
        assert_eq!(broadcast_shape("t", &[4, 1, 3], &[5, 3]).unwrap(), vec![4, 5, 3]);
        assert_eq!(broadcast_shape("t", &[], &[2]).unwrap(), vec![2]);
        assert!(matches!(broadcast_shape("t", &[2, 3], &[4]), Err(Error::ShapeMismatch { .. })));
    }
}
