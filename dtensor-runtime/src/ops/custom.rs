//! Ops defined outside the crate: PyTorch's `register_sharding`, with the op's kernel and
//! backward in one place.
//!
//! A user describes an op by implementing [`CustomOp`] — its name, the global shape of its
//! output, its sharding rules on one mesh dim ([`DimRule`]s), a local kernel on the host (and,
//! with the `cuda` feature, optionally on the device) and its backward — and runs it with
//! [`apply_op`]. From there it takes the path of the library's own ops:
//!
//! - the strategy search (`strategy::select`) picks the cheapest rule per mesh dim, cached;
//!   inputs that match no rule are redistributed, logged in
//!   [`implicit_redistributions`](crate::implicit_redistributions), and refused inside a
//!   `#[distribute]` function ([`Error::ImplicitCollective`]);
//! - collectives are attributed to the op's name in [`CommDebugMode`](crate::CommDebugMode),
//!   forward and backward (the backward runs as `<name>_backward`);
//! - the output is recorded on the autograd tape: gradients flow through the op's
//!   [`CustomOp::backward`], written with DTensor ops (the library's or other custom ops).
//!
//! What the op promises is checked where it is used, and a broken promise is an
//! [`Error::OpDefinition`] naming the op: a rule with the wrong number of input placements or
//! a `Shard` of a dim the tensor does not have, two rules that take the same inputs to
//! different outputs, a rule whose output a kernel cannot make (a `Shard` or `Partial(sum)`
//! output from inputs none of which is split: the kernel does not know its rank), no rule at
//! all, a kernel whose local output does not have the shape its layout gives on this rank, a
//! gradient of another shape or on another mesh than its input. What cannot be checked is
//! whether the rules describe what the kernel computes (a `Partial(sum)` rule for a kernel
//! that is not linear in that input): the tests of the op do that, against the op composed of
//! built-in ops (see `examples/user-ops`). A kernel-shape error can show on some ranks only
//! (uneven shards); the others then fail in their next collective with
//! [`Error::PeerFailed`], never hang.
//!
//! ```
//! use dtensor_runtime::ndarray::{ArrayD, Zip};
//! use dtensor_runtime::ops::custom::{apply_op, Backward, CustomOp};
//! use dtensor_runtime::{distribute_tensor, DTensor, DimRule, Placement, Result, Shard};
//!
//! /// `x·s²`, element-wise: every layout but a Partial one passes through unchanged.
//! #[derive(Clone)]
//! struct ScaleBySquare(f64);
//!
//! impl CustomOp<f64> for ScaleBySquare {
//!     fn name(&self) -> &'static str {
//!         "scale_by_square"
//!     }
//!     fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
//!         Ok(inputs[0].to_vec())
//!     }
//!     fn rules(&self, inputs: &[&[usize]]) -> Vec<DimRule> {
//!         let mut rules = vec![DimRule::new(&[Placement::Replicate], Placement::Replicate)];
//!         for d in 0..inputs[0].len() as isize {
//!             rules.push(DimRule::new(&[Shard(d)], Shard(d)));
//!         }
//!         rules
//!     }
//!     fn forward(&self, inputs: &[&ArrayD<f64>]) -> Result<ArrayD<f64>> {
//!         Ok(inputs[0].mapv(|x| x * self.0 * self.0))
//!     }
//!     fn backward(&self, ctx: &Backward<'_, f64>) -> Result<Vec<Option<DTensor<f64>>>> {
//!         Ok(vec![Some(ctx.grad().mul_scalar(self.0 * self.0)?)])
//!     }
//! }
//!
//! let out = dtensor_runtime::run(2, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
//!     let g = ArrayD::from_shape_fn(vec![3, 2], |i| (i[0] * 2 + i[1]) as f64);
//!     let x = distribute_tensor(&g, &mesh, &[Shard(0)], None)?;
//!     let y = apply_op(&ScaleBySquare(3.0), &[&x])?; // stays Shard(0): no communication
//!     assert_eq!(y.placements(), &[Shard(0)]);
//!     y.full_tensor()
//! })
//! .unwrap();
//! assert_eq!(out[0][[2, 1]], 45.0);
//! ```

use super::new_output;
use super::strategy::{select, DimRule, Select};
use crate::autograd::{input_needs_grad, record, recording};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::placement::{fmt_placements, Placement, ReduceOp};
use crate::storage::Storage;
use ndarray::ArrayD;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// An op defined outside the crate: what [`apply_op`] needs to run it like one of the
/// library's own (see the [module docs](self) for an example).
///
/// The op is cloned into its autograd record (keep it small: a unit struct or a few
/// numbers); it takes any number of tensors of one element type and gives one tensor.
pub trait CustomOp<T: Element>: Clone + Send + Sync + 'static {
    /// The op's name, shown in errors, the implicit-redistribution log and `CommDebugMode`.
    fn name(&self) -> &'static str;

    /// The global shape of the output for inputs of these global shapes. Inputs the op does
    /// not take are an error here (return [`Error::ShapeMismatch`] or
    /// [`Error::InvalidArgument`]), before anything runs.
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>>;

    /// The op's sharding rules on one mesh dim, for inputs of these global shapes: each one
    /// input placement per input, and the output placement the kernel then gives. `Shard`
    /// dims may be negative (counted from the end of that tensor's dims). A rule of every
    /// input `Replicate` makes the op run on any layout (after redistributing to it).
    fn rules(&self, inputs: &[&[usize]]) -> Vec<DimRule>;

    /// The local kernel on host shards: the inputs' local shards, redistributed to the
    /// chosen rule, give this rank's shard of the output.
    fn forward(&self, inputs: &[&ArrayD<T>]) -> Result<ArrayD<T>>;

    /// The local kernel on device shards (the `cuda` feature): `None`, the default, when the
    /// op has none; then device inputs are an [`Error::Unsupported`] (nothing is copied to
    /// the host behind the user's back).
    fn forward_device(&self, inputs: &[&Storage<T>]) -> Option<Result<Storage<T>>> {
        let _ = inputs;
        None
    }

    /// The gradient of each input from the output's gradient, written with DTensor ops
    /// (so that their collectives and layouts are the ops' own); `None` for an input that
    /// gets none. Each gradient must have its input's global shape and mesh. The default is
    /// an [`Error::OpDefinition`]: the op has no backward.
    fn backward(&self, ctx: &Backward<'_, T>) -> Result<Vec<Option<DTensor<T>>>> {
        let _ = ctx;
        Err(Error::OpDefinition {
            op: self.name().into(),
            problem: "it has no backward (implement `CustomOp::backward`), and a gradient reached it".into(),
        })
    }
}

/// What a [`CustomOp::backward`] gets: the inputs as the kernel saw them (redistributed to the
/// chosen rule, without history), the output and the output's gradient.
pub struct Backward<'a, T: Element> {
    inputs: &'a [DTensor<T>],
    output: &'a DTensor<T>,
    grad: &'a DTensor<T>,
}

impl<T: Element> Backward<'_, T> {
    /// The inputs, laid out as the kernel saw them.
    pub fn inputs(&self) -> &[DTensor<T>] {
        self.inputs
    }

    /// Input `i`, laid out as the kernel saw it.
    ///
    /// # Panics
    /// If `i` is not below the number of inputs the op was applied to (as slice indexing).
    pub fn input(&self, i: usize) -> &DTensor<T> {
        &self.inputs[i]
    }

    /// The op's output.
    pub fn output(&self) -> &DTensor<T> {
        self.output
    }

    /// The gradient of the output.
    pub fn grad(&self) -> &DTensor<T> {
        self.grad
    }

    /// Does input `i` need a gradient? (A backward may skip the work, and its collectives,
    /// for inputs that do not.)
    pub fn needs_grad(&self, i: usize) -> bool {
        input_needs_grad(i)
    }
}

/// Runs the user's op `op` on `inputs` (one mesh): its rules' cheapest strategy, its kernel on
/// the local shards, its output recorded for autograd. See the [module docs](self).
pub fn apply_op<T: Element, O: CustomOp<T>>(op: &O, inputs: &[&DTensor<T>]) -> Result<DTensor<T>> {
    let name = op.name();
    let Some(first) = inputs.first() else {
        return Err(Error::OpDefinition { op: name.into(), problem: "it was applied to no tensor".into() });
    };
    let shapes: Vec<&[usize]> = inputs.iter().map(|x| x.shape()).collect();
    let out_shape = op.output_shape(&shapes)?;
    crate::shape::checked_numel(name, &out_shape)?;
    let rules = checked_rules(name, op.rules(&shapes), &shapes, out_shape.len())?;
    let chosen = select(name, inputs, &rules, Select::default())?;
    let ins: Vec<&DTensor<T>> = chosen.inputs.iter().map(|x| &**x).collect();
    let mesh = &first.mesh;
    let local = run_kernel(op, &ins)?;
    let (expected, _) = local_shape_and_offset(&out_shape, mesh.shape(), mesh.coordinate(), &chosen.output);
    if local.shape() != expected.as_slice() {
        return Err(Error::OpDefinition {
            op: name.into(),
            problem: format!(
                "its kernel returned a local shard of shape {:?} on rank {}, but its output of global shape {out_shape:?} laid out {} has a local shard of shape {expected:?} there",
                local.shape(),
                mesh.rank(),
                fmt_placements(&chosen.output),
            ),
        });
    }
    let out = new_output(local, mesh, chosen.output, out_shape);
    if !recording(&ins) {
        return Ok(out);
    }
    let saved: Vec<DTensor<T>> = ins.iter().map(|x| x.detach()).collect();
    let saved_out = out.detach();
    let op = op.clone();
    Ok(record(backward_name(name), out, &ins, move |g| {
        let grads = op.backward(&Backward { inputs: &saved, output: &saved_out, grad: g })?;
        checked_grads(op.name(), &saved, grads)
    }))
}

/// The kernel on the inputs' local shards: the host kernel for host shards, the device kernel
/// (if the op has one) for device shards.
fn run_kernel<T: Element, O: CustomOp<T>>(op: &O, ins: &[&DTensor<T>]) -> Result<Storage<T>> {
    let locals: Vec<&Storage<T>> = ins.iter().map(|x| &*x.local).collect();
    if let Some(host) = locals.iter().map(|s| s.as_cpu()).collect::<Option<Vec<_>>>() {
        return Ok(Storage::Cpu(op.forward(&host)?));
    }
    let device = ins[0].mesh.device();
    let out = op.forward_device(&locals).ok_or_else(|| Error::Unsupported {
        op: op.name().into(),
        reason: format!("the op has no device kernel (`CustomOp::forward_device`) for inputs on {device}"),
    })??;
    if out.device() != device {
        return Err(Error::OpDefinition {
            op: op.name().into(),
            problem: format!("its device kernel returned its output on {}, its inputs are on {device}", out.device()),
        });
    }
    Ok(out)
}

/// The op's rules with every `Shard` dim resolved against its tensor, after the checks of
/// the module docs.
fn checked_rules(op: &str, mut rules: Vec<DimRule>, shapes: &[&[usize]], out_ndim: usize) -> Result<Vec<DimRule>> {
    let bad = |problem: String| Error::OpDefinition { op: op.into(), problem };
    if rules.is_empty() {
        return Err(bad(format!(
            "it gives no sharding rule for inputs of shapes {shapes:?} (a rule of every input `Replicate` runs on any layout)"
        )));
    }
    for (k, rule) in rules.iter_mut().enumerate() {
        if rule.inputs.len() != shapes.len() {
            return Err(bad(format!(
                "rule {k} ({}) gives {} input placements for {} inputs",
                fmt_rule(rule),
                rule.inputs.len(),
                shapes.len()
            )));
        }
        for (i, shape) in shapes.iter().enumerate() {
            let p = rule.inputs[i];
            rule.inputs[i] = p.normalize(shape.len()).ok().ok_or_else(|| {
                bad(format!("rule {k} ({}) shards {p} of input {i}, which has {} dims", fmt_rule(rule), shape.len()))
            })?;
        }
        let out = rule.output;
        rule.output = out.normalize(out_ndim).ok().ok_or_else(|| {
            bad(format!("rule {k} ({}) shards {out} of the output, which has {out_ndim} dims", fmt_rule(rule)))
        })?;
    }
    for (k, rule) in rules.iter().enumerate() {
        // A kernel sees its shards, not which rank it runs on, so every rank computes the same
        // from inputs none of which is split: it cannot give one shard of a result, nor one
        // term of a sum (the ranks' equal terms would add up to n times the value).
        let split = |p: &Placement| matches!(p, Placement::Shard(_) | Placement::Partial(_));
        let from_replicas = match rule.output {
            Placement::Shard(_) => !rule.inputs.iter().any(|p| matches!(p, Placement::Shard(_))),
            Placement::Partial(ReduceOp::Sum | ReduceOp::Product) => !rule.inputs.iter().any(split),
            _ => false,
        };
        if from_replicas {
            return Err(bad(format!(
                "rule {k} ({}) makes a {} output from inputs that are not split on that mesh dim: every rank's kernel computes the same value, so its output there is Replicate (or Partial(avg/max/min))",
                fmt_rule(rule),
                rule.output
            )));
        }
    }
    for (j, b) in rules.iter().enumerate() {
        if let Some(i) = rules[..j].iter().position(|a| a.inputs == b.inputs && a.output != b.output) {
            return Err(bad(format!(
                "rules {i} ({}) and {j} ({}) take the same input placements to different outputs",
                fmt_rule(&rules[i]),
                fmt_rule(b)
            )));
        }
    }
    Ok(rules)
}

fn fmt_rule(rule: &DimRule) -> String {
    format!("{} → {}", fmt_placements(&rule.inputs), rule.output)
}

/// The backward's gradients after the checks of the module docs.
fn checked_grads<T: Element>(
    op: &str,
    inputs: &[DTensor<T>],
    grads: Vec<Option<DTensor<T>>>,
) -> Result<Vec<Option<DTensor<T>>>> {
    let bad = |problem: String| Error::OpDefinition { op: op.into(), problem };
    if grads.len() != inputs.len() {
        return Err(bad(format!("its backward returned {} gradients for {} inputs", grads.len(), inputs.len())));
    }
    for (i, (g, x)) in grads.iter().zip(inputs).enumerate() {
        let Some(g) = g else { continue };
        if g.shape != x.shape {
            return Err(bad(format!(
                "its backward returned a gradient of shape {:?} for input {i} of shape {:?}",
                g.shape, x.shape
            )));
        }
        if g.mesh != x.mesh {
            return Err(bad(format!(
                "its backward returned the gradient of input {i} on mesh {}, the input lives on mesh {}",
                g.mesh, x.mesh
            )));
        }
    }
    Ok(grads)
}

/// `<op>_backward` as a `'static` name for the autograd tape, made once per op name.
pub(crate) fn backward_name(op: &'static str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
    let mut names = NAMES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    names.entry(op).or_insert_with(|| Box::leak(format!("{op}_backward").into_boxed_str()))
}
