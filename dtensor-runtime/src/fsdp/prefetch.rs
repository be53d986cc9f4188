//! Prefetch: a unit's all-gathers started ahead of its forward (PyTorch
//! `FSDPModule.unshard(async_op=True)`, and the forward prefetch of a sequence of units), so
//! that they run on the rank's background collective path while the unit before computes.
//!
//! A prefetch is taken from given shards and used only by a forward that finds the same
//! shards (the same storage): a parameter stepped or replaced in between is gathered again,
//! never read stale.

use super::unit::Unit;
use crate::autograd::Node;
use crate::comm::debug::op_scope;
use crate::comm::PendingGather;
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::Result;
use crate::layout::chunk_size_and_offset;
use crate::mesh::storage as mesh_storage;
use crate::mesh::Along;
use crate::placement::Placement;
use crate::storage::Storage;
use ndarray::{ArrayD, IxDyn};
use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// One parameter's prefetch.
enum Part<T: Element> {
    /// In its in-use layout already (left replicated on the FSDP dim, one rank, or device
    /// memory, which is gathered at once).
    Ready(DTensor<T>),
    /// Its all-gather in the unit's batch: every member's shard of `shape`, `d` the sharded
    /// dim; `send` the shard it reads (kept here, so that a converted copy is freed by this
    /// thread).
    Gathering { d: usize, mine: Vec<usize>, _send: DTensor<T> },
}

/// A unit's started gathers (in the module's element type `E`; one batch, one background job),
/// with the shards they were started from (kept, so that their storage is not reused while
/// the prefetch lives).
pub(super) struct Prefetch<E: Element> {
    parts: Vec<Part<E>>,
    pending: Option<PendingGather<E>>,
    /// The shards' storage, held (so that no other storage takes its address meanwhile).
    sources: Vec<Arc<dyn Any>>,
}

/// The identity of a storage.
fn address<A: ?Sized>(storage: &Arc<A>) -> *const () {
    Arc::as_ptr(storage) as *const ()
}

impl<S: Element> Unit<S> {
    /// Starts gathering every parameter of `shards` (at rest, in the unit's order), each
    /// converted by `to` first (the identity, or a mixed-precision unit's cast).
    pub(super) fn start_gather<E: Element>(
        &self,
        shards: &[DTensor<S>],
        to: impl Fn(&DTensor<S>) -> Result<DTensor<E>>,
    ) -> Result<Prefetch<E>> {
        let n = self.mesh.size(self.mesh_dim);
        let mut batch = Vec::new();
        let parts = shards
            .iter()
            .zip(self.params.iter())
            .map(|(p, info)| {
                let p = to(p)?;
                let d = match info.stored[self.mesh_dim] {
                    Placement::Shard(d) if n > 1 => d as usize,
                    _ => return Ok(Part::Ready(self.gather_data(&p, info)?)),
                };
                if p.local_cpu().is_err() {
                    // device memory: gathered at once, on the device
                    return Ok(Part::Ready(self.gather_data(&p, info)?));
                }
                let mine = p.local.shape().to_vec();
                let rest: usize = mine.iter().enumerate().filter(|&(i, _)| i != d).map(|(_, &s)| s).product();
                let counts: Vec<usize> = (0..n).map(|j| rest * chunk_size_and_offset(p.shape()[d], n, j).0).collect();
                batch.push((Arc::clone(&p.local), counts));
                Ok(Part::Gathering { d, mine, _send: p })
            })
            .collect::<Result<Vec<_>>>()?;
        // One job for the unit: separate starts on one group would each wait for the one before.
        let pending = match batch.is_empty() {
            true => None,
            false => Some(op_scope("fsdp_all_gather", || {
                mesh_storage::all_gather_v_start(&self.mesh, Along::Dim(self.mesh_dim), batch)
            })?),
        };
        Ok(Prefetch { parts, pending, sources: shards.iter().map(|s| Arc::clone(&s.local) as Arc<dyn Any>).collect() })
    }

    /// Drops this unit's prefetches in element type `E` (waiting for their transfers): the
    /// forward's, and the backward's of a unit resharding to a smaller group.
    pub(super) fn drop_prefetches<E: Element>(&self) {
        drop(take::<E>(self.id));
        if let Some(post) = &self.post {
            drop(take::<E>(post.id));
        }
    }
}

impl<E: Element> Prefetch<E> {
    /// Was it started from exactly these shards (the same storage, in the same order)?
    pub(super) fn matches<S: Element>(&self, shards: &[DTensor<S>]) -> bool {
        self.sources.len() == shards.len()
            && self.sources.iter().zip(shards).all(|(a, b)| address(a) == address(&b.local))
    }

    /// Waits for the gathers: every parameter in its in-use layout, without history
    /// (`shards`: those it was started from, [`Prefetch::matches`]).
    pub(super) fn finish<S: Element>(self, unit: &Unit<S>, shards: &[DTensor<S>]) -> Result<Vec<DTensor<E>>> {
        let n = unit.mesh.size(unit.mesh_dim);
        let mut gathered = match self.pending {
            Some(p) => p.wait_all()?.into_iter(),
            None => Vec::new().into_iter(),
        };
        self.parts
            .into_iter()
            .zip(shards.iter().zip(unit.params.iter()))
            .map(|(part, (shard, info))| match part {
                Part::Ready(t) => Ok(t),
                Part::Gathering { d, mine, .. } => {
                    let data = gathered.next().ok_or_else(|| crate::error::Error::Backend {
                        backend: "fsdp".into(),
                        message: "a prefetch returned fewer gathers than it started".into(),
                    })?;
                    let full = join(data, &mine, d, shard.shape()[d], n)?;
                    Ok(DTensor::new_unchecked(
                        Storage::from(full),
                        shard.mesh.clone(),
                        info.in_use.clone(),
                        shard.shape.clone(),
                        None,
                    ))
                }
            })
            .collect()
    }
}

/// Every member's block (`mine` with `d` of member `j`'s chunk), back to back, joined along
/// `d` into a row-major array (whole when the dims before `d` are all 1: the blocks are then
/// the rows in order; else each outer index takes one run from every block in turn).
fn join<T: Element>(data: Vec<T>, mine: &[usize], d: usize, size: usize, n: usize) -> Result<ArrayD<T>> {
    let mut whole = mine.to_vec();
    whole[d] = size;
    let shape_err = |e: ndarray::ShapeError| crate::error::Error::Backend {
        backend: "fsdp".into(),
        message: format!("a prefetched all-gather returned the wrong number of elements: {e}"),
    };
    if mine[..d].iter().all(|&s| s == 1) {
        return ArrayD::from_shape_vec(IxDyn(&whole), data).map_err(shape_err);
    }
    let outer: usize = mine[..d].iter().product();
    let inner: usize = mine[d + 1..].iter().product();
    let runs: Vec<usize> = (0..n).map(|j| chunk_size_and_offset(size, n, j).0 * inner).collect();
    let starts: Vec<usize> = runs.iter().scan(0, |at, r| Some(std::mem::replace(at, *at + outer * r))).collect();
    let mut out = Vec::with_capacity(outer * size * inner);
    for o in 0..outer {
        for (start, run) in starts.iter().zip(&runs) {
            let from = start + o * run;
            out.extend_from_slice(data.get(from..from + run).ok_or_else(|| crate::error::Error::Backend {
                backend: "fsdp".into(),
                message: "a prefetched all-gather returned fewer elements than its counts".into(),
            })?);
        }
    }
    ArrayD::from_shape_vec(IxDyn(&whole), out).map_err(shape_err)
}

thread_local! {
    /// This rank's prefetches by unit id (a started collective belongs to the thread that
    /// started it: its handle is not `Send`).
    static STARTED: RefCell<HashMap<u64, Box<dyn Any>>> = RefCell::new(HashMap::new());
}

/// Keeps unit `id`'s prefetch until its forward takes it.
pub(super) fn keep<E: Element>(id: u64, prefetch: Prefetch<E>) {
    STARTED.with(|s| s.borrow_mut().insert(id, Box::new(prefetch)));
}

/// Is a prefetch of unit `id` in flight on this rank?
pub(super) fn is_started(id: u64) -> bool {
    STARTED.with(|s| s.borrow().contains_key(&id))
}

/// Unit `id`'s prefetch, if one is in flight on this rank.
pub(super) fn take<E: Element>(id: u64) -> Option<Prefetch<E>> {
    // `try_with`: a unit dropped while the thread's locals are torn down has nothing here.
    let p = STARTED.try_with(|s| s.borrow_mut().remove(&id)).ok().flatten()?;
    p.downcast::<Prefetch<E>>().ok().map(|p| *p)
}

/// The in-use parameters of unit `unit` (`id`) gathered from `shards`, if a prefetch from
/// them is in flight (one from other shards is dropped: its transfer is waited for, its
/// result discarded).
pub(super) fn prefetched<S: Element, E: Element>(
    id: u64,
    unit: &Unit<S>,
    shards: &[DTensor<S>],
) -> Result<Option<Vec<DTensor<E>>>> {
    match take::<E>(id) {
        Some(p) if p.matches(shards) => Ok(Some(p.finish(unit, shards)?)),
        _ => Ok(None),
    }
}

/// Starts a unit's gathers (from the shards its forward saw) unless started already.
pub(super) type Starter = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// How to start gathering unit `unit` from `shards` (converted by `to`) ahead of its backward.
pub(super) fn starter<S: Element, E: Element>(
    unit: &Unit<S>,
    shards: Vec<DTensor<S>>,
    to: fn(&DTensor<S>) -> Result<DTensor<E>>,
) -> Starter {
    let unit = unit.clone();
    Arc::new(move || {
        if !is_started(unit.id) {
            keep(unit.id, unit.start_gather(&shards, to)?);
        }
        Ok(())
    })
}

thread_local! {
    /// The last prefetching, resharding unit's forward on this thread: its output's node and
    /// how to start its gathers (for the backward prefetch of the unit whose input that output
    /// is).
    static LAST: RefCell<Option<(Box<dyn Any>, Starter)>> = const { RefCell::new(None) };
}

/// Records `out` (a resharding unit's output, recorded on the tape) as the last such output,
/// with how to start its unit's gathers.
pub(super) fn chain<S: Element>(out: &DTensor<S>, start: Starter) {
    if let Some(node) = &out.autograd.node {
        let weak: Weak<Node<S>> = Arc::downgrade(node);
        LAST.with(|l| *l.borrow_mut() = Some((Box::new(weak), start)));
    }
}

/// The starter of the unit whose output `x` is, if `x` is the last recorded resharding output:
/// the backward reaching this unit then prefetches that one (the units run back to back, so
/// its backward comes next). Decided by the program alone (the same on every rank): the node
/// is compared while its allocation is held (a `Weak`), so an address is never reused.
pub(super) fn previous<S: Element>(x: &DTensor<S>) -> Option<Starter> {
    let node = x.autograd.node.as_ref()?;
    LAST.with(|l| {
        let last = l.borrow();
        let (weak, start) = last.as_ref()?;
        let weak = weak.downcast_ref::<Weak<Node<S>>>()?;
        (Weak::as_ptr(weak) == Arc::as_ptr(node)).then(|| Arc::clone(start))
    })
}

/// Forgets the last resharding output (a backward has begun).
pub(super) fn unchain() {
    let _ = LAST.try_with(|l| l.borrow_mut().take());
}
