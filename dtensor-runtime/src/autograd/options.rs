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
    /// runs when started. A reduction in another dtype ([`reduce_in`](Self::reduce_in)), of
    /// device storage, or over several mesh dims at once runs as plain `backward()` runs it.
    pub fn overlap_grad_reduce(mut self, bucket_bytes: usize) -> Self {
        self.overlap = Some(bucket_bytes);
        self
    }

    /// The bucket size of [`overlap_grad_reduce`](Self::overlap_grad_reduce), if it is on.
    pub fn bucket_bytes(&self) -> Option<usize> {
        self.overlap
    }
}
