//! Each rank's memory under FSDP, known before launch: from the parameters' shapes and in-use
//! layouts, the mesh and the optimizer, the bytes of parameters, gradients and optimizer
//! states every rank holds, and the window of gathered parameters on top of them.

use super::reshard_group::group_fits;
use super::resting_layout;
use crate::element::DType;
use crate::error::{Error, Result};
use crate::layout::{checked_local_shape_and_offset, chunk_size_and_offset};
use crate::placement::{fmt_placements, normalize_placements, Placement};
use std::fmt;

/// A parameter as the plan sees it: its name, global shape, the layout its module uses it in
/// (`Replicate` on the FSDP mesh dim), and its FSDP unit (the `fully_shard`ed module it
/// belongs to, gathered together).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ParamSpec {
    /// Dotted name (errors say it).
    pub name: String,
    /// Global shape.
    pub shape: Vec<usize>,
    /// In-use placements, one per mesh dim.
    pub in_use: Vec<Placement>,
    /// The unit it belongs to (any name; parameters with the same name form one unit;
    /// [`ParamSpec::new`] puts every parameter in the unit `""`).
    pub unit: String,
    /// Does its unit reshard after the forward (`FullyShardOptions::reshard_after_forward`)?
    pub reshard_after_forward: bool,
    /// Does its unit prefetch (`FullyShardOptions::prefetch`)? Two consecutive resharding units
    /// are then gathered at once (the next one while this one computes, and the one before
    /// while this one's backward recomputes).
    pub prefetch: bool,
    /// The dtype it is gathered and computed in when not the plan's (a
    /// [`FullyShardMixed`](super::FullyShardMixed) unit's module dtype; `None`: the plan's).
    pub gathered_dtype: Option<DType>,
    /// The group its unit reshards to after the forward when smaller than the FSDP dim
    /// (`FullyShardOptions::reshard_after_forward_to`): the unit keeps `1/group` of the
    /// gathered parameter from its forward until its backward.
    pub reshard_group: Option<usize>,
}

impl ParamSpec {
    /// A parameter `name` of `shape` used in the layout `in_use`, in the unit `""`, which
    /// keeps its gathered parameters until the backward.
    pub fn new(name: &str, shape: &[usize], in_use: &[Placement]) -> Self {
        ParamSpec {
            name: name.to_string(),
            shape: shape.to_vec(),
            in_use: in_use.to_vec(),
            unit: String::new(),
            reshard_after_forward: false,
            prefetch: false,
            gathered_dtype: None,
            reshard_group: None,
        }
    }

    /// Puts the parameter in the unit `unit`, resharding after the forward or not.
    pub fn in_unit(mut self, unit: &str, reshard_after_forward: bool) -> Self {
        self.unit = unit.to_string();
        self.reshard_after_forward = reshard_after_forward;
        if !reshard_after_forward {
            self.reshard_group = None;
        }
        self
    }

    /// Its unit prefetches (see [`ParamSpec::prefetch`]).
    pub fn prefetched(mut self, on: bool) -> Self {
        self.prefetch = on;
        self
    }

    /// Its unit reshards after the forward to groups of `group` ranks (see
    /// [`ParamSpec::reshard_group`]; turns [`ParamSpec::reshard_after_forward`] on).
    ///
    /// ```
    /// use dtensor_runtime::fsdp::{memory_plan, OptimizerMemory, ParamSpec};
    /// use dtensor_runtime::{DType, Replicate};
    /// let w = ParamSpec::new("w", &[1024, 1024], &[Replicate]); // 4 MiB in f32
    /// let plan = |p: ParamSpec| memory_plan(&[p], &[8], 0, DType::F32, OptimizerMemory::none());
    /// // resharding to groups of 4 of the 8 ranks keeps a quarter of it from the forward
    /// assert_eq!(plan(w.clone().resharded_to(4))?[0].resharded_kept, 1 << 20);
    /// assert_eq!(plan(w.clone().in_unit("", true))?[0].resharded_kept, 0);
    /// assert!(plan(w.resharded_to(3)).is_err()); // 3 does not divide 8
    /// # Ok::<(), dtensor_runtime::Error>(())
    /// ```
    pub fn resharded_to(mut self, group: usize) -> Self {
        self.reshard_after_forward = true;
        self.reshard_group = Some(group);
        self
    }

    /// The parameter is gathered and used in `dtype` (mixed precision: it rests in the plan's
    /// dtype, its window and unreduced gradient are in `dtype`, and the gradient is cast back
    /// to the plan's dtype before its reduction).
    pub fn gathered_in(mut self, dtype: DType) -> Self {
        self.gathered_dtype = Some(dtype);
        self
    }
}

/// Bytes an optimizer keeps per element of a parameter shard.
///
/// ```
/// use dtensor_runtime::fsdp::OptimizerMemory;
/// use dtensor_runtime::DType;
/// assert_eq!(OptimizerMemory::adamw(DType::F32).bytes_per_element, 8); // two f32 moments
/// assert_eq!(OptimizerMemory::adamw_master_weights().bytes_per_element, 12); // f32 copy + moments
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptimizerMemory {
    /// State bytes per parameter element.
    pub bytes_per_element: usize,
}

impl OptimizerMemory {
    /// No optimizer state (plain SGD, or no optimizer).
    pub fn none() -> Self {
        OptimizerMemory { bytes_per_element: 0 }
    }
    /// SGD with momentum: one buffer in the parameters' dtype.
    pub fn sgd_momentum(dtype: DType) -> Self {
        OptimizerMemory { bytes_per_element: dtype.size_of() }
    }
    /// AdamW: two moments in the parameters' dtype.
    pub fn adamw(dtype: DType) -> Self {
        OptimizerMemory { bytes_per_element: 2 * dtype.size_of() }
    }
    /// AdamW with master weights: an f32 copy and two f32 moments.
    pub fn adamw_master_weights() -> Self {
        OptimizerMemory { bytes_per_element: 3 * 4 }
    }
    /// SGD with master weights: an f32 copy, and an f32 momentum buffer when `momentum`.
    pub fn sgd_master_weights(momentum: bool) -> Self {
        OptimizerMemory { bytes_per_element: if momentum { 8 } else { 4 } }
    }
}

/// One rank's bytes under FSDP (parameters in their dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryPlan {
    /// The rank (its index in the mesh, row-major).
    pub rank: usize,
    /// Parameter shards (and parameters left replicated on the FSDP dim).
    pub parameters: usize,
    /// Gradients, laid out as the parameters rest.
    pub gradients: usize,
    /// Optimizer state.
    pub optimizer_states: usize,
    /// The gathered parameters of every unit that keeps them from the forward until the
    /// backward has used them. None when the FSDP dim has one rank: the shard is the whole
    /// parameter, used as it is.
    pub unsharded_window: usize,
    /// The largest unit's gathered parameters among the units that reshard after the forward
    /// (gathered again, one unit at a time, for its recomputation and backward); with prefetch,
    /// a unit's with the unit before it's (gathered while this one recomputes).
    pub resharded_window: usize,
    /// The largest of a resharding unit's backward: the gradient shards of the units after it
    /// (their backward has run), its gathered parameters and, with prefetch, the unit before
    /// it's, and the slices it and the units before it kept from the forward when they reshard
    /// to a smaller group.
    pub resharded_backward: usize,
    /// The slices of gathered parameters kept from the forward until the backward by the units
    /// that reshard to a smaller group than the FSDP dim (all of them at the backward's start;
    /// [`MemoryPlan::resharded_backward`] counts those still alive in each unit's backward).
    pub resharded_kept: usize,
    /// The largest gradient in its in-use layout: the one unreduced gradient alive at a time,
    /// before its reduce-scatter (a mixed-precision unit: all its gradients in the module's
    /// dtype, which its nested backward makes before reducing any, and one copy in the plan's
    /// dtype).
    pub largest_unsharded_gradient: usize,
    /// The largest parameter shard: the optimizer's scratch while it updates one parameter.
    pub largest_shard: usize,
}

impl MemoryPlan {
    /// What the rank holds between steps: parameters, gradients, optimizer states.
    pub fn at_rest(&self) -> usize {
        self.parameters + self.gradients + self.optimizer_states
    }

    /// The peak of a training step, activations aside, when the gradients are released
    /// before the forward (`zero_grad`, which sets them to none as PyTorch's does): the larger
    /// of the backward's and the optimizer step's (everything at rest and one parameter's
    /// scratch). The backward holds parameters, optimizer states and one unreduced gradient,
    /// and the kept window at its start (as it goes on, each gathered parameter it has used is
    /// freed while a smaller gradient shard takes its place); a unit that reshards is gathered
    /// again late, with its gradient and the reduce-scatter's send buffer, when the gradient
    /// shards of the units after it exist already.
    pub fn peak(&self) -> usize {
        let mut backward =
            self.parameters + self.optimizer_states + self.unsharded_window + self.largest_unsharded_gradient;
        if self.resharded_window > 0 {
            // A resharding unit's backward holds its gathered parameters again (and the
            // prefetched ones of the unit before it), the unreduced gradient and the
            // reduce-scatter's send buffer at once, while the gradient shards of the units
            // after it exist already.
            backward += self.resharded_backward + self.largest_unsharded_gradient;
        }
        backward.max(self.at_rest() + self.largest_shard)
    }

    /// The peak when gradients are kept across the forward (accumulation over micro-batches,
    /// or no `zero_grad` before it): [`MemoryPlan::peak`] plus the gradients.
    pub fn peak_keeping_gradients(&self) -> usize {
        self.peak() + self.gradients
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        write!(
            f,
            "rank {}: parameters {:.2} MiB, gradients {:.2} MiB, optimizer {:.2} MiB, window {:.2} MiB, \
             peak {:.2} MiB",
            self.rank,
            mib(self.parameters),
            mib(self.gradients),
            mib(self.optimizer_states),
            mib(self.unsharded_window.max(self.resharded_window)),
            mib(self.peak())
        )
    }
}

/// Every rank's [`MemoryPlan`] (row-major rank order) for parameters `params` in `dtype`,
/// fully sharded over mesh dim `fsdp_dim` of a mesh of shape `mesh_shape`, with an optimizer
/// keeping `optimizer` per element: the answer before launch, from shapes and layouts alone.
/// Each parameter rests as [`resting_layout`] says (as `fully_shard` lays it out), with
/// `torch.chunk` sizes, so uneven shards count exactly.
///
/// ```
/// use dtensor_runtime::fsdp::{memory_plan, OptimizerMemory, ParamSpec};
/// use dtensor_runtime::{DType, Replicate};
/// let params = [ParamSpec::new("w", &[1024, 1024], &[Replicate])];
/// let one = memory_plan(&params, &[1], 0, DType::F32, OptimizerMemory::adamw(DType::F32))?;
/// let four = memory_plan(&params, &[4], 0, DType::F32, OptimizerMemory::adamw(DType::F32))?;
/// assert_eq!(four[0].at_rest() * 4, one[0].at_rest()); // parameters, gradients, moments: 1/dp
/// assert_eq!(four[0].unsharded_window, 4 << 20); // plus the gathered weight
/// # Ok::<(), dtensor_runtime::Error>(())
/// ```
pub fn memory_plan(
    params: &[ParamSpec],
    mesh_shape: &[usize],
    fsdp_dim: usize,
    dtype: DType,
    optimizer: OptimizerMemory,
) -> Result<Vec<MemoryPlan>> {
    let refuse = |reason: String| Error::FullyShard { module: "memory_plan".into(), reason };
    if fsdp_dim >= mesh_shape.len() {
        return Err(refuse(format!("mesh dim {fsdp_dim} does not exist on a mesh of shape {mesh_shape:?}")));
    }
    let mut resting = Vec::with_capacity(params.len());
    for p in params {
        let in_use = normalize_placements(&p.in_use, p.shape.len(), mesh_shape.len())?;
        if in_use[fsdp_dim] != Placement::Replicate {
            return Err(refuse(format!(
                "parameter `{}` is used as {}: FSDP gathers it to `Replicate` on mesh dim {fsdp_dim}",
                p.name,
                fmt_placements(&in_use)
            )));
        }
        if let Some(group) = p.reshard_group.filter(|&g| !group_fits(g, mesh_shape[fsdp_dim])) {
            return Err(refuse(format!(
                "parameter `{}`: its unit reshards to groups of {group}, which must divide the {} ranks of the FSDP \
                 dim and be at least 2",
                p.name, mesh_shape[fsdp_dim]
            )));
        }
        let stored = resting_layout(&in_use, p.shape.len(), fsdp_dim);
        resting.push((in_use, stored));
    }
    let size = dtype.size_of();
    let ranks: usize = mesh_shape.iter().product();
    let mut plans = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let mut coord = vec![0; mesh_shape.len()];
        let mut rest = rank;
        for (c, &n) in coord.iter_mut().zip(mesh_shape).rev() {
            *c = rest % n;
            rest /= n;
        }
        let numel = |shape: &[usize], pl: &[Placement]| -> Result<usize> {
            Ok(checked_local_shape_and_offset(shape, mesh_shape, &coord, pl)?.0.iter().product())
        };
        let mut plan = MemoryPlan { rank, ..MemoryPlan::default() };
        // every unit in the order it first appears: (name, gradient shard bytes, gathered bytes
        // if it reshards, reshards, prefetches, bytes kept from the forward)
        let mut units: Vec<(&str, usize, usize, bool, bool, usize)> = Vec::new();
        // mixed-precision units: (unit, their gradients in the module's dtype, largest
        // parameter's elements)
        let mut mixed_units: Vec<(&str, usize, usize)> = Vec::new();
        for (p, (in_use, stored)) in params.iter().zip(&resting) {
            let at_rest = numel(&p.shape, stored.as_deref().unwrap_or(in_use))? * size;
            plan.parameters += at_rest;
            plan.gradients += at_rest;
            plan.optimizer_states += at_rest / size * optimizer.bytes_per_element;
            plan.largest_shard = plan.largest_shard.max(at_rest);
            let unit = match units.iter().position(|u| u.0 == p.unit) {
                Some(i) => i,
                None => {
                    units.push((&p.unit, 0, 0, p.reshard_after_forward, p.prefetch, 0));
                    units.len() - 1
                }
            };
            units[unit].1 += at_rest;
            // Over one rank the gathered parameter is the shard itself, and a parameter left
            // replicated is used as it is (no copy) — unless it is cast to a compute dtype.
            if p.gathered_dtype.is_none() && !(stored.is_some() && mesh_shape[fsdp_dim] > 1) {
                continue;
            }
            let elements = numel(&p.shape, in_use)?;
            let gathered = elements * p.gathered_dtype.map_or(size, |d| d.size_of());
            if p.reshard_after_forward {
                units[unit].2 += gathered;
                let kept =
                    kept(p, stored.as_ref().map(|s| s[fsdp_dim]), gathered, mesh_shape[fsdp_dim], coord[fsdp_dim]);
                units[unit].5 += kept;
                plan.resharded_kept += kept;
            } else {
                plan.unsharded_window += gathered;
            }
            if p.gathered_dtype.is_some() {
                match mixed_units.iter_mut().find(|(u, _, _)| *u == p.unit) {
                    Some((_, b, m)) => (*b, *m) = (*b + gathered, (*m).max(elements)),
                    None => mixed_units.push((&p.unit, gathered, elements)),
                }
            } else {
                plan.largest_unsharded_gradient = plan.largest_unsharded_gradient.max(gathered);
            }
        }
        // A mixed-precision unit's nested backward holds all its gradients in the module's
        // dtype before reducing the first; each is cast to the plan's dtype, its
        // module-dtype copy freed, and cast again for a reduction in the module's dtype.
        for (_, grads, largest) in mixed_units {
            plan.largest_unsharded_gradient = plan.largest_unsharded_gradient.max(grads + largest * size);
        }
        // A resharding unit's backward: its window, the one before it prefetched (both
        // prefetching and resharding: the unit links to the one whose output it takes), the
        // gradient shards of the units after it, and what it and the units before it kept from
        // the forward (resharding to a smaller group).
        for (k, &(_, _, window, reshard, prefetch, _)) in units.iter().enumerate() {
            if !reshard {
                continue;
            }
            let before = match k.checked_sub(1).map(|j| units[j]) {
                Some((_, _, w, true, true, _)) if prefetch => w,
                _ => 0,
            };
            let after: usize = units[k + 1..].iter().map(|u| u.1).sum();
            let kept: usize = units[..=k].iter().map(|u| u.5).sum();
            plan.resharded_window = plan.resharded_window.max(window + before);
            plan.resharded_backward = plan.resharded_backward.max(after + window + before + kept);
        }
        plans.push(plan);
    }
    Ok(plans)
}

/// The bytes of a parameter (`gathered` bytes in its in-use layout) that a unit resharding to
/// a group (checked by the caller) smaller than the FSDP dim (`n` ranks, this rank at `at`)
/// keeps from its forward: its slice over the group (a parameter left replicated on the FSDP
/// dim keeps its gathered copy when that is a cast, nothing when it is the parameter itself).
fn kept(p: &ParamSpec, stored: Option<Placement>, gathered: usize, n: usize, at: usize) -> usize {
    let Some(group) = p.reshard_group.filter(|&g| g != n) else { return 0 };
    let d = match stored {
        Some(Placement::Shard(d)) => usize::try_from(d).ok(),
        _ => None,
    };
    match d {
        Some(d) if p.shape[d] > 0 => gathered / p.shape[d] * chunk_size_and_offset(p.shape[d], group, at % group).0,
        Some(_) => 0,
        None if p.gathered_dtype.is_some() => gathered,
        None => 0,
    }
}
