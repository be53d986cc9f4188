//! Redistribution: planning a layout change as per-mesh-dim steps, and executing them.
//!
//! The planner undoes mesh dims inner-first (last mesh dim first) where they must change,
//! taking the direct collective when it is legal at that point (Shard→Shard as all-to-all,
//! Partial→Shard as reduce-scatter, which move far fewer bytes than all-gather + chunk), then
//! redoes the remaining Replicate→Shard / Replicate→Partial steps outer-first, which are local.
//! This keeps nested sharding (`(S(0), S(0))`) correct: an inner split is never left in
//! place while an outer one changes.

use crate::comm::debug::{op_scope, CollectiveKind};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::layout::{chunk_size_and_offset, level_shape, padded_chunk};
use crate::mesh::DeviceMesh;
use crate::placement::{fmt_placements, normalize_placements, Placement, ReduceOp};
use crate::Along;
use ndarray::{ArrayD, Axis, IxDyn, Slice};
use std::fmt;

/// One step of a redistribution: mesh dim `mesh_dim` goes from `from` to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedistributeStep {
    /// Mesh dimension the step runs over.
    pub mesh_dim: usize,
    pub from: Placement,
    pub to: Placement,
    /// The tensor's shape as this mesh dim sees it on this rank (global shape split by the
    /// outer mesh dims' shardings at that point).
    pub logical_shape: Vec<usize>,
    /// The collective it needs (`None`: local).
    pub collective: Option<CollectiveKind>,
    /// Bytes this rank sends in that collective (padded), for `size_of::<T>() == elem_bytes`.
    pub bytes: usize,
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
    pub steps: Vec<RedistributeStep>,
}

impl RedistributePlan {
    /// Total bytes this rank sends.
    pub fn bytes(&self) -> usize {
        self.steps.iter().map(|s| s.bytes).sum()
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

fn check_transition(mesh_dim: usize, from: Placement, to: Placement) -> Result<()> {
    let bad = |reason: &str| Err(Error::InvalidRedistribute { mesh_dim, from, to, reason: reason.into() });
    match (from, to) {
        (Placement::Shard(_), Placement::Partial(_)) => {
            bad("Shard -> Partial is not a forward redistribution; go through Replicate if you really mean it")
        }
        (Placement::Partial(a), Placement::Partial(b)) if a != b => {
            bad("a Partial cannot change its reduce op; redistribute to Replicate first")
        }
        _ => Ok(()),
    }
}

/// Plans the redistribution of a tensor of `global_shape` on `mesh` from `from` to `to`,
/// as seen by this rank (logical shapes depend on the coordinate when sharding is uneven).
///
/// ```
/// use dtensor_runtime::{run, plan_redistribute, Shard, Replicate, CollectiveKind};
/// run(4, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
///     // nested sharding is undone inner-first
///     let plan = plan_redistribute::<f32>(&[8, 8], &mesh, &[Shard(0), Shard(0)], &[Replicate, Shard(0)])?;
///     let dims: Vec<_> = plan.steps.iter().map(|s| (s.mesh_dim, s.collective)).collect();
///     assert_eq!(dims, vec![(1, Some(CollectiveKind::AllGather)), (0, Some(CollectiveKind::AllGather)), (1, None)]);
///     Ok(())
/// }).unwrap();
/// ```
pub fn plan_redistribute<T: Element>(
    global_shape: &[usize],
    mesh: &DeviceMesh,
    from: &[Placement],
    to: &[Placement],
) -> Result<RedistributePlan> {
    let ndim = global_shape.len();
    let from = normalize_placements(from, ndim, mesh.ndim())?;
    let to = normalize_placements(to, ndim, mesh.ndim())?;
    for i in 0..mesh.ndim() {
        check_transition(i, from[i], to[i])?;
    }
    let n = mesh.ndim();
    let mut cur = from.clone();
    // Mesh dims that must be redone: those that change, closed under nesting (if mesh dim i
    // touches tensor dim d, every inner mesh dim sharding d must be undone too).
    let mut undo: Vec<bool> = (0..n).map(|i| from[i] != to[i]).collect();
    loop {
        let mut changed = false;
        for i in 0..n {
            if !undo[i] {
                continue;
            }
            for d in [from[i].shard_dim(), to[i].shard_dim()].into_iter().flatten() {
                for j in i + 1..n {
                    if !undo[j] && from[j].is_shard_on(d) {
                        undo[j] = true;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    let elem = std::mem::size_of::<T>();
    let mut steps = Vec::new();
    let mut push = |cur: &mut Vec<Placement>, i: usize, target: Placement| {
        let shape = level_shape(global_shape, mesh.shape(), mesh.coordinate(), cur, i);
        let (collective, bytes) = step_cost(&shape, mesh.size(i), cur[i], target, elem);
        steps.push(RedistributeStep { mesh_dim: i, from: cur[i], to: target, logical_shape: shape, collective, bytes });
        cur[i] = target;
    };
    // Can mesh dim i introduce a shard of tensor dim e now without breaking nesting?
    let shard_ok = |cur: &[Placement], pending: &[bool], i: usize, e: usize| {
        (0..n).all(|j| {
            if j > i {
                !cur[j].is_shard_on(e)
            } else if j < i && pending[j] {
                !cur[j].is_shard_on(e) && !to[j].is_shard_on(e)
            } else {
                true
            }
        })
    };
    // Undo, inner-first.
    let mut pending = undo.clone();
    for i in (0..n).rev() {
        if !undo[i] {
            continue;
        }
        pending[i] = false;
        match (cur[i], to[i]) {
            (Placement::Shard(d), Placement::Shard(e)) if d != e => {
                let (d, e) = (d as usize, e as usize);
                let inner_free = (i + 1..n).all(|j| !cur[j].is_shard_on(d));
                if inner_free && shard_ok(&cur, &pending, i, e) {
                    push(&mut cur, i, to[i]);
                } else {
                    push(&mut cur, i, Placement::Replicate);
                }
            }
            (Placement::Partial(_), Placement::Shard(e)) if shard_ok(&cur, &pending, i, e as usize) => {
                push(&mut cur, i, to[i]);
            }
            (Placement::Shard(_), _) | (Placement::Partial(_), Placement::Replicate | Placement::Shard(_)) => {
                push(&mut cur, i, Placement::Replicate);
            }
            _ => {}
        }
        // Pending dims that only needed to be undone are now Replicate or final.
        if cur[i] == to[i] {
            undo[i] = false;
        }
    }
    // Redo, outer-first: only local steps are left.
    for i in 0..n {
        if cur[i] != to[i] {
            debug_assert!(cur[i].is_replicate() || cur[i] == to[i], "planner left {} on mesh dim {i}", cur[i]);
            push(&mut cur, i, to[i]);
        }
    }
    Ok(RedistributePlan { steps })
}

/// (collective, bytes sent by this rank) of one step.
fn step_cost(
    shape: &[usize],
    n: usize,
    from: Placement,
    to: Placement,
    elem: usize,
) -> (Option<CollectiveKind>, usize) {
    let numel: usize = shape.iter().product();
    let rows_other = |d: usize| numel.checked_div(shape[d]).unwrap_or(0);
    match (from, to) {
        (Placement::Shard(d), Placement::Replicate) => {
            let d = d as usize;
            (Some(CollectiveKind::AllGather), padded_chunk(shape[d], n) * rows_other(d) * elem)
        }
        (Placement::Shard(d), Placement::Shard(e)) if d != e => {
            let (d, e) = (d as usize, e as usize);
            let other = if shape[d] == 0 || shape[e] == 0 { 0 } else { numel / shape[d] / shape[e] };
            (Some(CollectiveKind::AllToAll), padded_chunk(shape[d], n) * padded_chunk(shape[e], n) * n * other * elem)
        }
        (Placement::Partial(_), Placement::Replicate) => (Some(CollectiveKind::AllReduce), numel * elem),
        (Placement::Partial(_), Placement::Shard(d)) => {
            let d = d as usize;
            (Some(CollectiveKind::ReduceScatter), padded_chunk(shape[d], n) * n * rows_other(d) * elem)
        }
        _ => (None, 0),
    }
}

impl<T: Element> DTensor<T> {
    /// Plan of `self.redistribute(to)` on this rank.
    pub fn plan_redistribute(&self, to: &[Placement]) -> Result<RedistributePlan> {
        plan_redistribute::<T>(&self.shape, &self.mesh, &self.placements, to)
    }

    /// Changes the layout (PyTorch `redistribute`), running the collectives the plan needs.
    ///
    /// A target `Partial` is allowed from `Replicate` or from the same `Partial`; `Shard →
    /// Partial` and changing a Partial's reduce op are errors.
    pub fn redistribute(&self, to: &[Placement]) -> Result<DTensor<T>> {
        crate::autograd::redistribute_with_grad(self, to)
    }

    /// Redistribution without autograd bookkeeping.
    pub(crate) fn redistribute_raw(&self, to: &[Placement]) -> Result<DTensor<T>> {
        let plan = self.plan_redistribute(to)?;
        let mut local = self.local.clone();
        let mut cur = self.placements.clone();
        op_scope("redistribute", || -> Result<()> {
            for step in &plan.steps {
                local = execute_step(&self.mesh, &local, step)?;
                cur[step.mesh_dim] = step.to;
            }
            Ok(())
        })?;
        Ok(DTensor::new_unchecked(local, self.mesh.clone(), cur, self.shape.clone(), None))
    }
}

/// Runs one step on this rank's local tensor.
pub(crate) fn execute_step<T: Element>(
    mesh: &DeviceMesh,
    local: &ArrayD<T>,
    step: &RedistributeStep,
) -> Result<ArrayD<T>> {
    let i = step.mesh_dim;
    let n = mesh.size(i);
    let k = mesh.coordinate()[i];
    let shape = &step.logical_shape;
    Ok(match (step.from, step.to) {
        (a, b) if a == b => local.clone(),
        (Placement::Shard(d), Placement::Replicate) => all_gather_dim(mesh, i, local, d as usize, shape[d as usize])?,
        (Placement::Partial(op), Placement::Replicate) => {
            let mut data = to_vec(local);
            mesh.all_reduce(Along::Dim(i), &mut data, op)?;
            from_vec(local.shape(), data)
        }
        (Placement::Partial(op), Placement::Shard(d)) => {
            reduce_scatter_dim(mesh, i, local, d as usize, shape[d as usize], op)?
        }
        (Placement::Replicate, Placement::Shard(d)) => {
            let d = d as usize;
            let (sz, off) = chunk_size_and_offset(shape[d], n, k);
            local.slice_axis(Axis(d), Slice::from(off..off + sz)).to_owned()
        }
        (Placement::Shard(d), Placement::Shard(e)) => all_to_all_dims(mesh, i, local, d as usize, e as usize, shape)?,
        (Placement::Replicate, Placement::Partial(op)) => replicate_to_partial(local, op, k),
        (from, to) => {
            return Err(Error::InvalidRedistribute {
                mesh_dim: i,
                from,
                to,
                reason: format!("no direct step (placements {})", fmt_placements(&[from, to])),
            })
        }
    })
}

/// Replicate → Partial: the logical value must stay the same after the reduction.
pub(crate) fn replicate_to_partial<T: Element>(local: &ArrayD<T>, op: ReduceOp, coord: usize) -> ArrayD<T> {
    match op {
        ReduceOp::Sum if coord != 0 => ArrayD::zeros(local.raw_dim()),
        ReduceOp::Product if coord != 0 => ArrayD::ones(local.raw_dim()),
        _ => local.clone(),
    }
}

fn to_vec<T: Element>(a: &ArrayD<T>) -> Vec<T> {
    match a.as_slice() {
        Some(s) => s.to_vec(),
        None => a.iter().copied().collect(),
    }
}

fn from_vec<T: Element>(shape: &[usize], v: Vec<T>) -> ArrayD<T> {
    ArrayD::from_shape_vec(IxDyn(shape), v).expect("collective returned the planned size")
}

/// Data of `a` with axis `d` moved to the front, row-major; returns (data, moved shape).
fn front<T: Element>(a: &ArrayD<T>, d: usize) -> (Vec<T>, Vec<usize>) {
    if d == 0 {
        return (to_vec(a), a.shape().to_vec());
    }
    let mut axes: Vec<usize> = vec![d];
    axes.extend((0..a.ndim()).filter(|&x| x != d));
    let v = a.view().permuted_axes(IxDyn(&axes));
    let shape = v.shape().to_vec();
    (v.iter().copied().collect(), shape)
}

/// Inverse of [`front`].
fn unfront<T: Element>(data: Vec<T>, front_shape: &[usize], d: usize) -> ArrayD<T> {
    let a = from_vec(front_shape, data);
    if d == 0 {
        return a;
    }
    // Axis 0 goes back to position d.
    let nd = front_shape.len();
    let mut axes = Vec::with_capacity(nd);
    for x in 0..nd {
        axes.push(match x {
            x if x < d => x + 1,
            x if x == d => 0,
            x => x,
        });
    }
    a.permuted_axes(IxDyn(&axes)).as_standard_layout().into_owned()
}

fn all_gather_dim<T: Element>(
    mesh: &DeviceMesh,
    i: usize,
    local: &ArrayD<T>,
    d: usize,
    full: usize,
) -> Result<ArrayD<T>> {
    let n = mesh.size(i);
    let c = padded_chunk(full, n);
    let (mut data, mut fshape) = front(local, d);
    let row: usize = fshape[1..].iter().product();
    data.resize(c * row, T::zero());
    let gathered = mesh.all_gather(Along::Dim(i), &data)?;
    let mut out = Vec::with_capacity(full * row);
    for j in 0..n {
        let sz = chunk_size_and_offset(full, n, j).0;
        out.extend_from_slice(&gathered[j * c * row..(j * c + sz) * row]);
    }
    fshape[0] = full;
    Ok(unfront(out, &fshape, d))
}

fn reduce_scatter_dim<T: Element>(
    mesh: &DeviceMesh,
    i: usize,
    local: &ArrayD<T>,
    d: usize,
    full: usize,
    op: ReduceOp,
) -> Result<ArrayD<T>> {
    let n = mesh.size(i);
    let k = mesh.coordinate()[i];
    let c = padded_chunk(full, n);
    let (data, mut fshape) = front(local, d);
    let row: usize = fshape[1..].iter().product();
    let mut send = vec![T::zero(); n * c * row];
    for j in 0..n {
        let (sz, off) = chunk_size_and_offset(full, n, j);
        send[j * c * row..(j * c + sz) * row].copy_from_slice(&data[off * row..(off + sz) * row]);
    }
    let mut mine = mesh.reduce_scatter(Along::Dim(i), &send, op)?;
    let sz = chunk_size_and_offset(full, n, k).0;
    mine.truncate(sz * row);
    fshape[0] = sz;
    Ok(unfront(mine, &fshape, d))
}

fn all_to_all_dims<T: Element>(
    mesh: &DeviceMesh,
    i: usize,
    local: &ArrayD<T>,
    d: usize,
    e: usize,
    shape: &[usize],
) -> Result<ArrayD<T>> {
    let n = mesh.size(i);
    let k = mesh.coordinate()[i];
    let (cd, ce) = (padded_chunk(shape[d], n), padded_chunk(shape[e], n));
    let mut block_shape = local.shape().to_vec();
    block_shape[d] = cd;
    block_shape[e] = ce;
    let block: usize = block_shape.iter().product();
    let mut send = Vec::with_capacity(block * n);
    let sd = local.shape()[d];
    for j in 0..n {
        let (sz, off) = chunk_size_and_offset(shape[e], n, j);
        let mut padded = ArrayD::<T>::zeros(IxDyn(&block_shape));
        padded
            .slice_axis_mut(Axis(d), Slice::from(0..sd))
            .slice_axis_mut(Axis(e), Slice::from(0..sz))
            .assign(&local.slice_axis(Axis(e), Slice::from(off..off + sz)));
        send.extend(padded.iter().copied());
    }
    let recv = mesh.all_to_all(Along::Dim(i), &send)?;
    let my_e = chunk_size_and_offset(shape[e], n, k).0;
    let mut parts = Vec::with_capacity(n);
    for j in 0..n {
        let b = from_vec(&block_shape, recv[j * block..(j + 1) * block].to_vec());
        let sz_d = chunk_size_and_offset(shape[d], n, j).0;
        parts.push(b.slice_axis(Axis(d), Slice::from(0..sz_d)).slice_axis(Axis(e), Slice::from(0..my_e)).to_owned());
    }
    let views: Vec<_> = parts.iter().map(|p| p.view()).collect();
    ndarray::concatenate(Axis(d), &views)
        .map_err(|err| Error::Backend { backend: "ndarray".into(), message: err.to_string() })
}
