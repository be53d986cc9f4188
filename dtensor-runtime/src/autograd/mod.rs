//! Reverse-mode autograd for DTensors.
//!
//! Every op that has an input with `requires_grad` records a node holding its backward
//! function and edges to its inputs' nodes (a define-by-run graph, as in PyTorch). A leaf
//! (a tensor made with `requires_grad`) owns a gradient cell. [`DTensor::backward`] walks
//! the graph in reverse topological order; gradients are DTensors, and every backward rule
//! is written with the dynamic ops themselves, so the sharding rules of the forward ops
//! decide the gradients' layouts and collectives. A leaf's gradient is redistributed to the
//! leaf's own placements (Partial → Replicate), so `.grad()` has the parameter's layout.
//!
//! Nodes are `Arc`s behind `Mutex`es: DTensors stay `Send` and can move between threads.
//!
//! ```
//! use dtensor_runtime::{run, distribute_tensor, Shard, Replicate, ndarray::ArrayD};
//! let grads = run(2, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
//!     let x = ArrayD::from_shape_vec(vec![3], vec![1.0f64, 2.0, 3.0]).unwrap();
//!     let x = distribute_tensor(&x, &mesh, &[Shard(0)], None)?.requires_grad_(true);
//!     let y = x.mul(&x)?.sum()?; // sum of squares
//!     y.backward()?;
//!     Ok(x.grad().unwrap().full_tensor()?.into_raw_vec_and_offset().0)
//! }).unwrap();
//! assert_eq!(grads[1], vec![2.0, 4.0, 6.0]);
//! ```

mod engine;
mod float_split;
mod grad_reducer;
pub(crate) mod local;
mod options;

pub(crate) use engine::input_needs_grad;
pub(crate) use float_split::{recorded_redistribution, redistribute_recorded, with_requires_grad};
pub use local::{from_local_grad, is_local_mesh, local_mesh};
pub use options::BackwardOptions;

use crate::dtensor::DTensor;
use crate::element::{DType, Element, Scalar};
use crate::error::{Error, Result};
use crate::placement::{normalize_placements, without_partials, Placement};
use std::cell::Cell;
use std::fmt;
use std::sync::{Arc, Mutex};

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Is gradient recording on for this thread (rank)?
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Restores the previous grad mode when dropped (see [`no_grad_guard`]).
#[must_use = "grad mode is restored when the guard is dropped"]
pub struct NoGradGuard {
    prev: bool,
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.prev));
    }
}

/// Turns gradient recording off on this thread until the guard drops.
pub fn no_grad_guard() -> NoGradGuard {
    let prev = GRAD_ENABLED.with(|g| g.replace(false));
    NoGradGuard { prev }
}

/// Turns gradient recording on until the guard drops (a backward that records the
/// recomputation of a forward: FSDP's resharding).
pub(crate) fn enable_grad_guard() -> NoGradGuard {
    let prev = GRAD_ENABLED.with(|g| g.replace(true));
    NoGradGuard { prev }
}

/// Runs `f` without recording gradients (PyTorch `with torch.no_grad()`).
///
/// ```
/// use dtensor_runtime::{run, ones, TensorOptions, autograd::no_grad};
/// run(1, |ctx| {
///     ctx.init_device_mesh(&[1], &["x"])?;
///     let w = ones::<f32>(&[2], &TensorOptions::new().requires_grad(true))?;
///     let y = no_grad(|| w.mul(&w))?;
///     assert!(!y.requires_grad());
///     Ok(())
/// }).unwrap();
/// ```
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _g = no_grad_guard();
    f()
}

/// Backward function of a node: gradient of the output → one gradient per input
/// (`None` where the input needs none).
pub(crate) type BackwardFn<T> = Box<dyn Fn(&DTensor<T>) -> Result<Vec<Option<DTensor<T>>>> + Send + Sync>;

/// A vertex of the autograd graph.
pub(crate) struct Node<T: Scalar> {
    /// Name of the backward (what collectives in it are attributed to).
    pub(crate) name: &'static str,
    pub(crate) kind: NodeKind<T>,
}

pub(crate) enum NodeKind<T: Scalar> {
    /// A tensor made with `requires_grad`: accumulates its gradient in the parameter's layout.
    Leaf { grad: Box<Mutex<Option<DTensor<T>>>>, placements: Vec<Placement>, shape: Vec<usize> },
    /// The output of an op. The backward (with the tensors it saved) is dropped by the first
    /// backward pass through the node, unless that pass retains the graph, as in PyTorch.
    Op { inputs: Vec<Option<Arc<Node<T>>>>, backward: Mutex<Option<BackwardFn<T>>> },
}

/// Per-tensor autograd state: the node that produced the tensor (or its leaf cell).
#[derive(Clone)]
pub struct AutogradMeta<T: Scalar> {
    pub(crate) node: Option<Arc<Node<T>>>,
}

impl<T: Scalar> Default for AutogradMeta<T> {
    fn default() -> Self {
        AutogradMeta { node: None }
    }
}

impl<T: Scalar> fmt::Debug for AutogradMeta<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            None => f.write_str("no grad"),
            Some(n) => write!(f, "grad_fn={}", n.name),
        }
    }
}

/// Will [`record`] attach a node for these inputs? (Ops check it before copying the tensors
/// their backward saves.)
pub(crate) fn recording<T: Scalar>(inputs: &[&DTensor<T>]) -> bool {
    is_grad_enabled() && inputs.iter().any(|x| x.requires_grad())
}

/// Records `out` as produced by an op from `inputs` with `backward`, when grad mode is on
/// and some input requires grad. `backward` returns one gradient per input.
pub(crate) fn record<T: Scalar>(
    name: &'static str,
    mut out: DTensor<T>,
    inputs: &[&DTensor<T>],
    backward: impl Fn(&DTensor<T>) -> Result<Vec<Option<DTensor<T>>>> + Send + Sync + 'static,
) -> DTensor<T> {
    if !recording(inputs) {
        out.autograd = AutogradMeta::default();
        return out;
    }
    let inputs = inputs.iter().map(|x| x.autograd.node.clone()).collect();
    out.autograd.node =
        Some(Arc::new(Node { name, kind: NodeKind::Op { inputs, backward: Mutex::new(Some(Box::new(backward))) } }));
    out
}

/// Called by `from_local` with the user's `grad_placements`: checks them. (A plain array
/// has no history; [`from_local_grad`] is the variant whose backward reaches a local tensor.)
pub(crate) fn on_from_local<T: Scalar>(dt: &mut DTensor<T>, grad_placements: Option<Vec<Placement>>) -> Result<()> {
    if let Some(g) = grad_placements {
        normalize_placements(&g, dt.ndim(), dt.mesh.ndim())?;
    }
    Ok(())
}

/// A redistribution recorded on the tape; collectives are attributed to `label`.
/// Backward redistributes the gradient to the source placements (Partial → Replicate),
/// running its collectives in `backward_dtype` when given.
pub(crate) fn redistribute_op<T: Element>(
    x: &DTensor<T>,
    to: &[Placement],
    label: &'static str,
    backward_dtype: Option<DType>,
) -> Result<DTensor<T>> {
    let out = x.redistribute_scoped(to, label)?;
    let target = without_partials(&x.placements);
    Ok(record("redistribute_backward", out, &[x], move |g| {
        Ok(vec![Some(redistribute_grad(g, &target, backward_dtype, "redistribute_backward")?)])
    }))
}

/// Records `out`, the redistribution of `x` the op dispatcher already ran from its one plan,
/// as [`redistribute_op`] would (backward: the gradient back to `x`'s layout).
pub(crate) fn record_redistribution<T: Element>(x: &DTensor<T>, out: DTensor<T>) -> DTensor<T> {
    let target = without_partials(&x.placements);
    record("redistribute_backward", out, &[x], move |g| {
        Ok(vec![Some(redistribute_grad(g, &target, None, "redistribute_backward")?)])
    })
}

/// Redistributes a gradient (no history) to `target`, through `dtype` when it differs from `T`.
pub(crate) fn redistribute_grad<T: Element>(
    g: &DTensor<T>,
    target: &[Placement],
    dtype: Option<DType>,
    label: &'static str,
) -> Result<DTensor<T>> {
    if g.placements == target {
        return Ok(g.detach());
    }
    fn via<T: Element, U: Element>(g: &DTensor<T>, target: &[Placement], label: &'static str) -> Result<DTensor<T>> {
        g.cast::<U>()?.redistribute_scoped(target, label)?.cast::<T>()
    }
    match dtype {
        Some(d) if d == T::DTYPE => g.redistribute_scoped(target, label),
        Some(DType::F32) => via::<T, f32>(g, target, label),
        Some(DType::F64) => via::<T, f64>(g, target, label),
        Some(DType::BF16) => via::<T, half::bf16>(g, target, label),
        Some(DType::F16) => via::<T, half::f16>(g, target, label),
        Some(d) => Err(Error::Unsupported {
            op: label.into(),
            reason: format!("gradients cannot be reduced in the integer dtype {d}"),
        }),
        None => g.redistribute_scoped(target, label),
    }
}

/// Autograd state every element type has (integers never require grad).
impl<T: Scalar> DTensor<T> {
    /// Does this tensor take part in autograd (a leaf with `requires_grad`, or an op output
    /// that depends on one)?
    pub fn requires_grad(&self) -> bool {
        self.autograd.node.is_some()
    }

    /// Same data, no autograd history.
    pub fn detach(&self) -> Self {
        let mut d = self.clone();
        d.autograd = AutogradMeta::default();
        d
    }
}

impl<T: Element> DTensor<T> {
    /// Is this a tensor the user created (no grad_fn)? Tensors without grad are leaves too.
    pub fn is_leaf(&self) -> bool {
        match &self.autograd.node {
            None => true,
            Some(n) => matches!(n.kind, NodeKind::Leaf { .. }),
        }
    }

    /// Makes this tensor a leaf that accumulates its gradient (`true`), or detaches it
    /// (`false`). PyTorch `requires_grad_()`; consumes and returns the tensor.
    pub fn requires_grad_(mut self, requires_grad: bool) -> Self {
        self.autograd.node = if requires_grad {
            Some(Arc::new(Node {
                name: "leaf",
                kind: NodeKind::Leaf {
                    grad: Box::new(Mutex::new(None)),
                    placements: self.placements.clone(),
                    shape: self.shape.clone(),
                },
            }))
        } else {
            None
        };
        self
    }

    /// The accumulated gradient of a leaf, laid out like the leaf (`None` before any backward
    /// or for non-leaves).
    pub fn grad(&self) -> Option<DTensor<T>> {
        match self.autograd.node.as_deref() {
            Some(Node { kind: NodeKind::Leaf { grad, .. }, .. }) => {
                grad.lock().unwrap_or_else(|e| e.into_inner()).clone()
            }
            _ => None,
        }
    }

    /// Replaces the gradient of a leaf (PyTorch's `p.grad = g`): `g` must have the leaf's
    /// shape and layout (what the backward accumulates into it); its history is dropped.
    /// An [`Error::Autograd`] for a tensor that is no leaf with `requires_grad`, or a `g` of
    /// another shape or layout.
    pub fn set_grad(&self, g: &DTensor<T>) -> Result<()> {
        let Some(Node { kind: NodeKind::Leaf { grad, placements, shape }, .. }) = self.autograd.node.as_deref() else {
            return Err(Error::Autograd("set_grad on a tensor that is not a leaf with requires_grad".into()));
        };
        if g.shape() != shape.as_slice() || g.placements() != placements.as_slice() || !g.mesh.same_as(&self.mesh) {
            return Err(Error::Autograd(format!(
                "set_grad: the gradient is {:?} laid out {} but the leaf is {shape:?} laid out {}",
                g.shape(),
                crate::placement::fmt_placements(g.placements()),
                crate::placement::fmt_placements(placements)
            )));
        }
        *grad.lock().unwrap_or_else(|e| e.into_inner()) = Some(g.detach());
        Ok(())
    }

    /// Clears the gradient of a leaf (PyTorch `zero_grad(set_to_none=True)`).
    pub fn zero_grad(&self) {
        if let Some(Node { kind: NodeKind::Leaf { grad, .. }, .. }) = self.autograd.node.as_deref() {
            *grad.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    /// Name of the backward that produced this tensor (`None` for leaves and tensors
    /// without grad).
    pub fn grad_fn(&self) -> Option<&'static str> {
        match self.autograd.node.as_deref() {
            Some(Node { kind: NodeKind::Op { .. }, name }) => Some(name),
            _ => None,
        }
    }

    /// Backpropagates from a scalar (one-element) tensor; gradients accumulate into the
    /// leaves' `.grad()`. As in PyTorch, the pass frees the graph's saved tensors: a second
    /// backward through the same graph is an [`Error::Autograd`] (see
    /// [`backward_retaining_graph`](Self::backward_retaining_graph)). Freeing them also lets an
    /// optimizer update the weights in place rather than copy them away from the graph.
    pub fn backward(&self) -> Result<()> {
        self.backward_opts(&BackwardOptions::new())
    }

    /// [`backward`](Self::backward) that keeps the graph for another backward pass (PyTorch's
    /// `retain_graph=True`).
    pub fn backward_retaining_graph(&self) -> Result<()> {
        self.backward_opts(&BackwardOptions::new().retain_graph(true))
    }

    /// [`backward`](Self::backward) whose leaf-gradient reductions (a parameter gradient that
    /// arrives Partial, e.g. the data-parallel sum, reduced to the parameter's layout) run in
    /// `dtype`: `DType::F32` for a bf16/f16 model sums the gradients in f32 and rounds once, as
    /// FSDP's `reduce_dtype`.
    pub fn backward_reducing_in(&self, dtype: DType) -> Result<()> {
        self.backward_opts(&BackwardOptions::new().reduce_in(dtype))
    }

    /// [`backward`](Self::backward) as `opts` says: keeping the graph, reducing the leaf
    /// gradients in another dtype, overlapping their all-reduces with the rest of the pass
    /// (see [`BackwardOptions`]).
    ///
    /// ```
    /// use dtensor_runtime::autograd::BackwardOptions;
    /// use dtensor_runtime::{distribute_tensor, run, ndarray::ArrayD, Replicate, Shard};
    /// let grads = run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
    ///     let w = ArrayD::from_shape_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    ///     let w = distribute_tensor(&w, &mesh, &[Replicate], None)?.requires_grad_(true);
    ///     let x = ArrayD::from_shape_vec(vec![4, 2], vec![1.0f32; 8]).unwrap();
    ///     let x = distribute_tensor(&x, &mesh, &[Shard(0)], None)?;
    ///     // The batch is sharded over dp: w's gradient arrives Partial, summed over dp.
    ///     let loss = x.matmul(&w)?.sum()?;
    ///     loss.backward_opts(&BackwardOptions::new().overlap_grad_reduce(0))?;
    ///     Ok(w.grad().unwrap().full_tensor()?.into_raw_vec_and_offset().0)
    /// }).unwrap();
    /// assert_eq!(grads[0], vec![4.0; 4]);
    /// ```
    pub fn backward_opts(&self, opts: &BackwardOptions) -> Result<()> {
        if self.numel() != 1 {
            return Err(Error::Autograd(format!(
                "backward() needs a scalar (one element), got shape {:?}; use backward_with(grad)",
                self.shape
            )));
        }
        let target = without_partials(&self.placements);
        let (shape, _) =
            crate::layout::local_shape_and_offset(&self.shape, self.mesh.shape(), self.mesh.coordinate(), &target);
        let local = self.local.new_full(&shape, T::one())?;
        let one = DTensor::new_unchecked(local, self.mesh.clone(), target, self.shape.clone(), None);
        engine::run_backward(self, one, opts)
    }

    /// Backpropagates with an explicit gradient of this tensor (same shape and mesh); frees the
    /// graph as [`backward`](Self::backward) does.
    pub fn backward_with(&self, grad: &DTensor<T>) -> Result<()> {
        if grad.shape != self.shape {
            return Err(Error::ShapeMismatch {
                context: "backward_with: gradient vs tensor".into(),
                expected: self.shape.clone(),
                actual: grad.shape.clone(),
            });
        }
        self.mesh.check_compatible(&grad.mesh, "backward_with")?;
        engine::run_backward(self, grad.detach(), &BackwardOptions::new())
    }

    /// [`backward_with`](Self::backward_with) with options (a nested backward that keeps its
    /// graph for the outer pass's `retain_graph`).
    pub(crate) fn backward_with_opts(&self, grad: &DTensor<T>, opts: &BackwardOptions) -> Result<()> {
        self.mesh.check_compatible(&grad.mesh, "backward_with")?;
        engine::run_backward(self, grad.detach(), opts)
    }

    /// `redistribute` whose backward runs the gradient's collectives in `backward_dtype`
    /// (e.g. `DType::F64` for an f32 model: gradients are reduced in double precision, or
    /// `DType::F32` for a bf16/f16 model: gradients are reduced in f32 and rounded once).
    pub fn redistribute_with_dtype(&self, to: &[Placement], backward_dtype: Option<DType>) -> Result<DTensor<T>> {
        redistribute_op(self, to, "redistribute", backward_dtype)
    }
}
