//! Modules: named parameters, `distribute_module`, layers and tensor-parallel styles.
//!
//! # The [`Module`] trait
//!
//! A module exposes its parameters (and buffers) by dotted path, as PyTorch's
//! `named_parameters()` does: a field `w1: Linear` contributes `w1.weight` and `w1.bias`.
//! The trait is object safe; `#[distribute]` structs (dtensor-macros) generate it from their
//! fields. Implementing it by hand:
//!
//! ```
//! use dtensor_runtime::module::{Module, Forward, Linear, prefixed, prefixed_mut};
//! use dtensor_runtime::{DTensor, Result};
//!
//! struct Mlp { w1: Linear<f32>, w2: Linear<f32> }
//!
//! impl Module<f32> for Mlp {
//!     fn named_parameters(&self) -> Vec<(String, &DTensor<f32>)> {
//!         let mut v = prefixed("w1", self.w1.named_parameters());
//!         v.extend(prefixed("w2", self.w2.named_parameters()));
//!         v
//!     }
//!     fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<f32>)> {
//!         let mut v = prefixed_mut("w1", self.w1.named_parameters_mut());
//!         v.extend(prefixed_mut("w2", self.w2.named_parameters_mut()));
//!         v
//!     }
//! }
//!
//! impl Forward<f32> for Mlp {
//!     fn forward(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> {
//!         self.w2.forward(&self.w1.forward(x)?.gelu()?)
//!     }
//! }
//!
//! let m = Mlp { w1: Linear::new(4, 8, true)?, w2: Linear::new(8, 4, true)? };
//! let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["w1.weight", "w1.bias", "w2.weight", "w2.bias"]);
//! # Ok::<(), dtensor_runtime::Error>(())
//! ```
//!
//! Parameters of a freshly built module are *local tensors* (see
//! [`DTensor::local_tensor`]): the module runs on one rank as is.
//! [`distribute_module`] and [`parallelize_module`] turn them into DTensors on a mesh.

mod distribute;
mod layers;
mod parallel;
mod sequential;

pub(crate) use distribute::distribute_param;
pub use distribute::{distribute_module, Distributed, InputFn, OutputFn, PartitionFn};
pub use layers::{Dropout, Embedding, LayerNorm, Linear, RmsNorm};
pub use parallel::{parallelize_module, ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel};
pub use sequential::Sequential;

use crate::dtensor::DTensor;
use crate::element::{Element, Scalar};
use crate::error::Result;
use crate::placement::Placement;

/// Something with named parameters (PyTorch `nn.Module` without the forward).
pub trait Module<T: Element> {
    /// Every parameter with its dotted path, in a stable order.
    fn named_parameters(&self) -> Vec<(String, &DTensor<T>)>;
    /// Same, mutable (distribution and optimizers replace or update them).
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<T>)>;
    /// Non-trainable state (default: none).
    fn named_buffers(&self) -> Vec<(String, &DTensor<T>)> {
        vec![]
    }
    /// Same, mutable (default: none).
    fn named_buffers_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        vec![]
    }
    /// The activation-layout hooks of the layer at `path` (`""`: this module), which
    /// tensor-parallel styles set. Layers return their own for `""`; containers may forward
    /// to a field. Default: none (then a style only distributes the parameters and the
    /// activations' layouts follow from sharding propagation).
    fn layer_hooks_mut(&mut self, _path: &str) -> Option<&mut LayerHooks> {
        None
    }
    /// The placements this module's type declares for its parameters, by dotted name (a
    /// `#[distribute]` struct: its fields'); default: none, a dynamic module declares nothing.
    /// Loads and optimizer steps refuse a parameter whose layout differs
    /// ([`check_declared_layouts`]).
    fn declared_placements(&self) -> Vec<(String, Vec<Placement>)> {
        vec![]
    }
    /// Clears every parameter's gradient.
    fn zero_grad(&self) {
        for (_, p) in self.named_parameters() {
            p.zero_grad();
        }
    }
}

/// Checks every parameter of `module` against the layout its type declares
/// ([`Module::declared_placements`]): an [`Error::DeclaredLayout`](crate::Error::DeclaredLayout)
/// names the first that differs (`by`: what is checking, e.g. `"the optimizer step found it"`).
pub fn check_declared_layouts<T: Element, M: Module<T> + ?Sized>(module: &M, by: &str) -> Result<()> {
    let declared = DeclaredLayouts::of(module);
    if declared.0.is_empty() {
        return Ok(());
    }
    for (name, p) in module.named_parameters() {
        declared.check(&name, p.placements(), by)?;
    }
    Ok(())
}

/// A module's declared layouts by parameter name (none for a module that declares none): the
/// one check of a parameter's placements against its declaration, for the optimizer steps
/// ([`check_declared_layouts`]) and for a load that is about to replace parameters.
pub(crate) struct DeclaredLayouts(std::collections::HashMap<String, Vec<Placement>>);

impl DeclaredLayouts {
    pub(crate) fn of<T: Element, M: Module<T> + ?Sized>(module: &M) -> Self {
        DeclaredLayouts(module.declared_placements().into_iter().collect())
    }

    /// Parameter `name` with placements `actual` against its declaration (`Ok` when it has none).
    pub(crate) fn check(&self, name: &str, actual: &[Placement], by: &str) -> Result<()> {
        match self.0.get(name) {
            Some(want) if want != actual => Err(crate::error::Error::DeclaredLayout {
                parameter: name.to_string(),
                declared: crate::placement::fmt_placements(want),
                by: by.to_string(),
                actual: crate::placement::fmt_placements(actual),
            }),
            _ => Ok(()),
        }
    }
}

/// A module's computation.
pub trait Forward<T: Element> {
    /// Runs the module on `input`.
    fn forward(&self, input: &DTensor<T>) -> Result<DTensor<T>>;
    /// Starts, ahead of the next [`forward`](Forward::forward), the communication it will
    /// need (an FSDP unit: the all-gathers of its parameters, in the background where the
    /// backend can). Default: nothing. Every rank calls it at the same point of its program.
    fn prefetch(&self) -> Result<()> {
        Ok(())
    }
}

/// What kind of layer a [`LayerHooks`] belongs to (styles shard weights by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// `y = x Wᵀ + b`, weight `[out, in]`.
    Linear,
    /// Lookup table `[vocab, dim]`.
    Embedding,
    /// Normalisation over the last dim (weight/bias `[dim]`).
    Norm,
}

/// Activation layouts a tensor-parallel style puts around a layer's forward: on mesh dim
/// `mesh_dim`, the input is redistributed to `input` before and the output to `output` after
/// (other mesh dims keep their placements).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerHooks {
    /// Which layer the hooks belong to; decides what the placements mean.
    pub kind: LayerKind,
    /// Index of the mesh dim the input/output placements apply to.
    pub mesh_dim: usize,
    /// Placement the input is redistributed to before the forward (`None`: left as is).
    pub input: Option<Placement>,
    /// Placement the output is redistributed to after the forward (`None`: left as is).
    pub output: Option<Placement>,
}

impl LayerHooks {
    /// No hooks for a layer of `kind`.
    pub fn new(kind: LayerKind) -> Self {
        LayerHooks { kind, mesh_dim: 0, input: None, output: None }
    }

    fn apply<T: Scalar>(&self, x: &DTensor<T>, want: Option<Placement>) -> Result<DTensor<T>> {
        let Some(p) = want else { return Ok(x.clone()) };
        if crate::autograd::is_local_mesh(x.device_mesh()) || self.mesh_dim >= x.device_mesh().ndim() {
            return Ok(x.clone());
        }
        let mut target = x.placements().to_vec();
        target[self.mesh_dim] = p.normalize(x.ndim())?;
        if target == x.placements() {
            Ok(x.clone())
        } else {
            x.redistribute(&target)
        }
    }

    /// Applies the input layout (to an input of any element type: an `Embedding`'s ids are
    /// integers).
    pub fn input<T: Scalar>(&self, x: &DTensor<T>) -> Result<DTensor<T>> {
        self.apply(x, self.input)
    }

    /// Applies the output layout.
    pub fn output<T: Element>(&self, y: &DTensor<T>) -> Result<DTensor<T>> {
        self.apply(y, self.output)
    }
}

/// Prefixes the names of a child's parameters with `prefix.`.
pub fn prefixed<'a, T: Element>(prefix: &str, v: Vec<(String, &'a DTensor<T>)>) -> Vec<(String, &'a DTensor<T>)> {
    v.into_iter().map(|(n, p)| (format!("{prefix}.{n}"), p)).collect()
}

/// Mutable version of [`prefixed`].
pub fn prefixed_mut<'a, T: Element>(
    prefix: &str,
    v: Vec<(String, &'a mut DTensor<T>)>,
) -> Vec<(String, &'a mut DTensor<T>)> {
    v.into_iter().map(|(n, p)| (format!("{prefix}.{n}"), p)).collect()
}
