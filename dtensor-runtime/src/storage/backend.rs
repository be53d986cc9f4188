//! The kernels one compute device implements: the checklist behind the [`Storage`] enum
//! (candle's `BackendStorage`).
//!
//! [`Storage`] validates shapes and dims once for every device, then runs the arm of the
//! device the data lives on; each arm calls the same method of this trait. The host
//! implements it on `ndarray::ArrayD<T>` (`storage/cpu.rs`), CUDA on
//! [`CudaStorage`](super::CudaStorage) (`storage/cuda.rs`, feature `cuda`). A third device
//! (ROCm, Metal) is a type implementing this trait, one `Storage` variant, one arm in
//! `storage/mod.rs`'s dispatch macros and in the constructors that take a
//! [`Target`](crate::device::Target): the compiler lists every kernel it still lacks. A kernel
//! the device cannot run is a typed [`Error::Unsupported`](crate::error::Error::Unsupported),
//! never a panic.
//!
//! Inputs reach these methods already checked (shapes broadcast, dims in range, devices
//! equal, sizes bounded), so an implementation checks only what is its own (ids in range on
//! the device, its own size limits).

use crate::element::{Element, Scalar};
use crate::error::Result;
use crate::layout::pack::PackPlan;
use crate::op::{AdamWStep, BinaryOp, RandomFill, Reduction, SgdStep, SoftmaxKind, UnaryOp};
use ndarray::ArrayD;

/// The storage of one compute device for element type `T`, and its kernels.
pub trait BackendStorage<T: Scalar>: Sized + Clone {
    /// What allocates on this device: `()` for the host, the device handle for CUDA.
    type Handle;
    /// The same device's storage of another element type (ids are `i64`, `argmax` writes
    /// `i64`, casts change the type).
    type Of<U: Scalar>: BackendStorage<U, Handle = Self::Handle>;

    // ---------------------------------------------------------------- creation and access

    /// A host array placed on this device.
    fn from_host(h: &Self::Handle, a: ArrayD<T>) -> Result<Self>;
    /// Every element `value` (the element count is already checked).
    fn full(h: &Self::Handle, shape: &[usize], value: T) -> Result<Self>;
    /// The shard (`shape` at `offset`) of a counter-based random tensor of `global` shape,
    /// element for element the host generator's value.
    fn random(h: &Self::Handle, fill: &RandomFill, global: &[usize], offset: &[usize], shape: &[usize]) -> Result<Self>
    where
        T: Element;
    /// Row-major shape.
    fn dims(&self) -> &[usize];
    /// A host copy of the data.
    fn to_host(&self) -> Result<ArrayD<T>>;
    /// Same data, new shape (same element count, checked by the caller).
    fn into_reshape(self, shape: &[usize]) -> Result<Self>;
    /// Element-type conversion (Rust's `as`, integers through `i64`).
    fn cast<U: Scalar>(&self) -> Result<Self::Of<U>>;

    // ---------------------------------------------------------------- moves (every type)

    /// Strided box copies into a fresh storage of `plan.dst_shape` (zeros where no block
    /// writes); the plan is checked against this storage by the caller.
    fn pack(&self, plan: &PackPlan) -> Result<Self>;
    /// Concatenation along `dim` (same rank, equal other dims: checked by the caller).
    fn cat(parts: &[&Self], dim: usize) -> Result<Self>;
    /// The comparison `op` of two tensors broadcast to `shape`: 1 where it holds, else 0.
    fn compare(&self, op: BinaryOp, other: &Self, shape: &[usize]) -> Result<Self>;
    /// `a` where this mask is non-zero, else `b`, all broadcast to `shape`.
    fn where_(&self, a: &Self, b: &Self, shape: &[usize]) -> Result<Self>;
    /// The slices at `ids` along `dim`.
    fn index_select(&self, dim: usize, ids: &Self::Of<i64>) -> Result<Self>;
    /// PyTorch `gather` along `dim` at `ids`.
    fn gather(&self, dim: usize, ids: &Self::Of<i64>) -> Result<Self>;

    // ---------------------------------------------------------------- arithmetic (floats)

    /// Element-wise `op`.
    fn unary(&self, op: UnaryOp) -> Result<Self>
    where
        T: Element;
    /// Element-wise `op` of two tensors broadcast to `shape`.
    fn binary(&self, op: BinaryOp, other: &Self, shape: &[usize]) -> Result<Self>
    where
        T: Element;
    /// `kind` over `dims` (sorted, deduplicated, in range).
    fn reduce(&self, kind: Reduction, dims: &[usize], keepdim: bool) -> Result<Self>
    where
        T: Element;
    /// Softmax or log-softmax along `dim`.
    fn softmax(&self, dim: usize, kind: SoftmaxKind) -> Result<Self>
    where
        T: Element;
    /// The input gradient of [`softmax`](Self::softmax) from its output (`self`) and `g`.
    fn softmax_backward(&self, g: &Self, dim: usize, kind: SoftmaxKind) -> Result<Self>
    where
        T: Element;
    /// `self @ other` of shape `out_shape`, each operand's last two dims swapped first when its
    /// flag is set.
    fn matmul(&self, other: &Self, transpose_self: bool, transpose_other: bool, out_shape: &[usize]) -> Result<Self>
    where
        T: Element;
    /// Embedding lookup in this table shard (rows `row0..` of `vocab`).
    fn embedding(&self, ids: &Self::Of<i64>, row0: usize, vocab: usize) -> Result<Self>
    where
        T: Element;
    /// The gradient of [`embedding`](Self::embedding) for a shard of `rows` rows from `row0`.
    fn embedding_backward(&self, ids: &Self::Of<i64>, rows: usize, row0: usize, vocab: usize) -> Result<Self>
    where
        T: Element;
    /// `tril`/`triu` of a shard whose last two dims start at (`row0`, `col0`).
    fn tri(&self, lower: bool, diagonal: i64, row0: usize, col0: usize) -> Result<Self>
    where
        T: Element;
    /// `argmax`/`argmin` along `dim` (non-empty), as `i64`.
    fn arg_reduce(&self, dim: usize, max: bool, keepdim: bool) -> Result<Self::Of<i64>>
    where
        T: Element;
    /// The gradient of [`index_select`](Self::index_select): slices added at `ids` into
    /// zeros whose `dim` has `n` entries.
    fn index_add(&self, dim: usize, ids: &Self::Of<i64>, n: usize) -> Result<Self>
    where
        T: Element;
    /// The gradient of [`gather`](Self::gather): added at the gathered positions of zeros of
    /// `shape`.
    fn scatter_add(&self, dim: usize, ids: &Self::Of<i64>, shape: &[usize]) -> Result<Self>
    where
        T: Element;
    /// Ones of `T` at `ids` along a new last dim of `classes`.
    fn one_hot(ids: &Self::Of<i64>, classes: usize) -> Result<Self>
    where
        T: Element;
    /// One SGD update in place (`buf`: the momentum buffer).
    fn sgd_step(&mut self, grad: &Self, buf: Option<&mut Self>, step: &SgdStep) -> Result<()>
    where
        T: Element;
    /// One AdamW update in place, with its moments.
    fn adamw_step(&mut self, grad: &Self, m: &mut Self, v: &mut Self, step: &AdamWStep) -> Result<()>
    where
        T: Element;
}
