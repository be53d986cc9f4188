//! `fully_shard`: a module whose parameters rest sharded over one mesh dim, are all-gathered
//! for its forward, and whose gradients are reduce-scattered back into the shards.

use super::prefetch;
use super::reshard::forward_recomputed;
use super::reshard_group::{group_fits, ReshardGroup};
use super::unit::{at_rest, at_rest_declared, Param, Unit};
use super::{resting_layout, FullyShardOptions, MemoryPlan, OptimizerMemory, ParamSpec};
use crate::autograd::is_grad_enabled;
use crate::dtensor::DTensor;
use crate::element::{DType, Element};
use crate::error::{Error, Result};
use crate::mesh::{Along, DeviceMesh};
use crate::module::{distribute_param, Forward, LayerHooks, Module};
use crate::placement::{fmt_placements, Placement};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A module under FSDP (PyTorch `fully_shard`, FSDP2), made by [`fully_shard`].
///
/// Its parameters ([`Module::named_parameters`]) are the shards: `Shard(d)` over the FSDP
/// mesh dim, every other mesh dim as it was. An optimizer stepping them keeps its state
/// sharded too, and checkpoints save the shards. Each forward ([`FullyShard::call`], or
/// [`Forward::forward`]) all-gathers the parameters into their in-use layout (`Replicate` on
/// the FSDP dim) and runs the module on them; the backward reduce-scatters each gradient
/// into its shard (in [`FullyShardOptions::reduce_dtype`] when given). The gathered
/// parameters are held only by the forward's autograd records, so they are freed as the
/// backward passes them (PyTorch's `reshard_after_forward=False`), or at once in `no_grad`.
pub struct FullyShard<T: Element, M> {
    module: M,
    unit: Unit<T>,
    reshard_after_forward: bool,
    prefetch: bool,
    unsharded: Mutex<Option<Vec<DTensor<T>>>>,
}

/// Shards `module`'s parameters over `options.mesh_dim` of `mesh` (PyTorch
/// `fully_shard(module, mesh=...)`).
///
/// Each parameter is sharded on its first tensor dim that no other mesh dim shards
/// ([`resting_layout`]: dim 0 unless a tensor-parallel plan shards it), so the FSDP all-gather
/// yields exactly the tensor-parallel layout and `full_tensor`, checkpoints and loaders see an
/// ordinary layout; a parameter whose every dim is already sharded stays replicated on the
/// FSDP dim ([`FullyShard::replicated_parameters`]). Local parameters (a module not yet on a mesh)
/// are distributed from rank 0. Uneven sizes shard as `torch.chunk` (empty shards allowed).
///
/// Errors ([`Error::FullyShard`], naming the module and the parameter): the mesh dim does
/// not exist; a parameter lives on another mesh, or is already sharded or partial on the
/// FSDP dim (a module can be fully sharded once); the ranks disagree about the parameters
/// (names, shapes, layouts) — checked by one all-gather of a fingerprint, so a mismatched
/// wrapping fails here instead of in a later collective.
///
/// The module must be `Clone` (each forward runs a shallow copy holding the gathered
/// parameters; a clone of a parameter shares its storage).
///
/// ```
/// use dtensor_runtime::fsdp::{fully_shard, FullyShardOptions};
/// use dtensor_runtime::module::{Forward, Linear, Module};
/// use dtensor_runtime::{distribute_tensor, run, Replicate, Shard};
/// use dtensor_runtime::ndarray::ArrayD;
/// run(2, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
///     dtensor_runtime::manual_seed(0);
///     let lin = fully_shard(Linear::<f64>::new(4, 6, true)?, &mesh, &FullyShardOptions::on("dp"))?;
///     // the weight [6, 4] rests as two [3, 4] shards
///     assert_eq!(lin.named_parameters()[0].1.placements(), &[Shard(0)]);
///     let x = ArrayD::from_shape_vec(vec![2, 4], (0..8).map(f64::from).collect()).unwrap();
///     let x = distribute_tensor(&x, &mesh, &[Shard(0)], None)?;
///     lin.forward(&x)?.sum()?.backward()?;
///     let g = lin.named_parameters()[0].1.grad().unwrap();
///     assert_eq!(g.placements(), &[Shard(0)]); // reduce-scattered into the shard
///     Ok(())
/// }).unwrap();
/// ```
pub fn fully_shard<T: Element, M: Module<T>>(
    module: M,
    mesh: &DeviceMesh,
    options: &FullyShardOptions,
) -> Result<FullyShard<T, M>> {
    let (module, unit) = shard(module, mesh, options, None)?;
    Ok(FullyShard {
        module,
        unit,
        reshard_after_forward: options.reshard_after_forward,
        prefetch: options.prefetch,
        unsharded: Mutex::new(None),
    })
}

/// [`fully_shard`]'s work: the module with its parameters at rest, and how its unit gathers;
/// `masters`: the dtype a mixed-precision unit keeps its masters in (the ranks agree on it
/// too).
pub(super) fn shard<T: Element, M: Module<T>>(
    mut module: M,
    mesh: &DeviceMesh,
    options: &FullyShardOptions,
    masters: Option<DType>,
) -> Result<(M, Unit<T>)> {
    let name = options.name.clone().unwrap_or_else(|| short_type_name::<M>());
    let refuse = |reason: String| Error::FullyShard { module: name.clone(), reason };
    let mesh_dim = mesh.dim_index(&options.mesh_dim).map_err(|_| {
        refuse(format!("the mesh {mesh} has no dim `{}` (its dims: {:?})", options.mesh_dim, mesh.dim_names()))
    })?;
    // Decide every layout first, agree on them, then move data: ranks that wrapped different
    // modules, or of which one refused its module, fail in the agreement, before any
    // collective could mismatch.
    let decided = decide(&module, mesh, mesh_dim, options).map_err(refuse);
    agree(mesh, &module, &name, decided.as_ref().ok(), options, masters)?;
    let params = decided?;
    for ((pname, p), info) in module.named_parameters_mut().into_iter().zip(&params) {
        if pname != info.name {
            return Err(refuse(format!(
                "named_parameters and named_parameters_mut disagree: `{}` against `{pname}`",
                info.name
            )));
        }
        let rg = p.requires_grad();
        if p.is_local_tensor() {
            distribute_param(p, mesh, &info.stored)?;
        } else if p.placements() != info.stored.as_slice() {
            // Replicate → Shard is a local slice: nothing is sent.
            *p = p.redistribute_scoped(&info.stored, "fully_shard")?.requires_grad_(rg);
        }
    }
    static UNITS: AtomicU64 = AtomicU64::new(0);
    let post = match options.reshard_group {
        Some(group) if options.reshard_after_forward && group < mesh.size(mesh_dim) => {
            let id = UNITS.fetch_add(1, Ordering::Relaxed);
            Some(
                ReshardGroup::new(mesh, mesh_dim, group, id)
                    .map_err(|e| refuse(format!("resharding to groups of {group}: {e}")))?,
            )
        }
        _ => None,
    };
    let unit = Unit {
        name,
        id: UNITS.fetch_add(1, Ordering::Relaxed),
        mesh: mesh.clone(),
        mesh_dim,
        reduce_dtype: options.reduce_dtype,
        params: Arc::new(params),
        sync: Arc::new(AtomicBool::new(true)),
        post,
    };
    Ok((module, unit))
}

/// Each parameter's in-use and resting layouts, or why the module is refused.
fn decide<T: Element, M: Module<T>>(
    module: &M,
    mesh: &DeviceMesh,
    mesh_dim: usize,
    options: &FullyShardOptions,
) -> std::result::Result<Vec<Param<T>>, String> {
    if let Some(group) = options.reshard_group {
        let n = mesh.size(mesh_dim);
        let taken = ReshardGroup::names(&options.mesh_dim).into_iter().find(|d| mesh.dim_names().contains(d));
        if let (Some(taken), true) = (taken, group < n) {
            return Err(format!(
                "reshard_after_forward_to({group}) splits `{}` into `{0}.across` × `{0}.within`, but the mesh {mesh} \
                 has a dim `{taken}` already",
                options.mesh_dim
            ));
        }
        if !group_fits(group, n) || !options.reshard_after_forward {
            return Err(format!(
                "reshard_after_forward_to({group}) on `{}` of {n} ranks: the group must divide {n} and be at \
                 least 2 (reshard_after_forward(false) keeps the whole parameters), with reshard_after_forward on",
                options.mesh_dim
            ));
        }
    }
    let mut params = Vec::new();
    for (pname, p) in module.named_parameters() {
        let in_use = if p.is_local_tensor() {
            vec![Placement::Replicate; mesh.ndim()]
        } else {
            if !p.device_mesh().same_as(mesh) {
                return Err(format!(
                    "parameter `{pname}` lives on the mesh {}, not on the mesh {mesh} it is to be sharded over",
                    p.device_mesh()
                ));
            }
            let pl = p.placements().to_vec();
            if options.accept_resting && matches!(pl[mesh_dim], Placement::Shard(_)) {
                // Adopted as it rests, if that is where fully_shard would have put it.
                let mut in_use = pl.clone();
                in_use[mesh_dim] = Placement::Replicate;
                let want = resting_layout(&in_use, p.ndim(), mesh_dim);
                if want.as_ref() != Some(&pl) {
                    return Err(format!(
                        "parameter `{pname}` rests as {}, but fully_shard lays {} out as {} over `{}`",
                        fmt_placements(&pl),
                        fmt_placements(&in_use),
                        want.map_or("itself (every dim is sharded already)".to_string(), |r| fmt_placements(&r)),
                        options.mesh_dim,
                    ));
                }
                params.push(Param::new(pname, in_use, pl));
                continue;
            }
            if pl[mesh_dim] != Placement::Replicate {
                return Err(format!(
                    "parameter `{pname}` is already {} on `{}` (layout {}); a module is fully sharded once, \
                     over a dim its parameters are replicated on",
                    pl[mesh_dim],
                    options.mesh_dim,
                    fmt_placements(&pl)
                ));
            }
            pl
        };
        let stored = resting_layout(&in_use, p.ndim(), mesh_dim).unwrap_or_else(|| in_use.clone());
        params.push(Param::new(pname, in_use, stored));
    }
    Ok(params)
}

/// One all-gather of a fingerprint of what this rank decided (names, shapes, layouts,
/// `requires_grad`, the options that shape later collectives), or of its refusal: every rank
/// then fails alike when the ranks disagree or one refused, instead of waiting in a later
/// collective for a peer that left.
fn agree<T: Element, M: Module<T>>(
    mesh: &DeviceMesh,
    module: &M,
    module_name: &str,
    decided: Option<&Vec<Param<T>>>,
    options: &FullyShardOptions,
    masters: Option<DType>,
) -> Result<()> {
    const REFUSED: u64 = 0;
    let mine = match decided {
        None => REFUSED,
        Some(params) => {
            let mut h = DefaultHasher::new();
            let dtype = |d: Option<DType>| d.map(|d| d.to_string());
            let when = (options.reshard_after_forward, options.reshard_group, options.prefetch);
            (dtype(options.reduce_dtype), when, dtype(masters), T::DTYPE.to_string()).hash(&mut h);
            for ((name, p), info) in module.named_parameters().iter().zip(params) {
                (name, p.shape(), fmt_placements(&info.stored), p.requires_grad()).hash(&mut h);
            }
            h.finish().max(1)
        }
    };
    let all = mesh.all_gather_u64(Along::All, &[mine])?;
    let ranks = mesh.ranks();
    if let Some(r) = all.iter().position(|&f| f == REFUSED) {
        if decided.is_some() {
            return Err(Error::FullyShard {
                module: module_name.to_string(),
                reason: format!("rank {} refused the module (its error says why)", ranks[r]),
            });
        }
        return Ok(()); // this rank's own refusal is returned by the caller
    }
    if let Some(r) = all.iter().position(|&f| f != all[0]) {
        return Err(Error::FullyShard {
            module: module_name.to_string(),
            reason: format!(
                "the ranks wrap different parameters: rank {} and rank {} disagree about the names, shapes, \
                 layouts, dtypes or requires_grad of the module's parameters, or about the options",
                ranks[0], ranks[r],
            ),
        });
    }
    Ok(())
}

pub(super) fn short_type_name<M>() -> String {
    let full = std::any::type_name::<M>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base).to_string()
}

impl<T: Element, M: Module<T>> FullyShard<T, M> {
    /// The module's name (errors and collective records say it).
    pub fn name(&self) -> &str {
        &self.unit.name
    }

    /// The mesh the parameters are sharded over.
    pub fn mesh(&self) -> &DeviceMesh {
        &self.unit.mesh
    }

    /// The mesh dim the parameters are sharded over.
    pub fn mesh_dim(&self) -> &str {
        &self.unit.mesh.dim_names()[self.unit.mesh_dim]
    }

    /// Does the backward gather the parameters again ([`FullyShardOptions::reshard_after_forward`])?
    pub fn reshards_after_forward(&self) -> bool {
        self.reshard_after_forward
    }

    /// Each parameter's layout at rest and in use, by name.
    pub fn layouts(&self) -> Vec<(String, Vec<Placement>, Vec<Placement>)> {
        self.unit.params.iter().map(|p| (p.name.clone(), p.stored.clone(), p.in_use.clone())).collect()
    }

    /// Every parameter as [`memory_plan`](super::memory_plan) sees it (name, global shape, in-use layout).
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let shapes = self.module.named_parameters().into_iter().map(|(_, p)| p.shape());
        self.unit.param_specs(shapes, self.reshard_after_forward, self.prefetch)
    }

    /// This rank's [`MemoryPlan`] for this module with an optimizer keeping `optimizer`
    /// (the plan every rank could have made before launch: [`memory_plan`](super::memory_plan) of
    /// [`FullyShard::param_specs`]).
    pub fn memory_plan(&self, optimizer: OptimizerMemory) -> Result<MemoryPlan> {
        self.unit.plan_here(&self.param_specs(), T::DTYPE, optimizer)
    }

    /// The parameters left replicated on the FSDP dim (every tensor dim is sharded by another
    /// mesh dim already, or the parameter is a scalar).
    pub fn replicated_parameters(&self) -> Vec<&str> {
        self.unit.params.iter().filter(|p| !p.sharded()).map(|p| p.name.as_str()).collect()
    }

    /// Turns gradient synchronisation off (`false`: each backward adds the unreduced,
    /// unsharded gradients of the sharded parameters to a per-parameter buffer and
    /// reduce-scatters nothing) or back on (the next backward reduce-scatters its gradients
    /// plus the buffered ones). PyTorch `set_requires_gradient_sync`: gradient accumulation
    /// without a reduce-scatter per micro-batch. Parameters left replicated on the FSDP dim
    /// ([`FullyShard::replicated_parameters`]) are reduced at every backward as any other
    /// parameter. A buffered gradient waits for a backward with sync on that reaches its
    /// parameter: turn sync on for the last micro-batch, or drop the buffers with
    /// [`FullyShard::clear_buffered_gradients`].
    pub fn set_requires_gradient_sync(&self, sync: bool) {
        self.unit.sync.store(sync, Ordering::SeqCst);
    }

    /// Drops the gradients buffered while synchronisation was off.
    pub fn clear_buffered_gradients(&self) {
        self.unit.clear_buffered_gradients();
    }

    /// Is gradient synchronisation on?
    pub fn requires_gradient_sync(&self) -> bool {
        self.unit.sync.load(Ordering::SeqCst)
    }

    /// All-gathers the parameters now and keeps them until [`FullyShard::reshard`]: forwards
    /// until then use them without gathering again (PyTorch `FSDPModule.unshard`; e.g. for
    /// several forwards in inference). A sharded parameter changed by an optimizer step in
    /// between is not seen until `reshard` and the next gather (the parameters left replicated
    /// on the FSDP dim are always used as they are): reshard before stepping.
    pub fn unshard(&self) -> Result<()> {
        let base = at_rest(&self.module);
        // a prefetch in flight ([`FullyShard::unshard_async`]) is completed and kept
        let full = match prefetch::prefetched(self.unit.id, &self.unit, &base)? {
            Some(full) => full,
            None => base
                .iter()
                .zip(self.unit.params.iter())
                .map(|(p, info)| self.unit.gather_data(p, info))
                .collect::<Result<Vec<_>>>()?,
        };
        *self.unsharded.lock().unwrap_or_else(|e| e.into_inner()) = Some(full);
        Ok(())
    }

    /// Frees what [`FullyShard::unshard`] gathered, and a prefetch not used yet (PyTorch
    /// `FSDPModule.reshard`).
    pub fn reshard(&self) {
        *self.unsharded.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.unit.drop_prefetches::<T>();
    }

    /// Is the module holding gathered parameters ([`FullyShard::unshard`])?
    pub fn is_unsharded(&self) -> bool {
        self.unsharded.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Runs `f` on the module with its parameters gathered: the forward of any signature
    /// (several inputs, integer ids, a mask). Gradients reach the shards; the gathered
    /// parameters live until the backward has used them. A module made with
    /// [`FullyShardOptions::reshard_after_forward`] refuses `call` while gradients are
    /// recorded ([`Error::FullyShard`]): only [`Forward::forward`] can free them and recompute.
    pub fn call<R>(&self, f: impl FnOnce(&M) -> Result<R>) -> Result<R>
    where
        M: Clone,
    {
        if self.reshard_after_forward && is_grad_enabled() {
            return Err(Error::FullyShard {
                module: self.unit.name.clone(),
                reason: "made with reshard_after_forward: its gathered parameters are freed by recomputing \
                         Forward::forward, which `call` (any closure) cannot do; use forward, or call under no_grad"
                    .into(),
            });
        }
        self.run(f)
    }

    /// [`FullyShard::call`] without the resharding check.
    fn run<R>(&self, f: impl FnOnce(&M) -> Result<R>) -> Result<R>
    where
        M: Clone,
    {
        let base = at_rest(&self.module);
        let cached = match self.unsharded.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            Some(c) => Some(c),
            None => prefetch::prefetched(self.unit.id, &self.unit, &base)?,
        };
        self.unit.run_on(&self.module, &base, cached.as_deref(), f)
    }

    /// Starts all-gathering the parameters now, on the rank's background collective path
    /// where the backend has one (the thread backend; elsewhere it runs at once), for the
    /// next forward ([`FullyShard::call`] or [`Forward::forward`]) to use: PyTorch
    /// `FSDPModule.unshard(async_op=True)`, and what forward prefetch
    /// ([`FullyShardOptions::prefetch`]) calls. The forward waits for them; it uses
    /// them only if the parameters are still those they were gathered from (a step or a
    /// replacement in between means a fresh gather). A no-op while [`FullyShard::unshard`]ed
    /// or already started.
    ///
    /// Every rank must start it at the same point of its program (a collective), and the
    /// unit's gathered parameters then live from here to its forward: one more unit's window
    /// while the unit before computes. The prefetch belongs to the calling thread (the rank):
    /// the forward that uses it runs there; [`FullyShard::unshard`] completes and keeps it,
    /// [`FullyShard::reshard`] drops it.
    pub fn unshard_async(&self) -> Result<()> {
        if self.is_unsharded() || prefetch::is_started(self.unit.id) {
            return Ok(());
        }
        let started = self.unit.start_gather(&at_rest(&self.module), |p| Ok(p.clone()))?;
        prefetch::keep(self.unit.id, started);
        Ok(())
    }
}

impl<T: Element, M> Drop for FullyShard<T, M> {
    /// Waits for (and drops) a prefetch nobody used, on this rank.
    fn drop(&mut self) {
        self.unit.drop_prefetches::<T>();
    }
}

impl<T: Element, M: Module<T>> Module<T> for FullyShard<T, M> {
    fn named_parameters(&self) -> Vec<(String, &DTensor<T>)> {
        self.module.named_parameters()
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        self.module.named_parameters_mut()
    }
    fn named_buffers(&self) -> Vec<(String, &DTensor<T>)> {
        self.module.named_buffers()
    }
    fn named_buffers_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        self.module.named_buffers_mut()
    }
    fn layer_hooks_mut(&mut self, path: &str) -> Option<&mut LayerHooks> {
        self.module.layer_hooks_mut(path)
    }
    /// The module's declared layouts at rest: a declared in-use layout is declared sharded.
    fn declared_placements(&self) -> Vec<(String, Vec<Placement>)> {
        at_rest_declared(self.module.declared_placements(), &self.unit.params)
    }
}

impl<T: Element, M: Module<T> + Forward<T> + Clone + Send + Sync + 'static> Forward<T> for FullyShard<T, M> {
    /// `call(|m| m.forward(input))`; with [`FullyShardOptions::reshard_after_forward`] (and
    /// gradients recorded, without [`FullyShard::unshard`]ed parameters) the forward keeps
    /// nothing but its input, and the backward gathers and recomputes it.
    fn forward(&self, input: &DTensor<T>) -> Result<DTensor<T>> {
        if self.reshard_after_forward && is_grad_enabled() && !self.is_unsharded() {
            let base = at_rest(&self.module);
            let gathered = prefetch::prefetched(self.unit.id, &self.unit, &base)?;
            forward_recomputed(&self.unit, &self.module, input, base, gathered, self.prefetch)
        } else {
            self.run(|m| m.forward(input))
        }
    }

    /// [`FullyShard::unshard_async`] when made with [`FullyShardOptions::prefetch`].
    fn prefetch(&self) -> Result<()> {
        if self.prefetch {
            self.unshard_async()?;
        }
        Ok(())
    }
}
