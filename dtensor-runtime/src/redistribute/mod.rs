//! Redistribution: planning a layout change as per-mesh-dim steps, and executing them.
//!
//! The planner (`plan.rs`) searches the cheapest sequence of single-mesh-dim steps (Dijkstra
//! over placement states, cost = bytes sent; ties → fewer collectives, then fewer steps). A step is
//! legal only where it keeps nested sharding correct: mesh dim `i` may split or gather tensor
//! dim `d` only when no inner mesh dim (`j > i`) currently shards `d`, so `(S(0), S(0))` is
//! undone inner-first. Direct collectives (Shard→Shard as all-to-all, Partial→Shard as
//! reduce-scatter) are found whenever they are legal, since they move far fewer bytes than
//! all-gather + chunk. On a mesh dim of one rank every step is local (no collective, as in
//! PyTorch).
//!
//! Each step is a `Transition` (`transition.rs`), which alone knows its legality, collective,
//! bytes, wire bytes and how it runs; the planner, the plan's costs and the executor
//! (`execute.rs`, [`redistribute_local`]) read it.

mod execute;
mod plan;
mod transition;

pub use execute::redistribute_local;

use crate::comm::debug::{op_scope, CollectiveKind};
use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::layout::level_shape;
use crate::mesh::DeviceMesh;
use crate::placement::{fmt_placements, normalize_placements, Placement};
use crate::shape::checked_numel;
use plan::{cached_path, padded_level};
use std::fmt;

/// One step of a redistribution: mesh dim `mesh_dim` goes from `from` to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedistributeStep {
    /// Mesh dimension the step runs over.
    pub mesh_dim: usize,
    /// Placement on `mesh_dim` before the step.
    pub from: Placement,
    /// Placement on `mesh_dim` after the step.
    pub to: Placement,
    /// The tensor's shape as this mesh dim sees it on this rank: the local shape if this mesh
    /// dim were Replicate (the global shape split by every other mesh dim's sharding).
    pub logical_shape: Vec<usize>,
    /// The collective it needs (`None`: local, as every step on a mesh dim of one rank is).
    pub collective: Option<CollectiveKind>,
    /// Bytes this rank hands to that collective: its whole shard (uneven shards travel
    /// unpadded, through the variable-size collectives), as `CommDebugMode` records them. On
    /// device storage uneven shards are padded to equal blocks first, and recorded padded.
    pub bytes: usize,
    /// Bytes this rank moves over the wire under the ring model the planner minimises
    /// (all-gather / reduce-scatter: `(n-1)` chunks; all-reduce: twice that; all-to-all:
    /// `(n-1)` blocks), with padded chunk sizes, so it is the same on every rank.
    pub wire_bytes: usize,
}

impl RedistributeStep {
    /// Whether this step issues a collective on a mesh dim of more than one rank (on a mesh
    /// dim of one rank every step is local). Ops' strategy searches break their ties with it,
    /// so that they choose on one rank what they choose on many (and what the typed rules say).
    pub fn communicates_on_a_larger_group(&self) -> bool {
        transition::Transition::of(self.from, self.to).and_then(|t| t.collective()).is_some()
    }
}

impl fmt::Display for RedistributeStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = self.collective.map(|c| c.to_string()).unwrap_or_else(|| "local".into());
        write!(f, "mesh dim {}: {} -> {} ({what}, {} B)", self.mesh_dim, self.from, self.to, self.bytes)
    }
}

/// The inspectable plan of a redistribution (see [`plan_redistribute`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RedistributePlan {
    /// Steps in execution order; empty when the placements already match.
    pub steps: Vec<RedistributeStep>,
}

impl RedistributePlan {
    /// Total bytes this rank hands to collectives (what `CommDebugMode` records).
    pub fn bytes(&self) -> usize {
        self.steps.iter().map(|s| s.bytes).sum()
    }
    /// Total wire bytes under the ring model (the planner's cost; identical on every rank).
    pub fn wire_bytes(&self) -> usize {
        self.steps.iter().map(|s| s.wire_bytes).sum()
    }
    /// Number of steps that communicate.
    pub fn num_collectives(&self) -> usize {
        self.steps.iter().filter(|s| s.collective.is_some()).count()
    }
}

impl fmt::Display for RedistributePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.steps.is_empty() {
            return f.write_str("(no-op)");
        }
        for (i, s) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

/// Plans the redistribution of a tensor of `global_shape` on `mesh` from `from` to `to`,
/// as seen by this rank (logical shapes depend on the coordinate when sharding is uneven).
///
/// ```
/// use dtensor_runtime::{run, plan_redistribute, Shard, Replicate, CollectiveKind};
/// run(4, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
///     // nested sharding: only the inner split is undone
///     let plan = plan_redistribute::<f32>(&[8, 8], &mesh, &[Shard(0), Shard(0)], &[Shard(0), Replicate])?;
///     let steps: Vec<_> = plan.steps.iter().map(|s| (s.mesh_dim, s.collective)).collect();
///     assert_eq!(steps, vec![(1, Some(CollectiveKind::AllGather))]);
///     // Shard(0) -> Shard(1) is one all-to-all, not an all-gather and a chunk
///     let plan = plan_redistribute::<f32>(&[8, 8], &mesh, &[Replicate, Shard(0)], &[Replicate, Shard(1)])?;
///     assert_eq!(plan.steps[0].collective, Some(CollectiveKind::AllToAll));
///     println!("{plan}"); // mesh dim 1: S(0) -> S(1) (all_to_all, 128 B)
///     Ok(())
/// }).unwrap();
/// ```
pub fn plan_redistribute<T: Scalar>(
    global_shape: &[usize],
    mesh: &DeviceMesh,
    from: &[Placement],
    to: &[Placement],
) -> Result<RedistributePlan> {
    plan_redistribute_at::<T>(global_shape, mesh, mesh.coordinate(), from, to)
}

/// [`plan_redistribute`] as seen from mesh coordinate `coord` instead of this rank's.
///
/// The steps depend only on the placements; shapes and bytes depend on the coordinate when
/// sharding is uneven. The wire bytes, collectives and steps an op's strategy search costs
/// do not, so every rank picks the same strategy from its own plans.
pub fn plan_redistribute_at<T: Scalar>(
    global_shape: &[usize],
    mesh: &DeviceMesh,
    coord: &[usize],
    from: &[Placement],
    to: &[Placement],
) -> Result<RedistributePlan> {
    const CONTEXT: &str = "plan_redistribute";
    checked_numel(CONTEXT, global_shape)?;
    let ndim = global_shape.len();
    let from = normalize_placements(from, ndim, mesh.ndim())?;
    let to = normalize_placements(to, ndim, mesh.ndim())?;
    for i in 0..mesh.ndim() {
        transition::check_target(i, from[i], to[i])?;
    }
    let path = cached_path(global_shape, mesh.shape(), &from, &to);
    if path.is_empty() && from != to {
        // Unreachable for targets that pass `check_target` (everything goes through
        // Replicate); kept as an error rather than a wrong layout.
        let i = (0..from.len()).find(|&i| from[i] != to[i]).unwrap_or(0);
        return Err(Error::InvalidRedistribute {
            mesh_dim: i,
            from: from[i],
            to: to[i],
            reason: format!("no plan from {} to {}", fmt_placements(&from), fmt_placements(&to)),
        });
    }
    let elem = std::mem::size_of::<T>();
    let mut cur = from;
    let mut steps = Vec::with_capacity(path.len());
    for (i, target, t) in path {
        let shape = level_shape(global_shape, mesh.shape(), coord, &cur, i);
        let overflow = || Error::ShapeOverflow { context: format!("{CONTEXT}: bytes moved"), shape: shape.clone() };
        let n = mesh.size(i);
        let bytes = t.sent_elems(&shape, n, coord[i]).and_then(|e| e.checked_mul(elem)).ok_or_else(overflow)?;
        let wire_bytes = t
            .wire_elems(&padded_level(global_shape, mesh.shape(), &cur, i), n)
            .and_then(|w| w.checked_mul(elem))
            .ok_or_else(overflow)?;
        steps.push(RedistributeStep {
            mesh_dim: i,
            from: cur[i],
            to: target,
            logical_shape: shape,
            collective: t.collective(),
            bytes,
            wire_bytes,
        });
        cur[i] = target;
    }
    Ok(RedistributePlan { steps })
}

impl<T: Scalar> DTensor<T> {
    /// Plan of `self.redistribute(to)` on this rank.
    pub fn plan_redistribute(&self, to: &[Placement]) -> Result<RedistributePlan> {
        plan_redistribute::<T>(&self.shape, &self.mesh, &self.placements, to)
    }

    /// Changes the layout (PyTorch `redistribute`), running the collectives the plan needs.
    ///
    /// A target `Partial` is allowed from `Replicate`, from the same `Partial`, and, as in
    /// PyTorch 2.15, `Shard → Partial(sum)` (each rank keeps its shard in place and zeros
    /// elsewhere, no communication); `Shard → Partial(avg|max|min|product)` and changing a
    /// Partial's reduce op are errors.
    pub fn redistribute(&self, to: &[Placement]) -> Result<DTensor<T>> {
        crate::autograd::redistribute_recorded(self, to, "redistribute")
    }

    /// Redistribution without autograd bookkeeping whose collectives are attributed to `label`
    /// (the op that needed it).
    pub(crate) fn redistribute_scoped(&self, to: &[Placement], label: &'static str) -> Result<DTensor<T>> {
        self.redistribute_planned(&self.plan_redistribute(to)?, label)
    }

    /// [`DTensor::redistribute_scoped`] with the plan already made (for this rank, from
    /// `self`'s placements): the op dispatcher plans a chosen redistribution once.
    pub(crate) fn redistribute_planned(&self, plan: &RedistributePlan, label: &'static str) -> Result<DTensor<T>> {
        let mut cur = self.placements.clone();
        for step in &plan.steps {
            cur[step.mesh_dim] = step.to;
        }
        let local = op_scope(label, || redistribute_local(&self.local, &self.mesh, plan))?;
        Ok(DTensor::new_unchecked(local, self.mesh.clone(), cur, self.shape.clone(), None))
    }
}
