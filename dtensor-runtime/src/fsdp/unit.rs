//! One FSDP unit's gathering: what `fully_shard` decided for each parameter, the all-gather
//! into the in-use layout, and the tape record whose backward reduce-scatters the gradient.
//! Shared by the forward and by its recomputation in the backward (`reshard.rs`), so it is
//! cheap to clone: layouts and `Arc`s.

use super::reshard_group::ReshardGroup;
use super::{MemoryPlan, OptimizerMemory, ParamSpec};
use crate::autograd::{record, redistribute_grad};
use crate::dtensor::DTensor;
use crate::element::{DType, Element};
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::module::Module;
use crate::placement::Placement;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A parameter's unreduced gradient `g` (in its in-use layout), plus what was buffered: while
/// sync is off, buffered (`None` goes on); with sync on, reduce-scattered into the resting layout
/// (through `dtype` when given).
pub(super) fn settle_gradient<T: Element>(
    sync: &AtomicBool,
    info: &Param<T>,
    g: DTensor<T>,
    dtype: Option<DType>,
) -> Result<Option<DTensor<T>>> {
    let mut buffered = info.stash.lock().unwrap_or_else(|e| e.into_inner());
    let g = match buffered.take() {
        Some(b) => b.add(&g)?,
        None => g,
    };
    if !sync.load(Ordering::SeqCst) {
        *buffered = Some(g);
        return Ok(None);
    }
    Ok(Some(redistribute_grad(&g, &info.stored, dtype, "fsdp_reduce_scatter")?))
}

/// Unreduced gradients kept while gradient synchronisation is off (one per parameter).
type Stash<T> = Arc<Mutex<Option<DTensor<T>>>>;

/// What `fully_shard` decided for one parameter.
#[derive(Clone)]
pub(super) struct Param<T: Element> {
    pub(super) name: String,
    /// The layout the forward uses: the stored one with `Replicate` on the FSDP dim.
    pub(super) in_use: Vec<Placement>,
    /// The layout it rests in (`in_use` with `Shard(d)` on the FSDP dim, or `in_use` itself
    /// when every tensor dim is already sharded by another mesh dim).
    pub(super) stored: Vec<Placement>,
    pub(super) stash: Stash<T>,
}

impl<T: Element> Param<T> {
    pub(super) fn new(name: String, in_use: Vec<Placement>, stored: Vec<Placement>) -> Self {
        Param { name, in_use, stored, stash: Arc::new(Mutex::new(None)) }
    }

    pub(super) fn sharded(&self) -> bool {
        self.stored != self.in_use
    }
}

/// The module's parameters as they rest (the shards; clones share storage), in the order
/// `Unit::run_on` takes its `base`.
pub(super) fn at_rest<T: Element, M: Module<T>>(module: &M) -> Vec<DTensor<T>> {
    module.named_parameters().into_iter().map(|(_, p)| p.clone()).collect()
}

/// How a unit gathers its parameters and where their gradients go.
#[derive(Clone)]
pub(super) struct Unit<T: Element> {
    /// The module's name (errors say it).
    pub(super) name: String,
    /// Tells units of the same name apart (the memory plan's units).
    pub(super) id: u64,
    pub(super) mesh: DeviceMesh,
    pub(super) mesh_dim: usize,
    pub(super) reduce_dtype: Option<DType>,
    pub(super) params: Arc<Vec<Param<T>>>,
    pub(super) sync: Arc<AtomicBool>,
    /// Resharding after the forward to a smaller group than the FSDP dim
    /// ([`FullyShardOptions::reshard_group`](super::FullyShardOptions::reshard_group)).
    pub(super) post: Option<ReshardGroup>,
}

impl<T: Element> Unit<T> {
    /// `p` (at rest) in its in-use layout, without history. `p` may be of another element
    /// type than the unit's (a mixed-precision unit gathers its masters cast to the module's).
    pub(super) fn gather_data<E: Element>(&self, p: &DTensor<E>, info: &Param<T>) -> Result<DTensor<E>> {
        if !info.sharded() {
            return Ok(p.detach());
        }
        if self.mesh.size(self.mesh_dim) == 1 {
            // A shard over one rank is the whole tensor: the same storage, relabelled, instead
            // of a copy the size of the parameter.
            let mut whole = p.detach();
            whole.placements = info.in_use.clone();
            return Ok(whole);
        }
        Ok(p.redistribute_scoped(&info.in_use, "fsdp_all_gather")?.detach())
    }

    /// Runs `f` on a shallow copy of `module` whose parameters are made from `base` (one per
    /// parameter, at rest: the shards, or leaves standing for them): each sharded one gathered
    /// (or taken from `cached`) and recorded as made from its base.
    pub(super) fn run_on<M: Module<T> + Clone, R>(
        &self,
        module: &M,
        base: &[DTensor<T>],
        cached: Option<&[DTensor<T>]>,
        f: impl FnOnce(&M) -> Result<R>,
    ) -> Result<R> {
        let mut running = module.clone();
        let slots = running.named_parameters_mut();
        if slots.len() != self.params.len() || base.len() != self.params.len() {
            return Err(self.changed(format!("has {} parameters, not {}", slots.len(), self.params.len())));
        }
        self.check_at_rest(base, "fully_shard")?;
        for (i, ((name, p), info)) in slots.into_iter().zip(self.params.iter()).enumerate() {
            if name != info.name {
                return Err(self.changed(format!("parameter {i} is now `{name}`, not `{}`", info.name)));
            }
            *p = if !info.sharded() {
                base[i].clone() // the parameter itself, its gradient reduced as any other's
            } else {
                let data = match cached {
                    Some(c) => c[i].clone(),
                    None => self.gather_data(&base[i], info)?,
                };
                self.on_tape(data, &base[i], info)
            };
        }
        f(&running)
    }

    /// The same unit for parameters of element type `S` (fresh gradient buffers; the
    /// synchronisation flag is shared).
    pub(super) fn retyped<S: Element>(&self) -> Unit<S> {
        Unit {
            name: self.name.clone(),
            id: self.id,
            mesh: self.mesh.clone(),
            mesh_dim: self.mesh_dim,
            reduce_dtype: self.reduce_dtype,
            params: Arc::new(
                self.params.iter().map(|p| Param::new(p.name.clone(), p.in_use.clone(), p.stored.clone())).collect(),
            ),
            sync: Arc::clone(&self.sync),
            post: self.post.clone(),
        }
    }

    /// Checks that `base` (one per parameter) still rests as `by` left it: a parameter
    /// replaced by one of another layout is refused, naming it.
    pub(super) fn check_at_rest<E: Element>(&self, base: &[DTensor<E>], by: &str) -> Result<()> {
        for (p, info) in base.iter().zip(self.params.iter()) {
            if p.placements() != info.stored.as_slice() {
                return Err(Error::FullyShard {
                    module: self.name.clone(),
                    reason: format!(
                        "parameter `{}` is laid out {}, not {} as {by} left it: it was replaced",
                        info.name,
                        crate::placement::fmt_placements(p.placements()),
                        crate::placement::fmt_placements(&info.stored)
                    ),
                });
            }
        }
        Ok(())
    }

    /// Every parameter as [`memory_plan`](super::memory_plan) sees it (`shapes`: their global
    /// shapes, in the unit's order), in this unit.
    pub(super) fn param_specs<'a>(
        &self,
        shapes: impl Iterator<Item = &'a [usize]>,
        reshard_after_forward: bool,
        prefetch: bool,
    ) -> Vec<ParamSpec> {
        let unit = format!("{}#{}", self.name, self.id);
        shapes
            .zip(self.params.iter())
            .map(|(shape, info)| {
                let spec = ParamSpec::new(&info.name, shape, &info.in_use)
                    .in_unit(&unit, reshard_after_forward)
                    .prefetched(prefetch);
                match &self.post {
                    Some(post) => spec.resharded_to(post.group()),
                    None => spec,
                }
            })
            .collect()
    }

    /// This rank's [`MemoryPlan`] of `specs` in `dtype` (what every rank could compute before
    /// launch: [`memory_plan`](super::memory_plan), at this rank's row-major index).
    pub(super) fn plan_here(
        &self,
        specs: &[ParamSpec],
        dtype: DType,
        optimizer: OptimizerMemory,
    ) -> Result<MemoryPlan> {
        let mesh = &self.mesh;
        let plans = super::memory_plan(specs, mesh.shape(), self.mesh_dim, dtype, optimizer)?;
        let index = mesh.coordinate().iter().zip(mesh.shape()).fold(0, |i, (c, n)| i * n + c);
        Ok(plans[index])
    }

    /// Drops the gradients buffered while synchronisation was off.
    pub(super) fn clear_buffered_gradients(&self) {
        for p in self.params.iter() {
            *p.stash.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    pub(super) fn changed(&self, what: String) -> Error {
        Error::FullyShard {
            module: self.name.clone(),
            reason: format!("the module {what}: its parameters changed after fully_shard"),
        }
    }

    /// Records the gathered `data` as made from `shard`: the backward reduce-scatters the
    /// gradient into the shard's layout, or buffers it while sync is off (in the parameters'
    /// dtype, unreduced and unsharded).
    fn on_tape(&self, data: DTensor<T>, shard: &DTensor<T>, info: &Param<T>) -> DTensor<T> {
        let (sync, info, dtype) = (Arc::clone(&self.sync), info.clone(), self.reduce_dtype);
        record("fsdp_reduce_scatter", data, &[shard], move |g| {
            Ok(vec![settle_gradient(&sync, &info, g.detach(), dtype)?])
        })
    }
}

/// Declared in-use layouts mapped to the layouts the parameters rest in.
pub(super) fn at_rest_declared<T: Element>(
    declared: Vec<(String, Vec<Placement>)>,
    params: &[Param<T>],
) -> Vec<(String, Vec<Placement>)> {
    declared
        .into_iter()
        .map(|(n, decl)| match params.iter().find(|p| p.name == n && p.in_use == decl) {
            Some(p) => (n, p.stored.clone()),
            None => (n, decl),
        })
        .collect()
}
