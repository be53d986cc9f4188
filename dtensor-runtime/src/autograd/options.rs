//! [`BackwardOptions`]: how a backward pass runs (see [`DTensor::backward_opts`]).

use crate::element::DType;
#[cfg(doc)]
use crate::DTensor;

/// How [`DTensor::backward_opts`] runs: whether it keeps the graph, the dtype of the
/// leaf-gradient reductions, and whether those reductions overlap the rest of the pass.
///
/// `BackwardOptions::new()` is plain [`DTensor::backward`].
///
/// ```
/// use dtensor_runtime::autograd::BackwardOptions;
/// let opts = BackwardOptions::new().overlap_grad_reduce(1 << 20);
/// assert_eq!(opts.bucket_bytes(), Some(1 << 20));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackwardOptions {
    pub(crate) retain_graph: bool,
    pub(crate) reduce_dtype: Option<DType>,
    pub(crate) overlap: Option<usize>,
}

impl BackwardOptions {
    /// Plain `backward()`: frees the graph, reduces in the tensor's dtype, no overlap.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep the graph for another backward pass (PyTorch's `retain_graph=True`).
    pub fn retain_graph(mut self, on: bool) -> Self {
        self.retain_graph = on;
        self
    }

    /// Run the leaf-gradient reductions in `dtype` (see [`DTensor::backward_reducing_in`]).
    pub fn reduce_in(mut self, dtype: DType) -> Self {
        self.reduce_dtype = Some(dtype);
        self
    }

    /// Overlap the leaf-gradient all-reduces (a parameter gradient that arrives Partial on
    /// one mesh dim, as the data-parallel sum does) with the rest of the backward, as
    /// PyTorch's DDP does: gradients are packed in the order they become ready into buckets
    /// of about `bucket_bytes` (one all-reduce per bucket, started as soon as it is full);
    /// `0` starts one all-reduce per gradient. The pass returns once every bucket is reduced,
    /// with the same reductions and the same order of accumulation as plain `backward()`: on
    /// the thread backend `.grad()` is then bit for bit what plain `backward()` gives. MPI picks
    /// the algorithm of each call by its kind and message size, so for a group of more than
    /// two members an `MPI_Iallreduce` of a bucket may sum in another order than an
    /// `MPI_Allreduce` of one gradient, which can change the last bits.
    ///
    /// Buckets fill by the padded shard size of their gradients, the same on every rank (so
    /// every rank starts the same all-reduces in the same order, uneven shards included), and
    /// a bucket is started before it would pass 1 GiB.
    ///
    /// Where the backend can (the thread backend on a per-rank worker thread, MPI through
    /// `MPI_Iallreduce`), a bucket's all-reduce runs while the pass goes on; elsewhere it
    /// runs when started. Device gradients are bucketed, reduced and split on the device
    /// (NCCL and cuda-threads reduce the bucket there; nothing is copied to the host). A
    /// reduction in another dtype ([`reduce_in`](Self::reduce_in)) or over several mesh dims
    /// at once runs as plain `backward()` runs it.
    ///
    /// # What is checked
    /// Every member of a bucket's group must put the same gradients (the same parameters'
    /// gradients, in the same order) in its buckets, as it would pass them to plain
    /// `backward()` one by one. With the collective fingerprint check on
    /// (`DTENSOR_DEBUG=detail` or [`DeviceMesh::set_collective_checks`](crate::DeviceMesh::set_collective_checks)),
    /// each bucket's all-reduce is fingerprinted like a plain collective — element type, element
    /// count, reduce op, and a hash of the bucket's contents (every gradient's global shape,
    /// placements and local element count, in order) — so members whose buckets differ fail
    /// with [`Error::CollectiveMismatch`](crate::Error::CollectiveMismatch) on every member.
    /// With the check off, a bucket's all-reduce is one collective on one flat buffer: the
    /// backends compare its byte length (and element type and reduce op) only, so members whose
    /// buckets hold different gradients (other parameters, another order, other shapes) of the
    /// same total bytes are *not* detected and sum unrelated elements — where plain `backward()`,
    /// one all-reduce per gradient, fails with a typed error when those gradients' sizes
    /// differ.
    pub fn overlap_grad_reduce(mut self, bucket_bytes: usize) -> Self {
        self.overlap = Some(bucket_bytes);
        self
    }

    /// The bucket size of [`overlap_grad_reduce`](Self::overlap_grad_reduce), if it is on.
    pub fn bucket_bytes(&self) -> Option<usize> {
        self.overlap
    }
}
