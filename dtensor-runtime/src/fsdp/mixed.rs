//! Mixed precision under FSDP (PyTorch `MixedPrecisionPolicy`): the parameters rest as
//! sharded masters in one dtype (`S`, e.g. f32), the module computes in another (`C`, e.g.
//! bf16). Each forward casts the shards to `C` before the all-gather (half the bytes for
//! bf16), casts the input to `C` and the output back to `S`; the backward reduce-scatters the
//! gradients in the reduce dtype and hands them to the masters in `S`.
//!
//! The autograd tape is typed by element (a node's gradient has the node's dtype), so the
//! module's graph in `C` runs nested: the unit records one node in `S` whose backward runs
//! the `C` graph from gradient sinks (`sink.rs`) and hands on what reached them, as the
//! resharding recomputation does.

use super::fully_shard::{shard, short_type_name};
use super::prefetch;
use super::sink::{sink, take, Sink};
use super::unit::{at_rest_declared, settle_gradient, Unit};
use super::{FullyShardOptions, MemoryPlan, OptimizerMemory, ParamSpec};
use crate::autograd::{enable_grad_guard, no_grad, record, recording, redistribute_grad, BackwardOptions};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::factory::{empty, TensorOptions};
use crate::mesh::DeviceMesh;
use crate::module::{Forward, LayerHooks, Module};
use crate::placement::Placement;
use crate::rng::{rng_state, set_rng_state};
use std::marker::PhantomData;
use std::sync::Mutex;

/// A module fully sharded with its parameters kept in `S` and its computation in `C`
/// (PyTorch `fully_shard(module, mp_policy=MixedPrecisionPolicy(...))`), made by
/// [`fully_shard_mixed`].
///
/// | PyTorch `MixedPrecisionPolicy` | here |
/// |---|---|
/// | the parameters' own dtype (the sharded masters) | `S`: [`Module::named_parameters`] are the `S` shards |
/// | `param_dtype` | `C`: the wrapped module's element type |
/// | `reduce_dtype` (default: `param_dtype`) | [`FullyShardOptions::reduce_dtype`] (default: `C`) |
/// | `output_dtype` | `S`: [`Forward<S>`] returns `S` |
/// | `cast_forward_inputs=True` | the `S` input is cast to `C` |
///
/// An optimizer steps the `S` masters (plain AdamW over f32 shards: no separate master
/// copy), checkpoints save them, and the all-gathers move `C` bytes. The module's own
/// parameter slots hold empty placeholders between forwards (its parameters exist once, as
/// the masters).
pub struct FullyShardMixed<S: Element, C: Element, M> {
    module: M,
    masters: Vec<DTensor<S>>,
    unit: Unit<S>,
    reshard_after_forward: bool,
    prefetch: bool,
    unsharded: Mutex<Option<Vec<DTensor<C>>>>,
    _compute: PhantomData<fn() -> C>,
}

/// Fully shards `module` (computing in `C`) with its masters in `S`: [`fully_shard`]'s
/// layouts, checks and options (see [`FullyShardMixed`] for the dtypes), the masters made by
/// casting the module's parameters to `S` (load full-precision weights into
/// [`Module::named_parameters_mut`] of the result, e.g. with a checkpoint loader).
///
/// Errors: [`fully_shard`]'s; a module with buffers ([`Module::named_buffers`]: they would be
/// left out of `Module<S>`, so of checkpoints) is refused naming the buffer.
///
/// [`fully_shard`]: super::fully_shard
///
/// ```
/// use dtensor_runtime::fsdp::{fully_shard_mixed, FullyShardOptions};
/// use dtensor_runtime::module::{Forward, Linear, Module};
/// use dtensor_runtime::{bf16, distribute_tensor, run, CollectiveKind, CommDebugMode, DTensor, DType, Shard};
/// use dtensor_runtime::ndarray::ArrayD;
/// run(2, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
///     let opts = FullyShardOptions::on("dp").reduce_dtype(DType::F32);
///     let lin = fully_shard_mixed::<f32, _, _>(Linear::<bf16>::new(4, 6, true)?, &mesh, &opts)?;
///     // the masters: f32, sharded
///     let (name, w): &(String, &DTensor<f32>) = &lin.named_parameters()[0];
///     assert_eq!((name.as_str(), w.placements()), ("weight", &[Shard(0)][..]));
///     let x = distribute_tensor(ArrayD::from_elem(vec![2, 4], 0.5f32), &mesh, &[Shard(0)], None)?;
///     let comm = CommDebugMode::new();
///     let y: DTensor<f32> = comm.scope(|| lin.forward(&x))?;
///     y.sum()?.backward()?;
///     // two all-gathers of bf16 shards: the weight's [3, 4] and the bias's [3]
///     assert_eq!(comm.by_kind()[&(CollectiveKind::AllGather, "dp".to_string())], (2, (12 + 3) * 2));
///     assert_eq!(lin.named_parameters()[0].1.grad().unwrap().placements(), &[Shard(0)]);
///     Ok(())
/// }).unwrap();
/// ```
pub fn fully_shard_mixed<S: Element, C: Element, M: Module<C>>(
    module: M,
    mesh: &DeviceMesh,
    options: &FullyShardOptions,
) -> Result<FullyShardMixed<S, C, M>> {
    if let Some((buffer, _)) = module.named_buffers().first() {
        let name = options.name.clone().unwrap_or_else(|| short_type_name::<M>());
        return Err(Error::FullyShard {
            module: name,
            reason: format!(
                "buffer `{buffer}` is in the module's dtype {} and would be left out of the masters in {} \
                 (and of checkpoints): a mixed-precision unit takes modules without buffers",
                C::DTYPE,
                S::DTYPE
            ),
        });
    }
    let (mut module, unit) = shard(module, mesh, options, Some(S::DTYPE))?;
    let placeholder = TensorOptions::new().mesh(mesh).placements(&vec![Placement::Replicate; mesh.ndim()]);
    let mut masters = Vec::new();
    for (_, p) in module.named_parameters_mut() {
        masters.push(p.cast::<S>()?.requires_grad_(p.requires_grad()));
        *p = empty::<C>(&[0], &placeholder)?;
    }
    Ok(FullyShardMixed {
        module,
        masters,
        unit: unit.retyped::<S>(),
        reshard_after_forward: options.reshard_after_forward,
        prefetch: options.prefetch,
        unsharded: Mutex::new(None),
        _compute: PhantomData,
    })
}

impl<S: Element, C: Element, M: Module<C>> FullyShardMixed<S, C, M> {
    /// The module's name (errors and collective records say it).
    pub fn name(&self) -> &str {
        &self.unit.name
    }

    /// The mesh dim the parameters are sharded over.
    pub fn mesh_dim(&self) -> &str {
        &self.unit.mesh.dim_names()[self.unit.mesh_dim]
    }

    /// Each parameter's layout at rest and in use, by name.
    pub fn layouts(&self) -> Vec<(String, Vec<Placement>, Vec<Placement>)> {
        self.unit.params.iter().map(|p| (p.name.clone(), p.stored.clone(), p.in_use.clone())).collect()
    }

    /// Every parameter as [`memory_plan`](super::memory_plan) sees it, gathered in `C`
    /// ([`ParamSpec::gathered_in`]).
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let specs =
            self.unit.param_specs(self.masters.iter().map(|p| p.shape()), self.reshard_after_forward, self.prefetch);
        specs.into_iter().map(|s| s.gathered_in(C::DTYPE)).collect()
    }

    /// This rank's [`MemoryPlan`] (masters, gradients and optimizer states in `S`, the
    /// gathered window in `C`).
    pub fn memory_plan(&self, optimizer: OptimizerMemory) -> Result<MemoryPlan> {
        self.unit.plan_here(&self.param_specs(), S::DTYPE, optimizer)
    }

    /// [`FullyShard::set_requires_gradient_sync`](super::FullyShard::set_requires_gradient_sync):
    /// with sync off, every parameter's unreduced gradient is buffered in `S`.
    pub fn set_requires_gradient_sync(&self, sync: bool) {
        self.unit.sync.store(sync, std::sync::atomic::Ordering::SeqCst);
    }

    /// Drops the gradients buffered while synchronisation was off.
    pub fn clear_buffered_gradients(&self) {
        self.unit.clear_buffered_gradients();
    }

    /// Gathers the masters (cast to `C`) now and keeps them until [`FullyShardMixed::reshard`]
    /// (PyTorch `FSDPModule.unshard`); a master stepped in between is seen after `reshard`.
    pub fn unshard(&self) -> Result<()> {
        let gathered = match prefetch::prefetched::<S, C>(self.unit.id, &self.unit, &self.masters)? {
            Some(g) => g,
            None => gather(&self.unit, &self.masters)?,
        };
        *self.unsharded.lock().unwrap_or_else(|e| e.into_inner()) = Some(gathered);
        Ok(())
    }

    /// Frees what [`FullyShardMixed::unshard`] gathered, and a prefetch not used yet.
    pub fn reshard(&self) {
        *self.unsharded.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.unit.drop_prefetches::<C>();
    }

    /// Starts gathering the masters (cast to `C`) for the next forward, in the background
    /// where the backend can ([`FullyShard::unshard_async`](super::FullyShard::unshard_async)).
    pub fn unshard_async(&self) -> Result<()> {
        let unsharded = self.unsharded.lock().unwrap_or_else(|e| e.into_inner()).is_some();
        if unsharded || prefetch::is_started(self.unit.id) {
            return Ok(());
        }
        let started = self.unit.start_gather(&self.masters, to_compute::<S, C>)?;
        prefetch::keep(self.unit.id, started);
        Ok(())
    }

    /// Checks that the masters still rest as `fully_shard_mixed` left them.
    fn check_masters(&self) -> Result<()> {
        if self.masters.len() != self.unit.params.len() {
            return Err(self.unit.changed(format!(
                "has {} masters, not {}",
                self.masters.len(),
                self.unit.params.len()
            )));
        }
        self.unit.check_at_rest(&self.masters, "fully_shard_mixed")
    }
}

/// A master in the compute dtype (no history).
fn to_compute<S: Element, C: Element>(m: &DTensor<S>) -> Result<DTensor<C>> {
    m.detach().cast::<C>()
}

/// Every master cast to `C` and gathered into its in-use layout (no history).
fn gather<S: Element, C: Element>(unit: &Unit<S>, masters: &[DTensor<S>]) -> Result<Vec<DTensor<C>>> {
    masters.iter().zip(unit.params.iter()).map(|(m, info)| unit.gather_data(&to_compute::<S, C>(m)?, info)).collect()
}

/// `module.forward(x)` on a shallow copy of `module` holding `params` (in the unit's order).
fn run_with<S: Element, C: Element, M: Module<C> + Forward<C> + Clone>(
    unit: &Unit<S>,
    module: &M,
    params: &[DTensor<C>],
    x: &DTensor<C>,
) -> Result<DTensor<C>> {
    let mut running = module.clone();
    for (i, ((name, slot), info)) in running.named_parameters_mut().into_iter().zip(unit.params.iter()).enumerate() {
        if name != info.name {
            return Err(unit.changed(format!("parameter {i} is now `{name}`, not `{}`", info.name)));
        }
        *slot = params[i].clone();
    }
    running.forward(x)
}

/// `t` through a sink when its gradient is wanted.
fn sunk<C: Element>(t: &DTensor<C>, wanted: bool) -> (DTensor<C>, Sink<C>) {
    if wanted {
        sink(t)
    } else {
        (t.clone(), None)
    }
}

/// The gradients that reached the sinks, for the unit's node: the input's cast to `S`, each
/// parameter's cast to `S` and reduce-scattered (in the reduce dtype, default `C`) into its
/// master's layout, or buffered while sync is off.
fn hand_on<S: Element, C: Element>(
    unit: &Unit<S>,
    input: &Sink<C>,
    params: &[Sink<C>],
) -> Result<Vec<Option<DTensor<S>>>> {
    let mut out = vec![take(input).map(|g| g.cast::<S>()).transpose()?];
    let dtype = Some(unit.reduce_dtype.unwrap_or(C::DTYPE));
    for (s, info) in params.iter().zip(unit.params.iter()) {
        out.push(match take(s) {
            None => None,
            Some(g) => {
                let g_s = g.cast::<S>()?;
                drop(g); // the module-dtype copy goes before the reduction makes another
                if info.sharded() {
                    settle_gradient(&unit.sync, info, g_s, dtype)?
                } else {
                    // left replicated on the FSDP dim: reduced at every backward, as
                    // `fully_shard` does (its leaf reduces it), sync on or off
                    Some(redistribute_grad(&g_s, &info.stored, dtype, "fsdp_all_reduce")?)
                }
            }
        });
    }
    Ok(out)
}

impl<S, C, M> Forward<S> for FullyShardMixed<S, C, M>
where
    S: Element,
    C: Element,
    M: Module<C> + Forward<C> + Clone + Send + Sync + 'static,
{
    /// Casts the input to `C`, runs the module on the gathered `C` parameters, returns the
    /// output in `S`. With [`FullyShardOptions::reshard_after_forward`] (and no
    /// [`FullyShardMixed::unshard`]ed parameters) the forward keeps only its input, and the
    /// backward gathers and recomputes it.
    fn forward(&self, x: &DTensor<S>) -> Result<DTensor<S>> {
        self.check_masters()?;
        let cached = self.unsharded.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // gathered ahead by `prefetch` (for this forward only)
        let ahead = match cached {
            Some(_) => None,
            None => prefetch::prefetched::<S, C>(self.unit.id, &self.unit, &self.masters)?,
        };
        let gathered = |ahead: Option<Vec<DTensor<C>>>| ahead.map_or_else(|| gather(&self.unit, &self.masters), Ok);
        let x_c = x.detach().cast::<C>()?;
        let inputs: Vec<&DTensor<S>> = std::iter::once(x).chain(&self.masters).collect();
        let needs: Vec<bool> = inputs.iter().map(|t| t.requires_grad()).collect();
        if !recording(&inputs) {
            let params = gathered(cached.or(ahead))?;
            return no_grad(|| run_with(&self.unit, &self.module, &params, &x_c))?.cast::<S>();
        }
        let (unit, module) = (self.unit.clone(), self.module.clone());
        match cached {
            None if self.reshard_after_forward => {
                let rng = rng_state();
                let params = gathered(ahead)?;
                let y = no_grad(|| run_with(&unit, &module, &params, &x_c))?;
                // resharding to a smaller group keeps a slice of each gathered parameter
                let kept = unit.keep(&params)?;
                drop(params);
                let masters: Vec<DTensor<S>> = self.masters.iter().map(|m| m.detach()).collect();
                // backward prefetch, as `fully_shard`'s resharding units do (reshard.rs)
                let (previous, start_me) = match (self.prefetch, &kept) {
                    (true, Some(kept)) => (prefetch::previous(x), Some(kept.starter())),
                    (true, None) => {
                        (prefetch::previous(x), Some(prefetch::starter(&unit, masters.clone(), to_compute::<S, C>)))
                    }
                    (false, _) => (None, None),
                };
                let out = record("fsdp_mixed_recompute_backward", y.cast::<S>()?, &inputs, move |g| {
                    let _recording = enable_grad_guard();
                    prefetch::unchain();
                    let params = match &kept {
                        Some(kept) => kept.gather()?,
                        None => match prefetch::prefetched::<S, C>(unit.id, &unit, &masters)? {
                            Some(p) => p,
                            None => gather::<S, C>(&unit, &masters)?,
                        },
                    };
                    if let Some(start) = &previous {
                        start()?;
                    }
                    let (xs, x_sink) = sunk(&x_c, needs[0]);
                    let (ps, p_sinks): (Vec<_>, Vec<_>) =
                        params.iter().zip(&needs[1..]).map(|(p, &n)| sunk(p, n)).unzip();
                    drop(params);
                    // the recomputation draws the forward's random numbers (dropout)
                    let after = rng_state();
                    set_rng_state(rng);
                    let y = run_with(&unit, &module, &ps, &xs);
                    set_rng_state(after);
                    let y = y?;
                    if !y.requires_grad() {
                        return Ok(vec![None; 1 + p_sinks.len()]);
                    }
                    y.backward_with(&g.cast::<C>()?)?;
                    hand_on(&unit, &x_sink, &p_sinks)
                });
                if let Some(start) = start_me {
                    prefetch::chain(&out, start);
                }
                Ok(out)
            }
            cached => {
                let params = gathered(cached.or(ahead))?;
                let (xs, x_sink) = sunk(&x_c, needs[0]);
                let (ps, p_sinks): (Vec<_>, Vec<_>) = params.iter().zip(&needs[1..]).map(|(p, &n)| sunk(p, n)).unzip();
                let y = run_with(&unit, &module, &ps, &xs)?;
                let out = y.detach().cast::<S>()?;
                Ok(record("fsdp_mixed_backward", out, &inputs, move |g| {
                    if !y.requires_grad() {
                        return Ok(vec![None; 1 + p_sinks.len()]); // nothing recorded reaches a sink
                    }
                    // The nested graph is kept for a later pass (the outer `retain_graph`); it is
                    // freed with this closure, when the outer pass drops it.
                    y.backward_with_opts(&g.cast::<C>()?, &BackwardOptions::new().retain_graph(true))?;
                    hand_on(&unit, &x_sink, &p_sinks)
                }))
            }
        }
    }

    /// [`FullyShardMixed::unshard_async`] when made with
    /// [`FullyShardOptions::prefetch`].
    fn prefetch(&self) -> Result<()> {
        if self.prefetch {
            self.unshard_async()?;
        }
        Ok(())
    }
}

impl<S: Element, C: Element, M> Drop for FullyShardMixed<S, C, M> {
    /// Waits for (and drops) a prefetch nobody used, on this rank.
    fn drop(&mut self) {
        self.unit.drop_prefetches::<C>();
    }
}

impl<S: Element, C: Element, M: Module<C>> Module<S> for FullyShardMixed<S, C, M> {
    fn named_parameters(&self) -> Vec<(String, &DTensor<S>)> {
        self.unit.params.iter().map(|p| p.name.clone()).zip(self.masters.iter()).collect()
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<S>)> {
        self.unit.params.iter().map(|p| p.name.clone()).zip(self.masters.iter_mut()).collect()
    }
    fn layer_hooks_mut(&mut self, path: &str) -> Option<&mut LayerHooks> {
        self.module.layer_hooks_mut(path)
    }
    /// The module's declared layouts at rest (as [`FullyShard`](super::FullyShard)'s).
    fn declared_placements(&self) -> Vec<(String, Vec<Placement>)> {
        at_rest_declared(self.module.declared_placements(), &self.unit.params)
    }
}
