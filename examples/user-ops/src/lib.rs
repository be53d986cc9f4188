//! A user's crate: fused ops added to dtensor through its public op-extension API only
//! ([`CustomOp`], [`apply_op`], [`DimRule`]). `docs/ADDING_AN_OP.md` walks through it.
//!
//! - [`SwiGlu`]: `silu(gate) · up` in one kernel (the MLP of Llama), with its backward as two
//!   more fused ops ([`SwiGluGradGate`], [`SwiGluGradUp`]) whose rules let a `Partial` output
//!   gradient through, since they are linear in it.
//! - [`Linear`]: `x · Wᵀ` with Hugging Face's `[out, in]` weight, with the column-parallel
//!   (`W` sharded on `out`) and row-parallel (`x` and `W` sharded on `in`, a `Partial` sum)
//!   rules of Megatron's tensor parallelism; its backward is written with the library's ops.
//! - [`RmsNormLinear`]: `rms_norm(x, g) · Wᵀ`, the pre-norm projection of a Llama block, in one
//!   op of three inputs; column parallel over `W`'s `out` (the norm needs whole rows of `x`).
//!
//! Each op also has typed rules ([`SwiGluRule`], [`LinearRule`], lifted by
//! [`dtensor::typed_rule!`] and tied to the op by [`TypedOp2`]), so that in the typed layer an
//! illegal layout for them is a compile error with their own message.
//!
//! The tests (`tests/`) check each against the same computation composed of built-in ops, on 1
//! and 4 ranks, forward and backward, with uneven shards and empty ones, in both layers.

use dtensor::ndarray::{ArrayD, Ix2, Zip};
use dtensor::ops::custom::Backward;
use dtensor::typed::{self, MeshDims, PlacementMarker, Rank, TypedLayout, TypedOp2, TypedOp3};
use dtensor::{apply_op, CustomOp, DTensor, DimRule, Element, Error, Placement, ReduceOp, Result, Shard};

const R: Placement = Placement::Replicate;
const P: Placement = Placement::Partial(ReduceOp::Sum);

/// `silu(gate) · up`, element-wise, fused (one pass over the data instead of three).
///
/// Rules on one mesh dim: both inputs `Replicate` → `Replicate`; both `Shard(d)` (any dim) →
/// `Shard(d)`. A `Partial` input is reduced first (silu is not linear).
#[derive(Clone, Copy, Debug, Default)]
pub struct SwiGlu;

/// `∂(silu(gate)·up)/∂gate · g = g · up · silu'(gate)`: the gate's gradient, fused. Linear in
/// `g`, so a `Partial(sum)` `g` with replicated `gate` and `up` gives a `Partial(sum)` gradient.
#[derive(Clone, Copy, Debug, Default)]
pub struct SwiGluGradGate;

/// `∂(silu(gate)·up)/∂up · g = g · silu(gate)`: the up projection's gradient, fused. Linear in
/// `g` like [`SwiGluGradGate`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SwiGluGradUp;

/// `x · Wᵀ` with `x: [.., in]` and `W: [out, in]` (Hugging Face's `nn.Linear` orientation).
///
/// Rules on one mesh dim: `(R, R) → R`; `(Shard(d), R) → Shard(d)` for a batch dim `d` of `x`;
/// `(R, Shard(0)) → Shard(-1)` (column parallel); `(Shard(-1), Shard(1)) → Partial(sum)` (row
/// parallel); `(Partial(sum), R) → Partial(sum)` (linear in `x`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Linear;

/// `rms_norm(x, g) · Wᵀ` with `x: [.., in]`, the norm weight `g: [in]` and `W: [out, in]`:
/// `x / √(mean(x²) + eps) · g`, then the linear map, in one pass.
///
/// Rules on one mesh dim: `(R, R, R) → R`; `(Shard(d), R, R) → Shard(d)` for a batch dim `d`;
/// `(R, R, Shard(0)) → Shard(-1)` (column parallel). `x` is never split on `in`: the norm
/// reads whole rows.
#[derive(Clone, Copy, Debug)]
pub struct RmsNormLinear {
    /// Added to the mean square before the root.
    pub eps: f64,
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn silu_grad(x: f64) -> f64 {
    let s = 1.0 / (1.0 + (-x).exp());
    s * (1.0 + x * (1.0 - s))
}

fn f<T: Element>(x: T) -> f64 {
    x.to_f64().unwrap_or(f64::NAN)
}

fn t<T: Element>(x: f64) -> T {
    T::from_f64(x).unwrap_or_else(T::nan)
}

/// The inputs of an element-wise op: `n` tensors of one shape, which is the output's.
fn same_shapes(op: &str, inputs: &[&[usize]], n: usize) -> Result<Vec<usize>> {
    if inputs.len() != n {
        return Err(Error::InvalidArgument {
            context: op.into(),
            reason: format!("takes {n} tensors, got {}", inputs.len()),
        });
    }
    if let Some(other) = inputs.iter().find(|s| **s != inputs[0]) {
        return Err(Error::ShapeMismatch {
            context: format!("{op}: every input has the first one's shape"),
            expected: inputs[0].to_vec(),
            actual: other.to_vec(),
        });
    }
    Ok(inputs[0].to_vec())
}

/// Element-wise rules over `n` inputs of rank `ndim`: all `Replicate`, or all `Shard(d)`.
fn elementwise_rules(n: usize, ndim: usize) -> Vec<DimRule> {
    let mut rules = vec![DimRule::new(&vec![R; n], R)];
    rules.extend((0..ndim as isize).map(|d| DimRule::new(&vec![Shard(d); n], Shard(d))));
    rules
}

impl<T: Element> CustomOp<T> for SwiGlu {
    fn name(&self) -> &'static str {
        "fused_swiglu"
    }

    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        same_shapes("fused_swiglu", inputs, 2)
    }

    fn rules(&self, inputs: &[&[usize]]) -> Vec<DimRule> {
        elementwise_rules(2, inputs[0].len())
    }

    fn forward(&self, inputs: &[&ArrayD<T>]) -> Result<ArrayD<T>> {
        Ok(Zip::from(inputs[0]).and(inputs[1]).map_collect(|&g, &u| t::<T>(silu(f(g))) * u))
    }

    fn backward(&self, ctx: &Backward<'_, T>) -> Result<Vec<Option<DTensor<T>>>> {
        let (gate, up, g) = (ctx.input(0), ctx.input(1), ctx.grad());
        let d_gate = if ctx.needs_grad(0) { Some(apply_op(&SwiGluGradGate, &[gate, up, g])?) } else { None };
        let d_up = if ctx.needs_grad(1) { Some(apply_op(&SwiGluGradUp, &[gate, g])?) } else { None };
        Ok(vec![d_gate, d_up])
    }
}

impl<T: Element> CustomOp<T> for SwiGluGradGate {
    fn name(&self) -> &'static str {
        "fused_swiglu_grad_gate"
    }

    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        same_shapes("fused_swiglu_grad_gate", inputs, 3)
    }

    fn rules(&self, inputs: &[&[usize]]) -> Vec<DimRule> {
        let mut rules = elementwise_rules(3, inputs[0].len());
        rules.push(DimRule::new(&[R, R, P], P));
        rules
    }

    fn forward(&self, inputs: &[&ArrayD<T>]) -> Result<ArrayD<T>> {
        Ok(Zip::from(inputs[0]).and(inputs[1]).and(inputs[2]).map_collect(|&x, &u, &g| g * u * t::<T>(silu_grad(f(x)))))
    }
}

impl<T: Element> CustomOp<T> for SwiGluGradUp {
    fn name(&self) -> &'static str {
        "fused_swiglu_grad_up"
    }

    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        same_shapes("fused_swiglu_grad_up", inputs, 2)
    }

    fn rules(&self, inputs: &[&[usize]]) -> Vec<DimRule> {
        let mut rules = elementwise_rules(2, inputs[0].len());
        rules.push(DimRule::new(&[R, P], P));
        rules
    }

    fn forward(&self, inputs: &[&ArrayD<T>]) -> Result<ArrayD<T>> {
        Ok(Zip::from(inputs[0]).and(inputs[1]).map_collect(|&x, &g| g * t::<T>(silu(f(x)))))
    }
}

impl<T: Element> CustomOp<T> for Linear {
    fn name(&self) -> &'static str {
        "fused_linear"
    }

    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let bad = |reason: String| Error::InvalidArgument { context: "fused_linear".into(), reason };
        let [x, w] = inputs else { return Err(bad(format!("takes x and W, got {} tensors", inputs.len()))) };
        match (x.split_last(), w) {
            (Some((&inner, batch)), &[out, w_in]) if inner == *w_in && !batch.is_empty() => {
                Ok(batch.iter().copied().chain([*out]).collect())
            }
            _ => Err(bad(format!("x {x:?} must be [.., in] (rank ≥ 2) and W {w:?} must be [out, in]"))),
        }
    }

    fn rules(&self, inputs: &[&[usize]]) -> Vec<DimRule> {
        let batch = inputs[0].len() as isize - 1;
        let mut rules = vec![DimRule::new(&[R, R], R), DimRule::new(&[R, Shard(0)], Shard(-1))];
        rules.push(DimRule::new(&[Shard(-1), Shard(1)], P));
        rules.push(DimRule::new(&[P, R], P));
        rules.extend((0..batch).map(|d| DimRule::new(&[Shard(d), R], Shard(d))));
        rules
    }

    fn forward(&self, inputs: &[&ArrayD<T>]) -> Result<ArrayD<T>> {
        let (x, w) = (inputs[0], inputs[1]);
        // from the shape, not `len / inner`: a shard of `in` may be empty (and its product zeros)
        let (inner, rows) = x.shape().split_last().map_or((0, 0), |(&i, batch)| (i, batch.iter().product()));
        let as2 = |a: &ArrayD<T>, r, c| {
            a.as_standard_layout()
                .into_owned()
                .into_shape_with_order((r, c))
                .map_err(|e| Error::InvalidArgument { context: "fused_linear".into(), reason: e.to_string() })
        };
        let w2 = w
            .view()
            .into_dimensionality::<Ix2>()
            .map_err(|e| Error::InvalidArgument { context: "fused_linear".into(), reason: e.to_string() })?;
        let y = as2(x, rows, inner)?.dot(&w2.t());
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("rank ≥ 2") = w.shape()[0];
        y.into_shape_with_order(shape)
            .map_err(|e| Error::InvalidArgument { context: "fused_linear".into(), reason: e.to_string() })
    }

    fn backward(&self, ctx: &Backward<'_, T>) -> Result<Vec<Option<DTensor<T>>>> {
        let (x, w, g) = (ctx.input(0), ctx.input(1), ctx.grad());
        let dx = if ctx.needs_grad(0) { Some(g.matmul(w)?) } else { None };
        let dw = if ctx.needs_grad(1) {
            let n = x.shape().len() as isize;
            let (g2, x2) = if n > 2 { (g.flatten(0, n - 2)?, x.flatten(0, n - 2)?) } else { (g.clone(), x.clone()) };
            Some(g2.matmul_t(&x2, true, false)?)
        } else {
            None
        };
        Ok(vec![dx, dw])
    }
}

impl<T: Element> CustomOp<T> for RmsNormLinear {
    fn name(&self) -> &'static str {
        "fused_rms_norm_linear"
    }

    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        let bad = |reason: String| Error::InvalidArgument { context: "fused_rms_norm_linear".into(), reason };
        let [x, g, w] = inputs else { return Err(bad(format!("takes x, g and W, got {} tensors", inputs.len()))) };
        match (x.split_last(), g, w) {
            (Some((&inner, batch)), &[g_in], &[out, w_in]) if inner == *g_in && inner == *w_in && !batch.is_empty() => {
                Ok(batch.iter().copied().chain([*out]).collect())
            }
            _ => Err(bad(format!("x {x:?} must be [.., in] (rank ≥ 2), g {g:?} [in] and W {w:?} [out, in]"))),
        }
    }

    fn rules(&self, inputs: &[&[usize]]) -> Vec<DimRule> {
        let batch = inputs[0].len() as isize - 1;
        let mut rules = vec![DimRule::new(&[R, R, R], R), DimRule::new(&[R, R, Shard(0)], Shard(-1))];
        rules.extend((0..batch).map(|d| DimRule::new(&[Shard(d), R, R], Shard(d))));
        rules
    }

    fn forward(&self, inputs: &[&ArrayD<T>]) -> Result<ArrayD<T>> {
        let (x, g) = (inputs[0], inputs[1]);
        let inner = *x.shape().last().unwrap_or(&0);
        let mut y = x.as_standard_layout().into_owned();
        if inner > 0 {
            for mut row in y.lanes_mut(dtensor::ndarray::Axis(x.ndim() - 1)) {
                let ms = row.iter().map(|&v| f(v) * f(v)).sum::<f64>() / inner as f64;
                let r = 1.0 / (ms + self.eps).sqrt();
                row.iter_mut().zip(g.iter()).for_each(|(v, &gi)| *v = t::<T>(f(*v) * r) * gi);
            }
        }
        Linear.forward(&[&y, inputs[2]])
    }

    fn backward(&self, ctx: &Backward<'_, T>) -> Result<Vec<Option<DTensor<T>>>> {
        let (x, g, w, gout) = (ctx.input(0), ctx.input(1), ctx.input(2), ctx.grad());
        // the norm again, from library ops (their layouts and collectives are theirs)
        let r = x.mul(x)?.mean_dim(-1, true)?.add_scalar(t(self.eps))?.rsqrt()?;
        let n = x.mul(&r)?;
        let y = n.mul(g)?;
        let n_dims = x.shape().len() as isize;
        let rows = |a: &DTensor<T>| if n_dims > 2 { a.flatten(0, n_dims - 2) } else { Ok(a.clone()) };
        let dw = if ctx.needs_grad(2) { Some(rows(gout)?.matmul_t(&rows(&y)?, true, false)?) } else { None };
        let dy = gout.matmul(w)?;
        let dg = if ctx.needs_grad(1) { Some(rows(&dy.mul(&n)?)?.sum_dim(0, false)?) } else { None };
        let dx = if ctx.needs_grad(0) {
            // d/dx of x·r: r·(dn − n·mean(dn·n)) over the row
            let dn = dy.mul(g)?;
            Some(r.mul(&dn.sub(&n.mul(&dn.mul(&n)?.mean_dim(-1, true)?)?)?)?)
        } else {
            None
        };
        Ok(vec![dx, dg, dw])
    }
}

// ------------------------------------------------------------------------------ typed rules

/// [`SwiGlu`]'s rule on one mesh dim, for the typed layer: `gate` and `up` laid out alike.
#[diagnostic::on_unimplemented(
    message = "fused_swiglu needs gate and up laid out alike on mesh dim `{Name}`: got `{Self}` and `{Rhs}`",
    label = "no fused_swiglu rule for `{Self}` and `{Rhs}` on mesh dim `{Name}`",
    note = "legal per mesh dim: both `Replicate` or both `Shard<D>`; a Partial is reduced first (silu is not linear)"
)]
pub trait SwiGluRule<Rhs, Name> {
    /// The output's placement on this mesh dim.
    type Out: PlacementMarker;
}
impl<N> SwiGluRule<typed::Replicate, N> for typed::Replicate {
    type Out = typed::Replicate;
}
impl<N, const D: usize> SwiGluRule<typed::Shard<D>, N> for typed::Shard<D> {
    type Out = typed::Shard<D>;
}
dtensor::typed_rule!(
    /// [`SwiGluRule`] on every mesh dim.
    binary SwiGluLayout = SwiGluRule
);

impl<T: Element, M: MeshDims, L1, L2, const R: usize> TypedOp2<T, M, L1, L2, R, R, R> for SwiGlu
where
    L1: SwiGluLayout<L2, M>,
    L2: TypedLayout<M>,
{
    type Out = <L1 as SwiGluLayout<L2, M>>::Out;
}

/// [`Linear`]'s rule on one mesh dim, for `x` of rank `R` (the context `Rank<R>`) and `W` a
/// matrix `[out, in]`.
#[diagnostic::on_unimplemented(
    message = "fused_linear of `{Self}` x and `{Rhs}` W on mesh dim `{Name}` is not a legal layout",
    label = "no fused_linear rule for `{Self}` · `{Rhs}`ᵀ on mesh dim `{Name}`",
    note = "legal per mesh dim (x [.., in], W [out, in]): R·R→R, S(batch)·R→S(batch), R·S<0>→S(last) (column parallel), S(last)·S<1>→Partial<Sum> (row parallel), Partial<Sum>·R→Partial<Sum>"
)]
pub trait LinearRule<Rhs, Name, Ctx> {
    /// The output's placement on this mesh dim.
    type Out: PlacementMarker;
}
impl<N, const R: usize> LinearRule<typed::Replicate, N, Rank<R>> for typed::Replicate {
    type Out = typed::Replicate;
}
impl<N, const R: usize> LinearRule<typed::Replicate, N, Rank<R>> for typed::Partial<typed::Sum> {
    type Out = typed::Partial<typed::Sum>;
}

/// Per rank of `x`: its batch dims, and its last dim (`in`, and the output's `out`).
macro_rules! linear_rank_rules {
    ($($r:literal: [$($batch:literal),+], last = $last:literal;)+) => {$(
        $(impl<N> LinearRule<typed::Replicate, N, Rank<$r>> for typed::Shard<$batch> {
            type Out = typed::Shard<$batch>;
        })+
        impl<N> LinearRule<typed::Shard<0>, N, Rank<$r>> for typed::Replicate {
            type Out = typed::Shard<$last>;
        }
        impl<N> LinearRule<typed::Shard<1>, N, Rank<$r>> for typed::Shard<$last> {
            type Out = typed::Partial<typed::Sum>;
        }
    )+};
}
linear_rank_rules! {
    2: [0], last = 1;
    3: [0, 1], last = 2;
}
dtensor::typed_rule!(
    /// [`LinearRule`] on every mesh dim.
    binary LinearLayout = LinearRule, ctx
);

impl<T: Element, M: MeshDims, L1, L2, const R: usize> TypedOp2<T, M, L1, L2, R, 2, R> for Linear
where
    L1: LinearLayout<L2, M, Rank<R>>,
    L2: TypedLayout<M>,
{
    type Out = <L1 as LinearLayout<L2, M, Rank<R>>>::Out;
}

/// [`RmsNormLinear`]'s rule on one mesh dim, for `x` of rank `R` (`Rank<R>`), its norm weight
/// `g` and `W`.
#[diagnostic::on_unimplemented(
    message = "fused_rms_norm_linear of x `{Self}`, g `{G}`, W `{W}` on mesh dim `{Name}` is not a legal layout",
    label = "no fused_rms_norm_linear rule for `{Self}`, `{G}`, `{W}` on mesh dim `{Name}`",
    note = "legal per mesh dim: all Replicate; x S(batch) with g, W Replicate; x, g Replicate with W S<0> (column parallel). x is never split on its last dim: the norm reads whole rows"
)]
pub trait RmsNormLinearRule<G, W, Name, Ctx> {
    /// The output's placement on this mesh dim.
    type Out: PlacementMarker;
}
impl<N, const R: usize> RmsNormLinearRule<typed::Replicate, typed::Replicate, N, Rank<R>> for typed::Replicate {
    type Out = typed::Replicate;
}

/// Per rank of `x`: its batch dims, and the output's last dim.
macro_rules! norm_linear_rank_rules {
    ($($r:literal: [$($batch:literal),+], last = $last:literal;)+) => {$(
        $(impl<N> RmsNormLinearRule<typed::Replicate, typed::Replicate, N, Rank<$r>> for typed::Shard<$batch> {
            type Out = typed::Shard<$batch>;
        })+
        impl<N> RmsNormLinearRule<typed::Replicate, typed::Shard<0>, N, Rank<$r>> for typed::Replicate {
            type Out = typed::Shard<$last>;
        }
    )+};
}
norm_linear_rank_rules! {
    2: [0], last = 1;
    3: [0, 1], last = 2;
}
dtensor::typed_rule!(
    /// [`RmsNormLinearRule`] on every mesh dim.
    ternary RmsNormLinearLayout = RmsNormLinearRule, ctx
);

impl<T: Element, M: MeshDims, L1, L2, L3, const R: usize> TypedOp3<T, M, L1, L2, L3, R, 1, 2, R> for RmsNormLinear
where
    L1: RmsNormLinearLayout<L2, L3, M, Rank<R>>,
    L2: TypedLayout<M>,
    L3: TypedLayout<M>,
{
    type Out = <L1 as RmsNormLinearLayout<L2, L3, M, Rank<R>>>::Out;
}
