//! Every placement transition one mesh dim can take in one step, said once: when the planner
//! may take it, the collective it needs, the bytes it hands to that collective and puts on the
//! wire, and how it runs on a local shard. The planner ([`super::plan`]), the plan builder (the
//! cost model, [`super::plan_redistribute_at`]) and the executor ([`super::execute`]) only read
//! it (PyTorch's `_redistribute.py` keeps the same knowledge on each placement type).

use crate::comm::debug::CollectiveKind;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::layout::chunk_size_and_offset;
use crate::layout::pack::{self, with_dim, PackPlan};
use crate::layout::padded_chunk;
use crate::mesh::storage as mesh_storage;
use crate::mesh::DeviceMesh;
use crate::placement::{Placement, ReduceOp};
use crate::shape::checked_numel;
use crate::storage::Storage;
use crate::Along;
use std::borrow::Cow;

/// One direct step of one mesh dim from one placement to another.
///
/// | variant | from → to | collective | bytes handed over (this rank) | wire (ring model) |
/// |---|---|---|---|---|
/// | `Keep` | p → p, or anything on a mesh dim of one rank | none | 0 | 0 |
/// | `AllGather` | Shard(d) → Replicate | all-gather | its shard | `(n-1)` chunks |
/// | `AllReduce` | Partial → Replicate | all-reduce | the whole | `2(n-1)` chunks |
/// | `ReduceScatter` | Partial → Shard(d) | reduce-scatter | the whole | `(n-1)` chunks |
/// | `AllToAll` | Shard(d) → Shard(e) | all-to-all | its shard | `(n-1)` blocks |
/// | `Chunk` | Replicate → Shard(d) | none | 0 | 0 |
/// | `Partition` | Replicate → Partial | none | 0 | 0 |
/// | `ZeroFill` | Shard(d) → Partial(sum) | none | 0 | 0 |
///
/// Any other pair (Shard → Partial(avg|max|min|product), Partial(a) → Partial(b), Partial →
/// Partial through a Shard...) has no direct step: [`Transition::of`] returns `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    /// Nothing moves: the placement stays, or the mesh dim has one rank, where every transition
    /// is the identity (the one shard is the whole, the reduction over one member is its value,
    /// its Partial share is the value). PyTorch's `num_chunks == 1` shortcut: no collective.
    Keep,
    /// Shard(d) → Replicate: all-gather of every member's rows of `d`.
    AllGather { d: usize },
    /// Partial(op) → Replicate: all-reduce.
    AllReduce { op: ReduceOp },
    /// Partial(op) → Shard(d): reduce-scatter, member j receiving the reduction of rows j of `d`.
    ReduceScatter { op: ReduceOp, d: usize },
    /// Shard(d) → Shard(e), `d != e`: all-to-all (gather `d`, split `e` in one collective).
    AllToAll { d: usize, e: usize },
    /// Replicate → Shard(d): this member's chunk of `d`, local.
    Chunk { d: usize },
    /// Replicate → Partial(op): local (the logical value stays after the reduction).
    Partition { op: ReduceOp },
    /// Shard(d) → Partial(sum): this shard in place in zeros of the full extent of `d`, local.
    ZeroFill { d: usize },
}

impl Transition {
    /// The direct step from `from` to `to`, on a mesh dim of more than one rank (see
    /// [`on`](Self::on)); `None` when there is none. Placements are normalized (`Shard`
    /// dims non-negative).
    pub(crate) fn of(from: Placement, to: Placement) -> Option<Self> {
        use Placement::{Partial, Replicate, Shard};
        Some(match (from, to) {
            (a, b) if a == b => Self::Keep,
            (Shard(d), Replicate) => Self::AllGather { d: d as usize },
            (Partial(op), Replicate) => Self::AllReduce { op },
            (Partial(op), Shard(d)) => Self::ReduceScatter { op, d: d as usize },
            (Shard(d), Shard(e)) => Self::AllToAll { d: d as usize, e: e as usize },
            (Replicate, Shard(d)) => Self::Chunk { d: d as usize },
            (Replicate, Partial(op)) => Self::Partition { op },
            // PyTorch 2.15 allows Shard -> Partial(sum) only: no other op has a zero-cost local form.
            (Shard(d), Partial(ReduceOp::Sum)) => Self::ZeroFill { d: d as usize },
            _ => return None,
        })
    }

    /// The step as it runs on a mesh dim of `n` ranks: [`Keep`](Self::Keep) when `n == 1`, so
    /// that no collective is issued, recorded or costed for a group of one.
    pub(crate) fn on(self, n: usize) -> Self {
        if n == 1 {
            Self::Keep
        } else {
            self
        }
    }

    /// May the planner take this step (as it runs: see [`on`](Self::on)) on mesh dim `i` of
    /// state `x`, heading for `dst`?
    ///
    /// Nested shardings nest left to right: mesh dim `i` may split or gather tensor dim `d`
    /// only when no later mesh dim shards `d`. Only the Partial the target asks for is ever
    /// introduced. A `Keep` that changes the placement (a mesh dim of one rank) is always
    /// legal: splitting into one chunk, or reducing over one member, is the identity wherever
    /// it nests. (The planner never offers a step to the same placement.)
    pub(crate) fn legal_in(self, x: &[Placement], i: usize, dst: &[Placement]) -> bool {
        let inner_free = |d: usize| x[i + 1..].iter().all(|p| !p.is_shard_on(d));
        match self {
            Self::Keep => true,
            Self::AllGather { d } | Self::Chunk { d } | Self::ReduceScatter { d, .. } => inner_free(d),
            Self::AllToAll { d, e } => inner_free(d) && inner_free(e),
            Self::AllReduce { .. } => true,
            Self::Partition { op } => dst[i] == Placement::Partial(op),
            Self::ZeroFill { d } => dst[i] == Placement::PARTIAL_SUM && inner_free(d),
        }
    }

    /// The collective the step issues (`None`: local).
    pub(crate) fn collective(self) -> Option<CollectiveKind> {
        match self {
            Self::AllGather { .. } => Some(CollectiveKind::AllGather),
            Self::AllReduce { .. } => Some(CollectiveKind::AllReduce),
            Self::ReduceScatter { .. } => Some(CollectiveKind::ReduceScatter),
            Self::AllToAll { .. } => Some(CollectiveKind::AllToAll),
            Self::Keep | Self::Chunk { .. } | Self::Partition { .. } | Self::ZeroFill { .. } => None,
        }
    }

    /// Elements member `k` of `n` hands to the collective, for a tensor of logical `shape` on
    /// this mesh dim: its whole shard, as the host collectives take it (uneven shards through
    /// the variable-size collectives, unpadded); what `CommDebugMode` records (times the
    /// element size). `None` when the count overflows.
    pub(crate) fn sent_elems(self, shape: &[usize], n: usize, k: usize) -> Option<usize> {
        let numel = checked_numel("", shape).ok()?;
        let rows_other = |d: usize| numel.checked_div(shape[d]).unwrap_or(0);
        match self {
            Self::AllGather { d } | Self::AllToAll { d, .. } => {
                chunk_size_and_offset(shape[d], n, k).0.checked_mul(rows_other(d))
            }
            Self::AllReduce { .. } | Self::ReduceScatter { .. } => Some(numel),
            Self::Keep | Self::Chunk { .. } | Self::Partition { .. } | Self::ZeroFill { .. } => Some(0),
        }
    }

    /// Elements a rank moves over the wire under the ring model the planner optimises, for a
    /// tensor of padded logical `shape` (the same on every rank): all-gather and
    /// reduce-scatter move `(n-1)` chunks, all-to-all `(n-1)` blocks, all-reduce twice as
    /// much as either (it is a reduce-scatter plus an all-gather). `None` when the count
    /// overflows (padding can push it past a huge tensor's element count).
    pub(crate) fn wire_elems(self, shape: &[usize], n: usize) -> Option<usize> {
        let numel = checked_numel("", shape).ok()?;
        let rows_other = |d: usize| numel.checked_div(shape[d]).unwrap_or(0);
        let hops = n - 1;
        match self {
            Self::AllGather { d } | Self::ReduceScatter { d, .. } => {
                hops.checked_mul(padded_chunk(shape[d], n))?.checked_mul(rows_other(d))
            }
            Self::AllToAll { d, e } => {
                let other = rows_other(d).checked_div(shape[e]).unwrap_or(0);
                hops.checked_mul(padded_chunk(shape[d], n))?.checked_mul(padded_chunk(shape[e], n))?.checked_mul(other)
            }
            Self::AllReduce { .. } => hops.checked_mul(padded_chunk(numel, n))?.checked_mul(2),
            Self::Keep | Self::Chunk { .. } | Self::Partition { .. } | Self::ZeroFill { .. } => Some(0),
        }
    }

    /// Runs the step on mesh dim `i` on this rank's shard `local` of a tensor of logical
    /// `shape` on that mesh dim (see [`RedistributeStep::logical_shape`](super::RedistributeStep)).
    pub(crate) fn run<T: Scalar>(
        self,
        mesh: &DeviceMesh,
        i: usize,
        local: Cow<'_, Storage<T>>,
        shape: &[usize],
    ) -> Result<Storage<T>> {
        let n = mesh.size(i);
        let k = mesh.coordinate()[i];
        let along = Along::Dim(i);
        let mine = local.shape().to_vec();
        Ok(match self {
            Self::Keep => local.into_owned(),
            Self::AllGather { d } if uneven_on_host(&local, shape[d], n) => {
                // Every member's shard as it is (no padding), joined along `d`: no copy at all
                // when only size-1 dims precede `d`.
                let counts = chunk_numels(&mine, d, shape[d], n);
                let recv = mesh_storage::all_gather_v(mesh, along, &local, &counts)?;
                recv.into_packed(&pack::join_v(&with_dim(&mine, d, shape[d]), d, n))?
            }
            Self::AllGather { d } => {
                // Pad our rows of `d` to the common chunk, gather, drop every member's padding.
                let block = with_dim(&mine, d, padded_chunk(shape[d], n));
                let send = pack_or_borrow(&local, &pack::split(&mine, d, 1, &block))?;
                let recv = mesh_storage::all_gather(mesh, along, &send)?;
                recv.into_packed(&pack::join(&block, n, d, &with_dim(&mine, d, shape[d])))?
            }
            Self::AllReduce { op } => match local {
                // In place on a buffer this plan owns; else straight into a fresh one (no copy first).
                Cow::Owned(buf) => mesh_storage::all_reduce(mesh, along, buf, op)?,
                Cow::Borrowed(src) => mesh_storage::all_reduce_into(mesh, along, src, op)?,
            },
            Self::ReduceScatter { op, d } if uneven_on_host(&local, shape[d], n) => {
                // Member j's rows of `d` go to block j, unpadded (in place when only size-1 dims
                // precede `d`); our reduced block is our shard as it lies.
                let counts = chunk_numels(&mine, d, shape[d], n);
                let send = pack_or_borrow(&local, &pack::split_v(&mine, d, n))?;
                let recv = mesh_storage::reduce_scatter_v(mesh, along, &send, &counts, op)?;
                let sz = chunk_size_and_offset(shape[d], n, k).0;
                recv.into_reshape(&with_dim(&mine, d, sz))?
            }
            Self::ReduceScatter { op, d } => {
                // Member j's rows of `d` go to block j (padded); our reduced block loses its padding.
                let block = with_dim(&mine, d, padded_chunk(shape[d], n));
                let send = pack_or_borrow(&local, &pack::split(&mine, d, n, &block))?;
                let recv = mesh_storage::reduce_scatter(mesh, along, &send, op)?;
                let sz = chunk_size_and_offset(shape[d], n, k).0;
                recv.into_packed(&pack::join(&block, 1, d, &with_dim(&mine, d, sz)))?
            }
            Self::Chunk { d } => {
                let (sz, off) = chunk_size_and_offset(shape[d], n, k);
                local.slice(&with_dim(&vec![0; mine.len()], d, off), &with_dim(&mine, d, sz))?
            }
            Self::AllToAll { d, e } if uneven_on_host(&local, shape[d], n) || uneven_on_host(&local, shape[e], n) => {
                // Our shard is rows (the dims before `e`) of one run per member (its chunk of `e`
                // times the dims after `e`), sent as it lies, unpadded; from member i we receive
                // our chunk of `e` of its rows of `d`, which join along `d` (no copy when only
                // size-1 dims precede `d`).
                let rows = mine[..e].iter().product();
                let inner: usize = mine[e + 1..].iter().product();
                let runs: Vec<usize> = (0..n).map(|j| chunk_size_and_offset(shape[e], n, j).0 * inner).collect();
                let target = with_dim(&with_dim(&mine, d, shape[d]), e, chunk_size_and_offset(shape[e], n, k).0);
                let recv_counts = chunk_numels(&target, d, shape[d], n);
                let recv = mesh_storage::all_to_all_v(mesh, along, &local, rows, &runs, &recv_counts)?;
                recv.into_packed(&pack::join_v(&target, d, n))?
            }
            Self::AllToAll { d, e } => {
                // Block j: our rows of `d`, member j's chunk of `e`, padded to (cd, ce); what we
                // receive from member j is its rows of `d` of our chunk of `e`.
                let block = with_dim(&with_dim(&mine, d, padded_chunk(shape[d], n)), e, padded_chunk(shape[e], n));
                let even = shape[d].is_multiple_of(n) && shape[e].is_multiple_of(n);
                let recv = if even && local.as_cpu().is_some() {
                    // Even on both dims, on the host (the same verdict on every member: they share
                    // the mesh's device): block j is run j of every row over the dims before `e`,
                    // sent as it lies, without packing. Device shards pack on the device instead,
                    // so that the all-to-all moves device buffers.
                    let rows = mine[..e].iter().product();
                    let run = block[e..].iter().product();
                    mesh_storage::all_to_all_strided(mesh, along, &local, rows, run)?
                } else {
                    let send = pack_or_borrow(&local, &pack::split(&mine, e, n, &block))?;
                    mesh_storage::all_to_all(mesh, along, &send)?
                };
                let my_e = chunk_size_and_offset(shape[e], n, k).0;
                recv.into_packed(&pack::join(&block, n, d, &with_dim(&with_dim(&mine, d, shape[d]), e, my_e)))?
            }
            // The logical value must stay the same after the reduction, so only the first
            // member keeps the data (sum, product) or every member does (avg, min, max).
            Self::Partition { op } => match op {
                ReduceOp::Sum if k != 0 => local.new_full(local.shape(), T::zero())?,
                ReduceOp::Product if k != 0 => local.new_full(local.shape(), T::one())?,
                _ => local.into_owned(),
            },
            Self::ZeroFill { d } => {
                // Our rows of `d` in place in a zero tensor of the full extent of `d`.
                let off = chunk_size_and_offset(shape[d], n, k).1;
                local.pack(&pack::pad(&mine, &with_dim(&mine, d, shape[d]), &with_dim(&vec![0; mine.len()], d, off)))?
            }
        })
    }
}

/// Can mesh dim `mesh_dim` reach `to` from `from` at all, through any steps? (Shard →
/// Partial(avg|max|min|product) and changing a Partial's reduce op cannot, as in PyTorch, even
/// on a mesh dim of one rank.)
pub(super) fn check_target(mesh_dim: usize, from: Placement, to: Placement) -> Result<()> {
    match crate::placement::transition_error(from, to) {
        Some(reason) => Err(Error::InvalidRedistribute { mesh_dim, from, to, reason: reason.into() }),
        None => Ok(()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn universe() -> Vec<Placement> {
        let mut ps = vec![Placement::Replicate, Placement::Shard(0), Placement::Shard(1)];
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product] {
            ps.push(Placement::Partial(op));
        }
        ps
    }

    /// No direct step reaches a target that `check_target` refuses: the two legality
    /// statements (per step here, per target in `placement::transition_error`) agree.
    #[test]
    fn no_direct_step_to_a_refused_target() {
        for from in universe() {
            for to in universe() {
                if check_target(0, from, to).is_err() {
                    assert_eq!(Transition::of(from, to), None, "{from} -> {to}");
                }
            }
        }
    }

    /// Issue 32: on a mesh dim of one rank every direct step is `Keep`: no collective, nothing
    /// sent, nothing on the wire, legal wherever it nests; on more ranks a step communicates
    /// exactly when it sends bytes.
    #[test]
    fn size_one_mesh_dim_is_keep_and_collectives_send_bytes() {
        let shape = [6, 4];
        for from in universe() {
            for to in universe() {
                let Some(t) = Transition::of(from, to) else { continue };
                let one = t.on(1);
                assert_eq!(one, Transition::Keep, "{from} -> {to}");
                assert_eq!(
                    (one.collective(), one.sent_elems(&shape, 1, 0), one.wire_elems(&shape, 1)),
                    (None, Some(0), Some(0))
                );
                let nested = [from, Placement::Shard(0), Placement::Shard(1)];
                assert!(from == to || one.legal_in(&nested, 0, &[to, nested[1], nested[2]]), "{from} -> {to}");
                let two = t.on(2);
                let sent = two.sent_elems(&shape, 2, 0).unwrap();
                let wire = two.wire_elems(&shape, 2).unwrap();
                assert_eq!(two.collective().is_some(), sent > 0, "{from} -> {to}: sends iff it communicates");
                assert_eq!(two.collective().is_some(), wire > 0, "{from} -> {to}: costs iff it communicates");
            }
        }
    }
}
