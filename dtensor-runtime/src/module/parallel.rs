//! Tensor-parallel styles and `parallelize_module` (PyTorch `torch.distributed.tensor.parallel`).
//!
//! A style says, for the layer at a path, how its parameters are sharded along the
//! tensor-parallel mesh dim (default: the last mesh dim; other mesh dims replicate them) and
//! which activation layouts go around its forward (through [`LayerHooks`]).
//!
//! | style | Linear weight `[out, in]` | bias | input | output |
//! |---|---|---|---|---|
//! | [`ColwiseParallel`] | `Shard(0)` | `Shard(0)` | `Replicate` | `Shard(-1)` |
//! | [`RowwiseParallel`] | `Shard(1)` | `Replicate` | `Shard(-1)` | `Replicate` (all-reduce) |
//! | [`SequenceParallel`] (norms) | `Replicate` | `Replicate` | `Shard(1)` | `Shard(1)` |
//!
//! On an `Embedding` `[vocab, dim]`, Colwise shards `dim` (`Shard(1)`) and Rowwise shards the
//! vocabulary (`Shard(0)`, masked lookup, Partial output all-reduced); both take Replicate ids.

use super::distribute::{check_not_distributed, distribute_param};
use super::{LayerKind, Module};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::placement::Placement;
use std::collections::HashMap;

const R: Placement = Placement::Replicate;

/// How one layer is parallelised.
pub trait ParallelStyle {
    /// Placement on the tensor-parallel mesh dim of the parameter called `name` (last path
    /// component, e.g. `weight`) of a layer of `kind`.
    fn param_placement(&self, kind: LayerKind, name: &str) -> Result<Placement>;
    /// Layout the layer's input is redistributed to on the tensor-parallel mesh dim.
    fn input_layout(&self, kind: LayerKind) -> Option<Placement>;
    /// Layout the layer's output is redistributed to on the tensor-parallel mesh dim.
    fn output_layout(&self, kind: LayerKind) -> Option<Placement>;
    /// Name of the tensor-parallel mesh dim (`None`: the last one).
    fn mesh_dim(&self) -> Option<&str>;
}

fn not_for(style: &str, kind: LayerKind, name: &str) -> Error {
    Error::Module(format!("{style} does not apply to parameter `{name}` of a {kind:?} layer"))
}

macro_rules! style_builders {
    ($t:ident) => {
        impl $t {
            /// Overrides the input layout (on the tensor-parallel mesh dim).
            pub fn input_layout(mut self, p: Placement) -> Self {
                self.input = Some(p);
                self
            }
            /// Overrides the output layout (on the tensor-parallel mesh dim).
            pub fn output_layout(mut self, p: Placement) -> Self {
                self.output = Some(p);
                self
            }
            /// Uses the mesh dim called `name` for tensor parallelism.
            pub fn mesh_dim(mut self, name: &str) -> Self {
                self.mesh_dim = Some(name.to_string());
                self
            }
        }
    };
}

/// Column-wise sharding of a Linear (output features) or Embedding (embedding dim).
#[derive(Debug, Clone, Default)]
pub struct ColwiseParallel {
    input: Option<Placement>,
    output: Option<Placement>,
    mesh_dim: Option<String>,
}

impl ColwiseParallel {
    /// Defaults: input Replicate, output `Shard(-1)`.
    pub fn new() -> Self {
        Self::default()
    }
}
style_builders!(ColwiseParallel);

impl ParallelStyle for ColwiseParallel {
    fn param_placement(&self, kind: LayerKind, name: &str) -> Result<Placement> {
        match (kind, name) {
            (LayerKind::Linear, "weight" | "bias") => Ok(Placement::Shard(0)),
            (LayerKind::Embedding, "weight") => Ok(Placement::Shard(1)),
            _ => Err(not_for("ColwiseParallel", kind, name)),
        }
    }
    fn input_layout(&self, _: LayerKind) -> Option<Placement> {
        Some(self.input.unwrap_or(R))
    }
    fn output_layout(&self, _: LayerKind) -> Option<Placement> {
        Some(self.output.unwrap_or(Placement::Shard(-1)))
    }
    fn mesh_dim(&self) -> Option<&str> {
        self.mesh_dim.as_deref()
    }
}

/// Row-wise sharding of a Linear (input features) or Embedding (vocabulary).
#[derive(Debug, Clone, Default)]
pub struct RowwiseParallel {
    input: Option<Placement>,
    output: Option<Placement>,
    mesh_dim: Option<String>,
}

impl RowwiseParallel {
    /// Defaults: input `Shard(-1)` (Replicate ids for an Embedding), output Replicate.
    pub fn new() -> Self {
        Self::default()
    }
}
style_builders!(RowwiseParallel);

impl ParallelStyle for RowwiseParallel {
    fn param_placement(&self, kind: LayerKind, name: &str) -> Result<Placement> {
        match (kind, name) {
            (LayerKind::Linear, "weight") => Ok(Placement::Shard(1)),
            (LayerKind::Linear, "bias") => Ok(R),
            (LayerKind::Embedding, "weight") => Ok(Placement::Shard(0)),
            _ => Err(not_for("RowwiseParallel", kind, name)),
        }
    }
    fn input_layout(&self, kind: LayerKind) -> Option<Placement> {
        Some(self.input.unwrap_or(if kind == LayerKind::Embedding { R } else { Placement::Shard(-1) }))
    }
    fn output_layout(&self, _: LayerKind) -> Option<Placement> {
        Some(self.output.unwrap_or(R))
    }
    fn mesh_dim(&self) -> Option<&str> {
        self.mesh_dim.as_deref()
    }
}

/// Sequence parallelism for norms: parameters replicated, activations sharded on the
/// sequence dim (default 1), so the norm runs locally.
#[derive(Debug, Clone)]
pub struct SequenceParallel {
    sequence_dim: isize,
    input: Option<Placement>,
    output: Option<Placement>,
    mesh_dim: Option<String>,
}

impl Default for SequenceParallel {
    fn default() -> Self {
        SequenceParallel { sequence_dim: 1, input: None, output: None, mesh_dim: None }
    }
}

impl SequenceParallel {
    /// Sequence dim 1.
    pub fn new() -> Self {
        Self::default()
    }
    /// Shards activations on `dim` instead of 1.
    pub fn sequence_dim(mut self, dim: isize) -> Self {
        self.sequence_dim = dim;
        self
    }
}
style_builders!(SequenceParallel);

impl ParallelStyle for SequenceParallel {
    fn param_placement(&self, _: LayerKind, _: &str) -> Result<Placement> {
        Ok(R)
    }
    fn input_layout(&self, _: LayerKind) -> Option<Placement> {
        Some(self.input.unwrap_or(Placement::Shard(self.sequence_dim)))
    }
    fn output_layout(&self, _: LayerKind) -> Option<Placement> {
        Some(self.output.unwrap_or(Placement::Shard(self.sequence_dim)))
    }
    fn mesh_dim(&self) -> Option<&str> {
        self.mesh_dim.as_deref()
    }
}

/// Parallelises `module` over `mesh` by a plan keyed by layer path (PyTorch
/// `parallelize_module`): each entry's style shards the parameters under that path on the
/// tensor-parallel mesh dim and sets the layer's activation hooks; every other parameter is
/// replicated. Parameters are scattered from rank 0.
///
/// ```
/// use dtensor_runtime::module::{parallelize_module, ColwiseParallel, Linear, Module, ParallelStyle};
/// use dtensor_runtime::{run, Replicate, Shard};
/// run(4, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
///     let colwise = ColwiseParallel::new();
///     let plan: Vec<(&str, &dyn ParallelStyle)> = vec![("", &colwise)];
///     let lin = parallelize_module(Linear::<f32>::new(4, 6, true)?, &mesh, &plan)?;
///     assert_eq!(lin.weight.placements(), &[Replicate, Shard(0)]);
///     Ok(())
/// }).unwrap();
/// ```
pub fn parallelize_module<T: Element, M: Module<T>>(
    mut module: M,
    mesh: &DeviceMesh,
    plan: &[(&str, &dyn ParallelStyle)],
) -> Result<M> {
    check_not_distributed(&module, "parallelize_module")?;
    let all: Vec<String> = module.named_parameters().into_iter().map(|(n, _)| n).collect();
    let mut assigned: HashMap<String, Vec<Placement>> = HashMap::new();
    for &(path, style) in plan {
        let md = match style.mesh_dim() {
            Some(name) => mesh.dim_index(name)?,
            None => mesh.ndim() - 1,
        };
        let kind = module.layer_hooks_mut(path).map(|h| h.kind).unwrap_or(LayerKind::Linear);
        let under: Vec<&String> = all
            .iter()
            .filter(|n| path.is_empty() || n.as_str() == path || n.starts_with(&format!("{path}.")))
            .collect();
        if under.is_empty() {
            return Err(Error::Module(format!(
                "parallelize_module: no parameter under `{path}`; the module has {all:?}"
            )));
        }
        for name in under {
            let leaf = name.rsplit('.').next().unwrap_or(name);
            let mut placements = vec![R; mesh.ndim()];
            placements[md] = style.param_placement(kind, leaf)?;
            if assigned.insert(name.clone(), placements).is_some() {
                return Err(Error::Module(format!("parallelize_module: `{name}` is covered by two plan entries")));
            }
        }
        if let Some(h) = module.layer_hooks_mut(path) {
            h.mesh_dim = md;
            h.input = style.input_layout(kind);
            h.output = style.output_layout(kind);
        }
    }
    let replicate = vec![R; mesh.ndim()];
    for (name, p) in module.named_parameters_mut() {
        distribute_param(p, mesh, assigned.get(&name).unwrap_or(&replicate))?;
    }
    for (_, b) in module.named_buffers_mut() {
        distribute_param(b, mesh, &replicate)?;
    }
    Ok(module)
}
