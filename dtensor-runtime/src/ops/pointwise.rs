//! Element-wise ops with broadcasting.
//!
//! Rule (per mesh dim): all inputs Replicate → Replicate; output `Shard(d)` ← every input
//! that has dim `d` at full size is `Shard` on it, broadcast inputs are Replicate. Partial is
//! linear: `P + P → P`, `P - P → P`, `P * R → P`, `R * P → P`, `P / R → P` (sum and avg), a
//! Replicate operand of `+`/`-` becomes Partial locally; nonlinear ops (`relu`, `exp`, ...)
//! have no Partial rule: a Partial input is all-reduced to Replicate first (as PyTorch), and
//! every other placement of a one-input op is kept.

use super::strategy::{partial_ops, reduce_partials, select, DimRule, Select};
use super::{new_output, sum_to};
use crate::autograd::{input_needs_grad, record, recording};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::placement::{Placement, ReduceOp};
use ndarray::{ArrayD, IxDyn, Zip};

const R: Placement = Placement::Replicate;
/// Partial reduce ops a linear op keeps.
const LINEAR: [ReduceOp; 2] = [ReduceOp::Sum, ReduceOp::Avg];

/// Which Partial inputs a binary op accepts.
#[derive(Clone, Copy, PartialEq)]
enum Linearity {
    /// None (nonlinear).
    None,
    /// Every input Partial (`+`, `-`).
    All,
    /// Exactly one input Partial, the others Replicate (`*`).
    AnyOne,
    /// Only the first input Partial (`/`).
    First,
}

/// Broadcast shape of two shapes (numpy rules).
pub(crate) fn broadcast_shape(op: &str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::ShapeMismatch {
                    context: format!("{op}: shapes cannot be broadcast together"),
                    expected: a.to_vec(),
                    actual: b.to_vec(),
                })
            }
        };
    }
    Ok(out)
}

/// Per-mesh-dim rules of an element-wise op over inputs of `shapes` giving `out`.
fn rules(shapes: &[&[usize]], out: &[usize], lin: Linearity, pops: &[ReduceOp]) -> Vec<DimRule> {
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

/// Element-wise `f` of two local arrays with broadcasting.
fn zip_local<T: Element>(op: &str, a: &ArrayD<T>, b: &ArrayD<T>, f: impl Fn(T, T) -> T) -> Result<ArrayD<T>> {
    let shape = broadcast_shape(op, a.shape(), b.shape())?;
    let bad = || Error::ShapeMismatch {
        context: format!("{op}: local shards do not broadcast"),
        expected: a.shape().to_vec(),
        actual: b.shape().to_vec(),
    };
    let av = a.broadcast(IxDyn(&shape)).ok_or_else(bad)?;
    let bv = b.broadcast(IxDyn(&shape)).ok_or_else(bad)?;
    Ok(Zip::from(&av).and(&bv).map_collect(|x, y| f(*x, *y)))
}

/// Input gradients of a binary op: (g, a, b, which inputs need one) → (ga, gb).
type BinaryBackward<T> =
    fn(&DTensor<T>, &DTensor<T>, &DTensor<T>, [bool; 2]) -> Result<(Option<DTensor<T>>, Option<DTensor<T>>)>;

/// `f()` when `need`, else `None`.
fn when<T: Element>(need: bool, f: impl FnOnce() -> Result<DTensor<T>>) -> Result<Option<DTensor<T>>> {
    if need {
        f().map(Some)
    } else {
        Ok(None)
    }
}

fn binary<T: Element>(
    op: &'static str,
    bwd: &'static str,
    a: &DTensor<T>,
    b: &DTensor<T>,
    lin: Linearity,
    f: fn(T, T) -> T,
    backward: BinaryBackward<T>,
) -> Result<DTensor<T>> {
    let out_shape = broadcast_shape(op, &a.shape, &b.shape)?;
    let pops = if lin == Linearity::None { vec![] } else { partial_ops(&[a, b], &LINEAR) };
    let rs = rules(&[&a.shape, &b.shape], &out_shape, lin, &pops);
    let c = select(op, &[a, b], &rs, Select::default())?;
    let (x, y) = (&*c.inputs[0], &*c.inputs[1]);
    let local = zip_local(op, &x.local, &y.local, f)?;
    let out = new_output(local, &x.mesh, c.output, out_shape);
    if !recording(&[x, y]) {
        return Ok(out);
    }
    let (sa, sb) = (x.detach(), y.detach());
    Ok(record(bwd, out, &[x, y], move |g| {
        let (ga, gb) = backward(g, &sa, &sb, [input_needs_grad(0), input_needs_grad(1)])?;
        let ga = ga.map(|ga| sum_to(ga, &sa.shape)).transpose()?;
        let gb = gb.map(|gb| sum_to(gb, &sb.shape)).transpose()?;
        Ok(vec![ga, gb])
    }))
}

/// An element-wise op of one input. `partial_ok`: Partial reduce ops it commutes with; any
/// other Partial input is reduced to Replicate first, other placements are kept.
fn unary<T: Element>(
    op: &'static str,
    bwd: &'static str,
    x: &DTensor<T>,
    partial_ok: &[ReduceOp],
    f: impl Fn(T) -> T,
    backward: impl Fn(&DTensor<T>, &DTensor<T>, &DTensor<T>) -> Result<DTensor<T>> + Send + Sync + 'static,
) -> Result<DTensor<T>> {
    let pops = partial_ops(&[x], partial_ok);
    let mut rs = vec![DimRule::new(&[R], R)];
    rs.extend((0..x.ndim()).map(|d| DimRule::new(&[Placement::Shard(d as isize)], Placement::Shard(d as isize))));
    rs.extend(pops.into_iter().map(|o| DimRule::new(&[Placement::Partial(o)], Placement::Partial(o))));
    let keep = reduce_partials(&x.placements, partial_ok);
    let follow = |ins: &[Vec<Placement>], _: &[Placement]| ins[0] == keep;
    let c = select(op, &[x], &rs, Select { valid: Some(&follow), prefer_output: None })?;
    let xi = &*c.inputs[0];
    let out = new_output(xi.local.mapv(f), &xi.mesh, c.output, xi.shape.clone());
    if !recording(&[xi]) {
        return Ok(out);
    }
    let (sx, sy) = (xi.detach(), out.detach());
    Ok(record(bwd, out, &[xi], move |g| Ok(vec![Some(backward(g, &sx, &sy)?)])))
}

/// `√(2/π)` and the cubic coefficient of the tanh GELU.
const GELU_C: f64 = 0.797_884_560_802_865_4;
const GELU_A: f64 = 0.044_715;

fn gelu_f64(x: f64) -> f64 {
    0.5 * x * (1.0 + (GELU_C * (x + GELU_A * x * x * x)).tanh())
}

fn gelu_grad_f64(x: f64) -> f64 {
    let t = (GELU_C * (x + GELU_A * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * x * x)
}

impl<T: Element> DTensor<T> {
    /// Same placements, `f` applied to every local element, no history. Only for tensors
    /// that are not Partial (or for `f` linear).
    pub(crate) fn map_local(&self, f: impl Fn(T) -> T) -> DTensor<T> {
        new_output(self.local.mapv(f), &self.mesh, self.placements.clone(), self.shape.clone())
    }

    /// Element-wise `self + other` (broadcasting). `P + P → P`; `P + R → P` (the Replicate
    /// operand is made Partial locally).
    pub fn add(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        binary(
            "add",
            "add_backward",
            self,
            other,
            Linearity::All,
            |a, b| a + b,
            |g, _, _, n| Ok((when(n[0], || Ok(g.clone()))?, when(n[1], || Ok(g.clone()))?)),
        )
    }

    /// Element-wise `self - other` (broadcasting).
    pub fn sub(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        binary(
            "sub",
            "sub_backward",
            self,
            other,
            Linearity::All,
            |a, b| a - b,
            |g, _, _, n| Ok((when(n[0], || Ok(g.clone()))?, when(n[1], || g.neg())?)),
        )
    }

    /// Element-wise `self * other` (broadcasting). `P * R → P`, `R * P → P`.
    pub fn mul(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        binary(
            "mul",
            "mul_backward",
            self,
            other,
            Linearity::AnyOne,
            |a, b| a * b,
            |g, a, b, n| Ok((when(n[0], || g.mul(b))?, when(n[1], || g.mul(a))?)),
        )
    }

    /// Element-wise `self / other` (broadcasting). `P / R → P`.
    pub fn div(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        binary(
            "div",
            "div_backward",
            self,
            other,
            Linearity::First,
            |a, b| a / b,
            |g, a, b, n| Ok((when(n[0], || g.div(b))?, when(n[1], || g.mul(a)?.div(&b.mul(b)?)?.neg())?)),
        )
    }

    /// 1 where `self == other` (broadcasting), else 0. Not differentiable (no history).
    pub fn eq_mask(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        let eq = |a: T, b: T| if a == b { T::one() } else { T::zero() };
        let no_grad: BinaryBackward<T> = |_, _, _, _| Err(Error::Autograd("eq_mask has no gradient".into()));
        crate::autograd::no_grad(|| binary("eq", "eq_backward", self, other, Linearity::None, eq, no_grad))
    }

    /// `-self`. Keeps Partial(sum/avg).
    pub fn neg(&self) -> Result<DTensor<T>> {
        unary("neg", "neg_backward", self, &LINEAR, |x| -x, |g, _, _| g.neg())
    }

    /// `e^self`.
    pub fn exp(&self) -> Result<DTensor<T>> {
        unary("exp", "exp_backward", self, &[], |x| x.exp(), |g, _, y| g.mul(y))
    }

    /// Natural logarithm.
    pub fn log(&self) -> Result<DTensor<T>> {
        unary("log", "log_backward", self, &[], |x| x.ln(), |g, x, _| g.div(x))
    }

    /// `max(x, 0)`. A Partial input is reduced first (relu is not linear).
    pub fn relu(&self) -> Result<DTensor<T>> {
        unary(
            "relu",
            "relu_backward",
            self,
            &[],
            |x| if x > T::zero() { x } else { T::zero() },
            |g, x, _| g.mul(&x.map_local(|v| if v > T::zero() { T::one() } else { T::zero() })),
        )
    }

    /// GELU, tanh approximation (PyTorch `gelu(approximate="tanh")`). A Partial input is
    /// reduced first.
    pub fn gelu(&self) -> Result<DTensor<T>> {
        unary(
            "gelu",
            "gelu_backward",
            self,
            &[],
            |x| T::of_f64(gelu_f64(x.as_f64())),
            |g, x, _| g.mul(&x.map_local(|v| T::of_f64(gelu_grad_f64(v.as_f64())))),
        )
    }

    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<DTensor<T>> {
        unary("tanh", "tanh_backward", self, &[], |x| x.tanh(), |g, _, y| g.mul(&y.map_local(|t| T::one() - t * t)))
    }

    /// Square root.
    pub fn sqrt(&self) -> Result<DTensor<T>> {
        unary("sqrt", "sqrt_backward", self, &[], |x| x.sqrt(), |g, _, y| g.mul(&y.map_local(|s| T::of_f64(0.5) / s)))
    }

    /// `self + s`. Keeps Partial(avg/max/min) (adding a constant commutes with them).
    pub fn add_scalar(&self, s: T) -> Result<DTensor<T>> {
        unary(
            "add_scalar",
            "add_scalar_backward",
            self,
            &[ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min],
            move |x| x + s,
            |g, _, _| Ok(g.clone()),
        )
    }

    /// `self - s`.
    pub fn sub_scalar(&self, s: T) -> Result<DTensor<T>> {
        self.add_scalar(-s)
    }

    /// `self * s`. Keeps Partial(sum/avg).
    pub fn mul_scalar(&self, s: T) -> Result<DTensor<T>> {
        unary("mul_scalar", "mul_scalar_backward", self, &LINEAR, move |x| x * s, move |g, _, _| g.mul_scalar(s))
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

    #[test]
    fn gelu_derivative_matches_finite_difference() {
        for &x in &[-3.0, -0.5, 0.0, 0.7, 2.5] {
            let h = 1e-6;
            let fd = (gelu_f64(x + h) - gelu_f64(x - h)) / (2.0 * h);
            assert!((fd - gelu_grad_f64(x)).abs() < 1e-8, "x={x}");
        }
    }
}
