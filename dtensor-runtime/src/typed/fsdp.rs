//! [`Fsdp`]: a field of a `#[distribute]` struct fully sharded over a mesh dim named by type.

use super::params::{join, Parameters};
use super::source::TensorSource;
use super::MeshDim;
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::fsdp::{fully_shard, FullyShard, FullyShardOptions};
use crate::mesh::DeviceMesh;
use crate::module::Module;
use crate::placement::Placement;
use std::marker::PhantomData;

/// A module `P` (a `#[distribute]` struct) fully sharded over the mesh dim `D`: each FSDP
/// unit of a typed model, e.g. `blocks: Vec<Fsdp<f64, Block, dp>>`.
///
/// `P`'s fields declare the layouts its forward uses; at rest its parameters are sharded over
/// `D` ([`fully_shard`]). So that no typed code ever sees a shard under an in-use type, the
/// module is reachable **only gathered**: [`Fsdp::call`] runs a closure on it with every
/// parameter in its declared layout; `Fsdp` has no field access and no accessor to `P` —
/// reading `model.blocks[0].wq` does not compile. Optimizers, checkpoints and `named_parameters`
/// see the shards (their resting layouts, which `declared_placements` reports).
///
/// Built by the struct's `distribute` / `load_hf` like any field (the parameters are laid out as
/// `P` declares, then sharded over `D` locally), or by [`Fsdp::new`].
///
/// ```
/// use dtensor_runtime::typed::{dims::dp, Fsdp};
/// use dtensor_runtime::module::{Linear, Module};
/// use dtensor_runtime::{run, Replicate, Shard};
/// run(2, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
///     let unit: Fsdp<f64, Linear<f64>, dp> = Fsdp::new(Linear::new(6, 4, false)?, &mesh)?;
///     // at rest: a [2, 6] shard of the [4, 6] weight on each dp rank
///     assert_eq!(unit.named_parameters()[0].1.placements(), &[Shard(0)]);
///     // in use: gathered
///     let layout = unit.call(|lin| Ok(lin.weight.placements().to_vec()))?;
///     assert_eq!(layout, vec![Replicate]);
///     Ok(())
/// }).unwrap();
/// ```
pub struct Fsdp<T: Element, P, D: MeshDim> {
    inner: FullyShard<T, P>,
    _dim: PhantomData<D>,
}

impl<T: Element, P: Module<T> + Clone, D: MeshDim> Fsdp<T, P, D> {
    /// Fully shards `module` over the mesh dim `D` of `mesh` (named after `P`'s type).
    pub fn new(module: P, mesh: &DeviceMesh) -> Result<Self> {
        Self::with_options(module, mesh, FullyShardOptions::on(D::NAME))
    }

    /// [`Fsdp::new`] with options (a name, the reduce dtype, adopting resting parameters);
    /// their mesh dim must be `D`'s. Resharding after the forward is refused: it recomputes a
    /// `Forward::forward`, and a typed unit runs closures ([`Fsdp::call`]).
    pub fn with_options(module: P, mesh: &DeviceMesh, options: FullyShardOptions) -> Result<Self> {
        if options.reshard_after_forward {
            return Err(Error::FullyShard {
                module: options.name.clone().unwrap_or_default(),
                reason: "a typed `Fsdp` unit cannot reshard after the forward (its forward is a closure, \
                         which cannot be recomputed); use FullyShard with Forward::forward"
                    .into(),
            });
        }
        if options.mesh_dim != D::NAME {
            return Err(Error::FullyShard {
                module: options.name.clone().unwrap_or_default(),
                reason: format!(
                    "the options shard over `{}` but the type `Fsdp<_, _, {}>` says `{}`",
                    options.mesh_dim,
                    D::NAME,
                    D::NAME
                ),
            });
        }
        Ok(Fsdp { inner: fully_shard(module, mesh, &options)?, _dim: PhantomData })
    }

    /// Runs `f` on the module with its parameters gathered into the layouts its type declares
    /// ([`FullyShard::call`]); gradients are reduce-scattered into the shards.
    pub fn call<R>(&self, f: impl FnOnce(&P) -> Result<R>) -> Result<R> {
        self.inner.call(f)
    }

    /// The untyped handle: gradient sync, explicit unshard, layouts, the memory plan.
    pub fn sharded(&self) -> &FullyShard<T, P> {
        &self.inner
    }
}

impl<T: Element, P: Module<T> + Clone, D: MeshDim> Module<T> for Fsdp<T, P, D> {
    fn named_parameters(&self) -> Vec<(String, &DTensor<T>)> {
        self.inner.named_parameters()
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        self.inner.named_parameters_mut()
    }
    fn named_buffers(&self) -> Vec<(String, &DTensor<T>)> {
        self.inner.named_buffers()
    }
    fn named_buffers_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        self.inner.named_buffers_mut()
    }
    fn declared_placements(&self) -> Vec<(String, Vec<Placement>)> {
        self.inner.declared_placements()
    }
}

fn prefixed<X>(prefix: &str, v: Vec<(String, X)>, out: &mut Vec<(String, X)>) {
    out.extend(v.into_iter().map(|(n, x)| (join(prefix, &n), x)));
}

impl<T: Element, P: Parameters<T> + Module<T> + Clone, D: MeshDim> Parameters<T> for Fsdp<T, P, D> {
    type Global = P::Global;
    fn distribute_global(global: P::Global, mesh: &DeviceMesh) -> Result<Self> {
        Fsdp::new(P::distribute_global(global, mesh)?, mesh)
    }
    fn collect_parameters<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a DTensor<T>)>) {
        prefixed(prefix, self.inner.named_parameters(), out);
    }
    fn collect_parameters_mut<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut DTensor<T>)>) {
        prefixed(prefix, self.inner.named_parameters_mut(), out);
    }
    /// The resting layouts (what the shards have).
    fn collect_placements(&self, prefix: &str, out: &mut Vec<(String, Vec<Placement>)>) {
        prefixed(prefix, self.inner.declared_placements(), out);
    }
    /// `P`'s in-use layouts: a load reads each parameter in them, then shards it locally.
    fn collect_patterns(prefix: &str, out: &mut Vec<(String, Vec<Placement>)>) {
        P::collect_patterns(prefix, out);
    }
    fn load_parameters(source: &mut dyn TensorSource<T>, prefix: &str) -> Result<Self> {
        let p = P::load_parameters(source, prefix)?;
        let mesh = p.named_parameters().first().map(|(_, t)| t.device_mesh().clone()).ok_or_else(|| {
            Error::FullyShard { module: prefix.to_string(), reason: "an `Fsdp` field holds no parameters".into() }
        })?;
        Fsdp::with_options(p, &mesh, FullyShardOptions::on(D::NAME).named(prefix))
    }
    fn collect_buffers<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a DTensor<T>)>) {
        prefixed(prefix, self.inner.named_buffers(), out);
    }
    fn collect_buffers_mut<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut DTensor<T>)>) {
        prefixed(prefix, self.inner.named_buffers_mut(), out);
    }
}
