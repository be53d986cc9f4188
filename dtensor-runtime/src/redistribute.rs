//! Redistribution: planning a layout change as per-mesh-dim steps, and executing them.
//!
//! The planner searches the cheapest sequence of single-mesh-dim steps (Dijkstra over
//! placement states, cost = bytes sent; ties → fewer steps). A step is legal only where it
//! keeps nested sharding correct: mesh dim `i` may split or gather tensor dim `d` only when no
//! inner mesh dim (`j > i`) currently shards `d`, so `(S(0), S(0))` is undone inner-first.
//! Direct collectives (Shard→Shard as all-to-all, Partial→Shard as reduce-scatter) are
//! found whenever they are legal, since they move far fewer bytes than all-gather + chunk.

use crate::comm::debug::{op_scope, CollectiveKind};
use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::layout::pack::{self, with_dim, PackPlan};
use crate::layout::{chunk_size_and_offset, level_shape, padded_chunk};
use crate::mesh::storage as comm_storage;
use crate::mesh::DeviceMesh;
use crate::placement::{fmt_placements, normalize_placements, Placement, ReduceOp};
use crate::shape::checked_numel;
use crate::storage::Storage;
use crate::Along;
use std::borrow::Cow;
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
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
    /// The collective it needs (`None`: local).
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

fn check_transition(mesh_dim: usize, from: Placement, to: Placement) -> Result<()> {
    let bad = |reason: &str| Err(Error::InvalidRedistribute { mesh_dim, from, to, reason: reason.into() });
    match crate::placement::transition_error(from, to) {
        Some(reason) => bad(reason),
        None => Ok(()),
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
        check_transition(i, from[i], to[i])?;
    }
    let path = cached_path(global_shape, mesh.shape(), &from, &to);
    if path.is_empty() && from != to {
        // Unreachable for targets that pass `check_transition` (everything goes through
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
    for (i, target) in path {
        let shape = level_shape(global_shape, mesh.shape(), coord, &cur, i);
        let overflow = || Error::ShapeOverflow { context: format!("{CONTEXT}: bytes moved"), shape: shape.clone() };
        let (collective, elems) = step_cost(&shape, mesh.size(i), coord[i], cur[i], target).ok_or_else(overflow)?;
        let bytes = elems.checked_mul(elem).ok_or_else(overflow)?;
        let wire_bytes = wire_cost(&padded_level(global_shape, mesh.shape(), &cur, i), mesh.size(i), cur[i], target)
            .and_then(|w| w.checked_mul(elem))
            .ok_or_else(overflow)?;
        steps.push(RedistributeStep {
            mesh_dim: i,
            from: cur[i],
            to: target,
            logical_shape: shape,
            collective,
            bytes,
            wire_bytes,
        });
        cur[i] = target;
    }
    Ok(RedistributePlan { steps })
}

type PathKey = (Vec<usize>, Vec<usize>, Vec<Placement>, Vec<Placement>);

thread_local! {
    static PATHS: RefCell<HashMap<PathKey, Vec<(usize, Placement)>>> = RefCell::new(HashMap::new());
}

/// [`search_path`] behind a per-thread cache (ops cost candidate strategies with plans).
fn cached_path(shape: &[usize], mesh: &[usize], from: &[Placement], to: &[Placement]) -> Vec<(usize, Placement)> {
    let key = (shape.to_vec(), mesh.to_vec(), from.to_vec(), to.to_vec());
    if let Some(p) = PATHS.with(|c| c.borrow().get(&key).cloned()) {
        return p;
    }
    let path = search_path(shape, mesh, from, to);
    PATHS.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() > 4096 {
            c.clear();
        }
        c.insert(key, path.clone());
    });
    path
}

/// No mesh dim after `i` currently shards tensor dim `d` (so mesh dim `i` may split or
/// gather `d`: nested shardings nest left to right).
fn inner_free(x: &[Placement], i: usize, d: usize) -> bool {
    x[i + 1..].iter().all(|p| !p.is_shard_on(d))
}

/// Is changing mesh dim `i` of state `x` to `to` one legal direct step?
fn legal_step(x: &[Placement], i: usize, to: Placement, dst: &[Placement]) -> bool {
    match (x[i], to) {
        (Placement::Shard(d), Placement::Replicate) => inner_free(x, i, d as usize),
        (Placement::Replicate, Placement::Shard(d)) | (Placement::Partial(_), Placement::Shard(d)) => {
            inner_free(x, i, d as usize)
        }
        (Placement::Shard(d), Placement::Shard(e)) => {
            d != e && inner_free(x, i, d as usize) && inner_free(x, i, e as usize)
        }
        (Placement::Partial(_), Placement::Replicate) => true,
        // Only the Partial the target asks for is ever introduced.
        (Placement::Replicate, p @ Placement::Partial(_)) => p == dst[i],
        (Placement::Shard(d), p @ Placement::Partial(ReduceOp::Sum)) => p == dst[i] && inner_free(x, i, d as usize),
        _ => false,
    }
}

/// Cheapest sequence of legal single-mesh-dim steps from `src` to `dst` (Dijkstra over
/// placement states; cost = bytes sent, ties broken by fewer steps).
///
/// Costs use padded (ceil) chunk sizes, which do not depend on the rank's coordinate: every
/// rank must choose the same plan, or their collectives would not match.
fn search_path(shape: &[usize], mesh: &[usize], src: &[Placement], dst: &[Placement]) -> Vec<(usize, Placement)> {
    if src == dst {
        return Vec::new();
    }
    let m = mesh.len();
    let mut options: Vec<Vec<Placement>> = Vec::with_capacity(m);
    for i in 0..m {
        let mut o: Vec<Placement> = std::iter::once(Placement::Replicate)
            .chain((0..shape.len()).map(|d| Placement::Shard(d as isize)))
            .collect();
        for p in [src[i], dst[i]] {
            if p.is_partial() && !o.contains(&p) {
                o.push(p);
            }
        }
        options.push(o);
    }
    // Cost: (wire elements, collectives, steps), compared lexicographically.
    type Cost = (usize, usize, usize);
    let mut best: HashMap<Vec<Placement>, Cost> = HashMap::new();
    let mut prev: HashMap<Vec<Placement>, (Vec<Placement>, usize, Placement)> = HashMap::new();
    let mut heap = BinaryHeap::new();
    best.insert(src.to_vec(), (0, 0, 0));
    heap.push(Reverse(((0usize, 0usize, 0usize), src.to_vec())));
    while let Some(Reverse((cost, x))) = heap.pop() {
        if x == dst {
            break;
        }
        if best.get(&x).is_some_and(|&b| b < cost) {
            continue;
        }
        for i in 0..m {
            for &p in &options[i] {
                if p == x[i] || !legal_step(&x, i, p, dst) {
                    continue;
                }
                // An overflowing cost ranks last (the plan built from the path reports it).
                let wire = wire_cost(&padded_level(shape, mesh, &x, i), mesh[i], x[i], p).unwrap_or(usize::MAX);
                let communicates = collective_of(x[i], p).is_some() as usize;
                let mut y = x.clone();
                y[i] = p;
                let next = (cost.0.saturating_add(wire), cost.1 + communicates, cost.2 + 1);
                if best.get(&y).is_none_or(|&b| next < b) {
                    best.insert(y.clone(), next);
                    prev.insert(y.clone(), (x.clone(), i, p));
                    heap.push(Reverse((next, y)));
                }
            }
        }
    }
    let mut path = Vec::new();
    let mut x = dst.to_vec();
    while let Some((p, i, to)) = prev.get(&x) {
        path.push((*i, *to));
        x = p.clone();
        if x == src {
            break;
        }
    }
    path.reverse();
    path
}

/// [`level_shape`] with padded (ceil) chunks: the same on every rank.
fn padded_level(shape: &[usize], mesh: &[usize], x: &[Placement], i: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    for (j, p) in x.iter().enumerate().filter(|&(j, _)| j != i) {
        if let Some(d) = p.shard_dim() {
            s[d] = padded_chunk(s[d], mesh[j]);
        }
    }
    s
}

/// Elements a rank moves over the wire in one step under the ring model the planner
/// optimises: all-gather and reduce-scatter move `(n-1)` chunks, all-to-all `(n-1)` blocks,
/// all-reduce twice as much as either (it is a reduce-scatter plus an all-gather). `None`
/// when the count overflows (padding can push it past a huge tensor's element count).
fn wire_cost(shape: &[usize], n: usize, from: Placement, to: Placement) -> Option<usize> {
    let numel = checked_numel("", shape).ok()?;
    let rows_other = |d: usize| numel.checked_div(shape[d]).unwrap_or(0);
    let hops = n - 1;
    match (from, to) {
        (Placement::Shard(d), Placement::Replicate) | (Placement::Partial(_), Placement::Shard(d)) => {
            let d = d as usize;
            hops.checked_mul(padded_chunk(shape[d], n))?.checked_mul(rows_other(d))
        }
        (Placement::Shard(d), Placement::Shard(e)) if d != e => {
            let (d, e) = (d as usize, e as usize);
            let other = rows_other(d).checked_div(shape[e]).unwrap_or(0);
            hops.checked_mul(padded_chunk(shape[d], n))?.checked_mul(padded_chunk(shape[e], n))?.checked_mul(other)
        }
        (Placement::Partial(_), Placement::Replicate) => hops.checked_mul(padded_chunk(numel, n))?.checked_mul(2),
        _ => Some(0),
    }
}

/// (collective, elements this rank hands to it) of one step, for member `k` of `n`: its
/// whole shard, as the host collectives take it (uneven shards through the variable-size
/// collectives, unpadded); what `CommDebugMode` records (times the element size). `None` when
/// the count overflows.
fn step_cost(
    shape: &[usize],
    n: usize,
    k: usize,
    from: Placement,
    to: Placement,
) -> Option<(Option<CollectiveKind>, usize)> {
    let numel = checked_numel("", shape).ok()?;
    let rows_other = |d: usize| numel.checked_div(shape[d]).unwrap_or(0);
    let kind = collective_of(from, to);
    let elems = match (from, to) {
        (Placement::Shard(d), Placement::Replicate) | (Placement::Shard(d), Placement::Shard(_)) if kind.is_some() => {
            chunk_size_and_offset(shape[d as usize], n, k).0.checked_mul(rows_other(d as usize))
        }
        (Placement::Partial(_), Placement::Replicate | Placement::Shard(_)) => Some(numel),
        _ => Some(0),
    };
    Some((kind, elems?))
}

/// The collective a direct step needs (`None`: local).
fn collective_of(from: Placement, to: Placement) -> Option<CollectiveKind> {
    match (from, to) {
        (Placement::Shard(_), Placement::Replicate) => Some(CollectiveKind::AllGather),
        (Placement::Shard(d), Placement::Shard(e)) if d != e => Some(CollectiveKind::AllToAll),
        (Placement::Partial(_), Placement::Replicate) => Some(CollectiveKind::AllReduce),
        (Placement::Partial(_), Placement::Shard(_)) => Some(CollectiveKind::ReduceScatter),
        _ => None,
    }
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

/// Executes a redistribution plan (made for this rank: see [`plan_redistribute`]) on this
/// rank's local shard: the collectives each step needs and their pack/unpack copies. A pure
/// function of (shard, mesh, plan); the autograd wrapper is [`DTensor::redistribute`].
pub fn redistribute_local<T: Scalar>(
    local: &Storage<T>,
    mesh: &DeviceMesh,
    plan: &RedistributePlan,
) -> Result<Storage<T>> {
    // The first step reads the caller's shard in place; later steps own their input.
    let mut cur = Cow::Borrowed(local);
    for step in &plan.steps {
        cur = Cow::Owned(execute_step(mesh, cur, step)?);
    }
    Ok(cur.into_owned())
}

/// The storage a plan produces from `src`, borrowing `src` when the plan is the identity
/// (collectives read it as a flat buffer either way).
fn pack_or_borrow<'a, T: Scalar>(src: &'a Storage<T>, plan: &PackPlan) -> Result<Cow<'a, Storage<T>>> {
    if plan.is_identity() {
        Ok(Cow::Borrowed(src))
    } else {
        src.pack(plan).map(Cow::Owned)
    }
}

/// Runs one step on this rank's local shard.
fn execute_step<T: Scalar>(
    mesh: &DeviceMesh,
    local: Cow<'_, Storage<T>>,
    step: &RedistributeStep,
) -> Result<Storage<T>> {
    let i = step.mesh_dim;
    let n = mesh.size(i);
    let k = mesh.coordinate()[i];
    let shape = &step.logical_shape;
    let along = Along::Dim(i);
    let mine = local.shape().to_vec();
    Ok(match (step.from, step.to) {
        (a, b) if a == b => local.into_owned(),
        (Placement::Shard(d), Placement::Replicate) if uneven_on_host(&local, shape[d as usize], n) => {
            // Every member's shard as it is (no padding), joined along `d`: no copy at all
            // when only size-1 dims precede `d`.
            let d = d as usize;
            let counts = chunk_numels(&mine, d, shape[d], n);
            let recv = comm_storage::all_gather_v(mesh, along, &local, &counts)?;
            recv.into_packed(&pack::join_v(&with_dim(&mine, d, shape[d]), d, n))?
        }
        (Placement::Shard(d), Placement::Replicate) => {
            // Pad our rows of `d` to the common chunk, gather, drop every member's padding.
            let d = d as usize;
            let block = with_dim(&mine, d, padded_chunk(shape[d], n));
            let send = pack_or_borrow(&local, &pack::split(&mine, d, 1, &block))?;
            let recv = comm_storage::all_gather(mesh, along, &send)?;
            recv.into_packed(&pack::join(&block, n, d, &with_dim(&mine, d, shape[d])))?
        }
        (Placement::Partial(op), Placement::Replicate) => match local {
            // In place on a buffer this plan owns; else straight into a fresh one (no copy first).
            Cow::Owned(buf) => comm_storage::all_reduce(mesh, along, buf, op)?,
            Cow::Borrowed(src) => comm_storage::all_reduce_into(mesh, along, src, op)?,
        },
        (Placement::Partial(op), Placement::Shard(d)) if uneven_on_host(&local, shape[d as usize], n) => {
            // Member j's rows of `d` go to block j, unpadded (in place when only size-1 dims
            // precede `d`); our reduced block is our shard as it lies.
            let d = d as usize;
            let counts = chunk_numels(&mine, d, shape[d], n);
            let send = pack_or_borrow(&local, &pack::split_v(&mine, d, n))?;
            let recv = comm_storage::reduce_scatter_v(mesh, along, &send, &counts, op)?;
            let sz = chunk_size_and_offset(shape[d], n, k).0;
            recv.into_reshape(&with_dim(&mine, d, sz))?
        }
        (Placement::Partial(op), Placement::Shard(d)) => {
            // Member j's rows of `d` go to block j (padded); our reduced block loses its padding.
            let d = d as usize;
            let block = with_dim(&mine, d, padded_chunk(shape[d], n));
            let send = pack_or_borrow(&local, &pack::split(&mine, d, n, &block))?;
            let recv = comm_storage::reduce_scatter(mesh, along, &send, op)?;
            let sz = chunk_size_and_offset(shape[d], n, k).0;
            recv.into_packed(&pack::join(&block, 1, d, &with_dim(&mine, d, sz)))?
        }
        (Placement::Replicate, Placement::Shard(d)) => {
            let d = d as usize;
            let (sz, off) = chunk_size_and_offset(shape[d], n, k);
            local.slice(&with_dim(&vec![0; mine.len()], d, off), &with_dim(&mine, d, sz))?
        }
        (Placement::Shard(d), Placement::Shard(e))
            if uneven_on_host(&local, shape[d as usize], n) || uneven_on_host(&local, shape[e as usize], n) =>
        {
            // Our shard is rows (the dims before `e`) of one run per member (its chunk of `e`
            // times the dims after `e`), sent as it lies, unpadded; from member i we receive
            // our chunk of `e` of its rows of `d`, which join along `d` (no copy when only
            // size-1 dims precede `d`).
            let (d, e) = (d as usize, e as usize);
            let rows = mine[..e].iter().product();
            let inner: usize = mine[e + 1..].iter().product();
            let runs: Vec<usize> = (0..n).map(|j| chunk_size_and_offset(shape[e], n, j).0 * inner).collect();
            let target = with_dim(&with_dim(&mine, d, shape[d]), e, chunk_size_and_offset(shape[e], n, k).0);
            let recv_counts = chunk_numels(&target, d, shape[d], n);
            let recv = comm_storage::all_to_all_v(mesh, along, &local, rows, &runs, &recv_counts)?;
            recv.into_packed(&pack::join_v(&target, d, n))?
        }
        (Placement::Shard(d), Placement::Shard(e)) => {
            // Block j: our rows of `d`, member j's chunk of `e`, padded to (cd, ce); what we
            // receive from member j is its rows of `d` of our chunk of `e`.
            let (d, e) = (d as usize, e as usize);
            let block = with_dim(&with_dim(&mine, d, padded_chunk(shape[d], n)), e, padded_chunk(shape[e], n));
            let even = shape[d].is_multiple_of(n) && shape[e].is_multiple_of(n);
            let recv = if even && local.as_cpu().is_some() {
                // Even on both dims, on the host (the same verdict on every member: they share
                // the mesh's device): block j is run j of every row over the dims before `e`,
                // sent as it lies, without packing. Device shards pack on the device instead,
                // so that the all-to-all moves device buffers.
                let rows = mine[..e].iter().product();
                let run = block[e..].iter().product();
                comm_storage::all_to_all_strided(mesh, along, &local, rows, run)?
            } else {
                let send = pack_or_borrow(&local, &pack::split(&mine, e, n, &block))?;
                comm_storage::all_to_all(mesh, along, &send)?
            };
            let my_e = chunk_size_and_offset(shape[e], n, k).0;
            recv.into_packed(&pack::join(&block, n, d, &with_dim(&with_dim(&mine, d, shape[d]), e, my_e)))?
        }
        (Placement::Replicate, Placement::Partial(op)) => replicate_to_partial(local, op, k)?,
        (Placement::Shard(d), Placement::Partial(ReduceOp::Sum)) => {
            // Our rows of `d` in place in a zero tensor of the full extent of `d`.
            let d = d as usize;
            let off = chunk_size_and_offset(shape[d], n, k).1;
            local.pack(&pack::pad(&mine, &with_dim(&mine, d, shape[d]), &with_dim(&vec![0; mine.len()], d, off)))?
        }
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

/// Does a split of `extent` over `n` members leave uneven chunks, on host storage? Those take
/// the variable-size collectives, which move every shard as it is; device shards are padded to
/// equal blocks on the device instead (the verdict is the same on every member: they share
/// the mesh's device).
fn uneven_on_host<T: Scalar>(local: &Storage<T>, extent: usize, n: usize) -> bool {
    !extent.is_multiple_of(n) && local.as_cpu().is_some()
}

/// Elements of every member's chunk of `extent` along `d` (torch.chunk sizes), the other dims
/// as in `like`.
fn chunk_numels(like: &[usize], d: usize, extent: usize, n: usize) -> Vec<usize> {
    let rest: usize = like.iter().enumerate().filter(|&(i, _)| i != d).map(|(_, &s)| s).product();
    (0..n).map(|j| chunk_size_and_offset(extent, n, j).0 * rest).collect()
}

/// Replicate → Partial: the logical value must stay the same after the reduction, so only
/// the first member keeps the data (sum) or every member does (avg, min, max).
fn replicate_to_partial<T: Scalar>(local: Cow<'_, Storage<T>>, op: ReduceOp, coord: usize) -> Result<Storage<T>> {
    match op {
        ReduceOp::Sum if coord != 0 => local.new_full(local.shape(), T::zero()),
        ReduceOp::Product if coord != 0 => local.new_full(local.shape(), T::one()),
        _ => Ok(local.into_owned()),
    }
}
