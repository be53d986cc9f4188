//! The leaf-gradient reductions of a backward pass with
//! [`overlap_grad_reduce`](super::BackwardOptions::overlap_grad_reduce): gradients that arrive
//! Partial on one mesh dim are packed, in the order they become ready, into buckets that are
//! all-reduced in the background as soon as they are full (PyTorch DDP's scheme); the pass
//! goes on meanwhile. [`GradReducer::finish`] waits for the buckets and returns every
//! accumulation in the order plain `backward()` would have made it, so the gradients are those
//! of the blocking pass (bit for bit where the backend's started all-reduce sums in the order
//! of its blocking one: see [`BackwardOptions::overlap_grad_reduce`](super::BackwardOptions::overlap_grad_reduce)).
//!
//! Buckets fill by the *nominal* bytes of their gradients (the padded shard size, the same on
//! every rank) rather than by their local bytes (which differ between ranks with uneven
//! shards), so every rank starts the same buckets at the same point of its backward: the
//! thread backend's per-rank worker then runs the same sequence of all-reduces on every rank,
//! which is what keeps a worker from waiting on a peer whose worker waits on another group.
//!
//! With the collective fingerprint check on ([`crate::comm::fingerprint`]), each bucket's
//! all-reduce carries a hash of what the bucket holds — every gradient's global shape, target
//! placements and local element count, in order (the element type and total count are in the
//! fingerprint already) — so members whose buckets have equal sizes but different contents
//! (other parameters, another order) fail with `CollectiveMismatch` instead of summing
//! unrelated gradients. See [`BackwardOptions::overlap_grad_reduce`](super::BackwardOptions::overlap_grad_reduce)
//! for what is not checked with the check off.

use super::{redistribute_grad, Node};
use crate::comm::debug::op_scope;
use crate::comm::fingerprint::hash_words;
use crate::comm::PendingReduce;
use crate::dtensor::DTensor;
use crate::element::{DType, Element, Scalar};
use crate::error::{Error, Result};
use crate::layout::padded_chunk;
use crate::mesh::{storage as collective, Along, DeviceMesh};
use crate::placement::{Placement, ReduceOp};
use crate::storage::Storage;
use std::sync::Arc;

/// Where one leaf's gradient is (a leaf may receive several).
enum Part<T: Scalar> {
    /// Reduced (or needing no reduction): ready to accumulate.
    Ready(DTensor<T>),
    /// Elements `at..at + len` of bucket `bucket`, to become a DTensor like `like` (its
    /// mesh, placements and global shape) with local shape `local`.
    Bucketed { bucket: usize, at: usize, len: usize, local: Vec<usize>, like: Like },
}

/// What the reduced gradient will be, but for its data.
struct Like {
    mesh: DeviceMesh,
    placements: Vec<Placement>,
    shape: Vec<usize>,
}

/// A bucket is started before an append would take its nominal bytes past this, whatever
/// the bucket size asked for: it bounds the bucket's copies and keeps one all-reduce within
/// MPI's per-call count (`i32::MAX` elements of bytes).
const MAX_BUCKET_BYTES: usize = 1 << 30;

/// One bucket: gradients reduced over mesh dim `dim` of `mesh` with `op`, on the mesh's
/// device (device gradients stay on the device: the bucket is concatenated, reduced and split
/// there).
struct Bucket<T: Scalar> {
    mesh: DeviceMesh,
    dim: usize,
    op: ReduceOp,
    /// Its gradients' local shards, flat, in arrival order (joined when the bucket starts).
    parts: Vec<Storage<T>>,
    /// Elements of `parts` together.
    len: usize,
    /// What the bucket holds, gradient after gradient (see [`describe`]): the fingerprint
    /// detail of its all-reduce.
    layout: Vec<u64>,
    /// The nominal bytes of its gradients (see [`nominal_bytes`]).
    nominal: usize,
    /// The all-reduce, once started; then the reduced data (flat) once waited for.
    pending: Option<PendingReduce<T, Storage<T>>>,
    reduced: Option<Storage<T>>,
}

/// A leaf and one gradient to accumulate into it.
pub(super) type Accumulation<T> = (Arc<Node<T>>, DTensor<T>);

/// The leaf accumulations of one backward pass, in order, and their buckets.
pub(super) struct GradReducer<T: Scalar> {
    bucket_bytes: usize,
    parts: Vec<(Arc<Node<T>>, Part<T>)>,
    buckets: Vec<Bucket<T>>,
    /// Index of the open (not yet started) bucket of each (mesh, dim, op).
    open: Vec<usize>,
}

impl<T: Element> GradReducer<T> {
    pub(super) fn new(bucket_bytes: usize) -> Self {
        GradReducer { bucket_bytes, parts: Vec::new(), buckets: Vec::new(), open: Vec::new() }
    }

    /// Takes leaf `node`'s gradient `g`, to be reduced to the leaf's layout `target`.
    pub(super) fn push(
        &mut self,
        node: &Arc<Node<T>>,
        g: DTensor<T>,
        target: &[Placement],
        dtype: Option<DType>,
    ) -> Result<()> {
        let Some((dim, op)) = single_partial_to_replicate(&g, target, dtype) else {
            // Not bucketable: reduced now, as plain backward() does (a collective on a group
            // with a started bucket waits for that bucket first).
            let g = redistribute_grad(&g, target, dtype, "grad_accumulate")?;
            self.parts.push((Arc::clone(node), Part::Ready(g)));
            return Ok(());
        };
        let like = Like { mesh: g.device_mesh().clone(), placements: target.to_vec(), shape: g.shape().to_vec() };
        let local = g.local().shape().to_vec();
        let nominal = nominal_bytes(&g);
        let mut b = self.open_bucket(&like.mesh, dim, op);
        if self.buckets[b].nominal > 0 && self.buckets[b].nominal.saturating_add(nominal) > MAX_BUCKET_BYTES {
            self.start(b)?;
            b = self.open_bucket(&like.mesh, dim, op);
        }
        let bucket = &mut self.buckets[b];
        bucket.nominal = bucket.nominal.saturating_add(nominal);
        let at = bucket.len;
        let len = g.local().len();
        // Flat, on its own device (no copy when it is row-major already).
        bucket.parts.push(g.into_local().into_reshape(&[len])?);
        bucket.len += len;
        bucket.layout.extend(describe(&like, len));
        self.parts.push((Arc::clone(node), Part::Bucketed { bucket: b, at, len, local, like }));
        if bucket.nominal >= self.bucket_bytes {
            self.start(b)?;
        }
        Ok(())
    }

    /// The open bucket of (`mesh`, `dim`, `op`), made if there is none.
    fn open_bucket(&mut self, mesh: &DeviceMesh, dim: usize, op: ReduceOp) -> usize {
        let found = self.open.iter().position(|&i| {
            let b = &self.buckets[i];
            b.dim == dim && b.op == op && b.mesh.same_as(mesh) && Arc::ptr_eq(b.mesh.comm(), mesh.comm())
        });
        match found {
            Some(k) => self.open[k],
            None => {
                self.buckets.push(Bucket {
                    mesh: mesh.clone(),
                    dim,
                    op,
                    parts: Vec::new(),
                    len: 0,
                    layout: Vec::new(),
                    nominal: 0,
                    pending: None,
                    reduced: None,
                });
                self.open.push(self.buckets.len() - 1);
                self.buckets.len() - 1
            }
        }
    }

    /// Starts bucket `b`'s all-reduce and closes it.
    fn start(&mut self, b: usize) -> Result<()> {
        self.open.retain(|&i| i != b);
        let bucket = &mut self.buckets[b];
        let mut parts = std::mem::take(&mut bucket.parts);
        let data = match parts.len() {
            0 => Storage::zeros(bucket.mesh.target(), &[0])?,
            // The only gradient of its bucket: its own buffer (no copy).
            1 => parts.remove(0),
            _ => Storage::cat(&parts.iter().collect::<Vec<_>>(), 0)?,
        };
        drop(parts);
        let detail = hash_words(std::mem::take(&mut bucket.layout));
        let pending = op_scope("grad_bucket", || {
            collective::all_reduce_start(&bucket.mesh, Along::Dim(bucket.dim), data, bucket.op, detail)
        })?;
        bucket.pending = Some(pending);
        Ok(())
    }

    /// Starts the buckets still open (oldest first, the same order on every member), waits
    /// for every bucket, and returns each leaf's gradients in the order they arrived.
    pub(super) fn finish(mut self) -> Result<Vec<Accumulation<T>>> {
        while let Some(&b) = self.open.first() {
            self.start(b)?;
        }
        for bucket in &mut self.buckets {
            if let Some(p) = bucket.pending.take() {
                bucket.reduced = Some(p.wait()?);
            }
        }
        let mut out = Vec::with_capacity(self.parts.len());
        for (node, part) in self.parts {
            let g = match part {
                Part::Ready(g) => g,
                Part::Bucketed { bucket, at, len, local, like } => {
                    let reduced = &mut self.buckets[bucket].reduced;
                    let flat = match reduced {
                        _ if len == 0 => Storage::zeros(like.mesh.target(), &[0])?,
                        // The only gradient of its bucket: no copy.
                        Some(v) if at == 0 && len == v.len() => {
                            reduced.take().ok_or_else(|| Error::Autograd("a gradient bucket was taken twice".into()))?
                        }
                        Some(v) if at + len <= v.len() => v.slice(&[at], &[len])?,
                        Some(v) => {
                            return Err(Error::Autograd(format!(
                                "a reduced gradient bucket holds {} elements, not the {} its gradients need",
                                v.len(),
                                at + len
                            )))
                        }
                        None => return Err(Error::Autograd("a gradient bucket was never reduced".into())),
                    };
                    let local = flat
                        .into_reshape(&local)
                        .map_err(|e| Error::Autograd(format!("a reduced gradient bucket lost its shape: {e}")))?;
                    DTensor::new_unchecked(local, like.mesh, like.placements, like.shape, None)
                }
            };
            out.push((node, g));
        }
        Ok(out)
    }
}

/// One gradient of a bucket as words: its global shape, its target placements and its local
/// element count (the same on every member of the bucket's group, whose members differ only
/// in their coordinate on the Partial mesh dim).
fn describe(like: &Like, len: usize) -> impl Iterator<Item = u64> + '_ {
    // One word per placement (a hash of its name: `S(0)`, `R`, `P(sum)`).
    let placements = like.placements.iter().map(|p| hash_words(p.to_string().bytes().map(u64::from)));
    std::iter::once(like.shape.len() as u64)
        .chain(like.shape.iter().map(|&s| s as u64))
        .chain(std::iter::once(like.placements.len() as u64))
        .chain(placements)
        .chain(std::iter::once(len as u64))
}

/// The one mesh dim and reduce op if `g` reaches `target` by a single Partial → Replicate
/// step in its own dtype, on its mesh's device (what a bucket can hold, host or device: a
/// bucket joins its gradients on the mesh's device, so a shard elsewhere goes the plain way);
/// `None` otherwise.
fn single_partial_to_replicate<T: Scalar>(
    g: &DTensor<T>,
    target: &[Placement],
    dtype: Option<DType>,
) -> Option<(usize, ReduceOp)> {
    if dtype.is_some_and(|d| d != T::DTYPE) || g.local().device() != g.device_mesh().device() {
        return None;
    }
    let mut differ = g.placements().iter().zip(target).enumerate().filter(|(_, (a, b))| a != b);
    let (dim, (from, to)) = differ.next()?;
    match (from, to, differ.next()) {
        (Placement::Partial(op), Placement::Replicate, None) => Some((dim, *op)),
        _ => None,
    }
}

/// The bytes of `g`'s shard as if every sharded dim were split in padded chunks: the same on
/// every rank (a rank's own shard may be smaller, or empty, with uneven shapes).
fn nominal_bytes<T: Scalar>(g: &DTensor<T>) -> usize {
    let mut shape = g.shape().to_vec();
    for (i, p) in g.placements().iter().enumerate() {
        if let Placement::Shard(d) = *p {
            if let Some(s) = shape.get_mut(d as usize) {
                *s = padded_chunk(*s, g.device_mesh().size(i));
            }
        }
    }
    shape.iter().fold(std::mem::size_of::<T>(), |a, &s| a.saturating_mul(s))
}
