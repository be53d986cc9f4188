//! `local_map`: run a function on the local shards, with declared input and output layouts
//! (PyTorch's `torch.distributed.tensor.experimental.local_map`).
//!
//! For code the op set does not cover — a custom kernel, a fused block, a hand-written
//! collective — a user writes a function over *local* tensors and declares, with a
//! [`LocalMap`], the placements its inputs must have, the placements of its outputs, and
//! (optionally) the placements of its inputs' gradients. `local_map` then
//!
//! 1. checks each input against its declared placements: a mismatch is an
//!    [`Error::LocalMapInput`], unless the user asked for the move with
//!    [`LocalMap::redistribute_inputs`] (an explicit redistribution, attributed to the
//!    function's name in [`CommDebugMode`](crate::CommDebugMode));
//! 2. hands the function each input's local shard as a local tensor with autograd
//!    ([`DTensor::to_local_grad`], with the declared gradient placements);
//! 3. wraps each local output as a DTensor with its declared placements
//!    ([`from_local_grad`]), so gradients flow back through the
//!    function's own ops.
//!
//! The function's own collectives (a `mesh.all_reduce` it calls) are its own, run where it
//! calls them and are attributed to its name. Nothing else communicates.
//!
//! ```
//! use dtensor_runtime::ops::local_map::LocalMap;
//! use dtensor_runtime::{distribute_tensor, Placement, ReduceOp, Shard};
//! use dtensor_runtime::ndarray::ArrayD;
//!
//! let sums = dtensor_runtime::run(2, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
//!     let g = ArrayD::from_shape_fn(vec![4, 3], |i| (i[0] * 3 + i[1]) as f32);
//!     let x = distribute_tensor(&g, &mesh, &[Shard(1)], None)?;
//!     // the row sums of the local columns are partial sums of the global row sums
//!     let rows = LocalMap::new("local_row_sum", &[&[Placement::Partial(ReduceOp::Sum)]])
//!         .in_placements(&[&[Shard(1)]])
//!         .out_shapes(&[&[4]])
//!         .call(&[&x], |local| Ok(vec![local[0].sum_dim(1, false)?]))?;
//!     rows[0].full_tensor()
//! })
//! .unwrap();
//! assert_eq!(sums[0].as_slice().unwrap(), &[3.0, 12.0, 21.0, 30.0]);
//! ```

use crate::autograd::local::{local_grad_allowed, LOCAL_GRAD_RULE};
use crate::autograd::{from_local_grad, redistribute_recorded};
use crate::comm::debug::op_scope;
use crate::dtensor::{DTensor, FromLocal};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::ops::custom::backward_name;
use crate::placement::{fmt_placements, normalize_placements, without_partials, Placement};
use crate::shape::contiguous_strides;

/// A `local_map` function's declared layouts (see the [module docs](self)). Built with
/// [`LocalMap::new`] and the setters, run with [`LocalMap::call`].
#[derive(Debug, Clone)]
pub struct LocalMap {
    name: &'static str,
    out_placements: Vec<Vec<Placement>>,
    in_placements: Option<Vec<Vec<Placement>>>,
    in_grad_placements: Option<Vec<Vec<Placement>>>,
    out_shapes: Option<Vec<Vec<usize>>>,
    redistribute_inputs: bool,
}

impl LocalMap {
    /// A function named `name` (errors, `CommDebugMode`, the autograd tape) whose outputs
    /// are laid out `out_placements` (one list of per-mesh-dim placements per output).
    pub fn new(name: &'static str, out_placements: &[&[Placement]]) -> Self {
        LocalMap {
            name,
            out_placements: out_placements.iter().map(|p| p.to_vec()).collect(),
            in_placements: None,
            in_grad_placements: None,
            out_shapes: None,
            redistribute_inputs: false,
        }
    }

    /// The placements each input must have (one list per input). Without it, inputs are
    /// taken as they are.
    pub fn in_placements(mut self, placements: &[&[Placement]]) -> Self {
        self.in_placements = Some(placements.iter().map(|p| p.to_vec()).collect());
        self
    }

    /// The placements of each input's gradient (PyTorch's `in_grad_placements`; default: the
    /// input's placements with its Partials made Replicate, since a Partial input's local term
    /// gets the whole gradient — PyTorch keeps the Partial, which makes the gradient n times
    /// too large). A `Replicate` input that the ranks use differently has a `Partial(Sum)`
    /// gradient: each rank's local gradient is one term of the sum. Layouts that are wrong for
    /// every program (a `Shard(d)` input's gradient other than `Shard(d)`, a Partial one for a
    /// Partial input) are an [`Error::OpDefinition`].
    pub fn in_grad_placements(mut self, placements: &[&[Placement]]) -> Self {
        self.in_grad_placements = Some(placements.iter().map(|p| p.to_vec()).collect());
        self
    }

    /// The global shape of each output. Needed for an output sharded over a mesh dim of more
    /// than one rank: inferred from one rank's shard (PyTorch's `from_local` default), it is
    /// wrong, and differs per rank, whenever the dim splits unevenly, so `call` refuses it
    /// ([`Error::OpDefinition`]). Unsharded outputs have their local shape.
    pub fn out_shapes(mut self, shapes: &[&[usize]]) -> Self {
        self.out_shapes = Some(shapes.iter().map(|s| s.to_vec()).collect());
        self
    }

    /// Redistribute inputs whose placements differ from the declared ones (an explicit
    /// redistribution, attributed to this function) instead of refusing them.
    pub fn redistribute_inputs(mut self, yes: bool) -> Self {
        self.redistribute_inputs = yes;
        self
    }

    /// Runs `f` on the local shards of `inputs` (one mesh) and wraps its local outputs with
    /// the declared placements. `f` gets one local tensor per input and returns one local
    /// tensor per declared output.
    pub fn call<T: Element>(
        &self,
        inputs: &[&DTensor<T>],
        f: impl FnOnce(&[DTensor<T>]) -> Result<Vec<DTensor<T>>>,
    ) -> Result<Vec<DTensor<T>>> {
        let name = self.name;
        let bad = |problem: String| Error::OpDefinition { op: format!("local_map {name}"), problem };
        let Some(first) = inputs.first() else {
            return Err(bad("it was applied to no tensor (its outputs need a mesh)".into()));
        };
        let mesh = &first.mesh;
        for (what, n) in [
            ("input layouts", self.in_placements.as_ref().map(Vec::len)),
            ("input gradient layouts", self.in_grad_placements.as_ref().map(Vec::len)),
        ] {
            if let Some(n) = n.filter(|&n| n != inputs.len()) {
                return Err(bad(format!("it declares {n} {what} for {} inputs", inputs.len())));
            }
        }
        if let Some(n) = self.out_shapes.as_ref().map(Vec::len).filter(|&n| n != self.out_placements.len()) {
            return Err(bad(format!("it declares {n} output shapes for {} outputs", self.out_placements.len())));
        }
        let mut locals = Vec::with_capacity(inputs.len());
        for (i, &x) in inputs.iter().enumerate() {
            if x.mesh != *mesh {
                return Err(Error::MeshMismatch {
                    context: format!("local_map `{name}` input {i}"),
                    left: mesh.to_string(),
                    right: x.mesh.to_string(),
                });
            }
            let moved;
            let x = match &self.in_placements {
                Some(declared) => {
                    let want = normalize_placements(&declared[i], x.ndim(), mesh.ndim())
                        .map_err(|e| bad(format!("the layout it declares for input {i}: {e}")))?;
                    if x.placements == want {
                        x
                    } else if self.redistribute_inputs {
                        // recorded, so that the gradient finds its way back to the caller's layout
                        moved = redistribute_recorded(x, &want, name)?;
                        &moved
                    } else {
                        return Err(Error::LocalMapInput {
                            op: name.into(),
                            input: i,
                            declared: fmt_placements(&want),
                            actual: fmt_placements(&x.placements),
                        });
                    }
                }
                None => x,
            };
            let gp = match &self.in_grad_placements {
                Some(g) => normalize_placements(&g[i], x.ndim(), mesh.ndim())
                    .map_err(|e| bad(format!("the gradient layout it declares for input {i}: {e}")))?,
                // a Partial input's local term gets the whole gradient
                None => without_partials(&x.placements),
            };
            for (k, (&p, &g)) in x.placements.iter().zip(&gp).enumerate() {
                if !local_grad_allowed(p, g) {
                    return Err(bad(format!(
                        "input {i} is {p} on mesh dim {k}, and its gradient cannot be {g} there: {}",
                        LOCAL_GRAD_RULE
                    )));
                }
            }
            locals.push(x.to_local_grad_named(
                Some(&gp),
                backward_name(name),
                format!("local_map `{name}` backward, input {i}"),
            )?);
        }
        let outs = op_scope(name, || f(&locals))?;
        if outs.len() != self.out_placements.len() {
            return Err(bad(format!(
                "the function returned {} outputs, {} are declared",
                outs.len(),
                self.out_placements.len()
            )));
        }
        outs.iter()
            .zip(&self.out_placements)
            .enumerate()
            .map(|(j, (out, placements))| {
                if !out.is_local_tensor() {
                    return Err(bad(format!(
                        "output {j} is a DTensor on mesh {}: the function returns local tensors (its inputs' kind)",
                        out.mesh
                    )));
                }
                let shape = self.out_shapes.as_ref().map(|s| s[j].clone());
                let sharded =
                    placements.iter().enumerate().any(|(k, p)| matches!(p, Placement::Shard(_)) && mesh.size(k) > 1);
                if shape.is_none() && sharded {
                    // inferred from the local shape, a global shape is wrong (and differs per
                    // rank) whenever the sharded dim splits unevenly: no rank can tell alone
                    return Err(bad(format!(
                        "output {j} is sharded ({}): give its global shape with `.out_shapes(..)`",
                        fmt_placements(placements)
                    )));
                }
                let stride = shape.as_deref().map(contiguous_strides);
                from_local_grad(out, mesh, placements, FromLocal { shape, stride, ..FromLocal::default() })
                    .map_err(|e| bad(format!("output {j}: {e}")))
            })
            .collect()
    }
}

/// [`LocalMap::call`] as a free function, PyTorch's spelling: `local_map(&spec, &[&x], f)`.
pub fn local_map<T: Element>(
    spec: &LocalMap,
    inputs: &[&DTensor<T>],
    f: impl FnOnce(&[DTensor<T>]) -> Result<Vec<DTensor<T>>>,
) -> Result<Vec<DTensor<T>>> {
    spec.call(inputs, f)
}
