//! The local shard of a DTensor ([`Storage`]) and the one kernel surface every op, every
//! redistribution, the factories and the optimizers compute through.
//!
//! A shard lives on the host ([`Storage::Cpu`], an ndarray array) or on a CUDA device
//! ([`Storage::Cuda`]). The methods of [`Storage`] are the kernels: each takes an op enum from
//! [`op`](crate::op) (what to compute, as data) and dispatches once on the device, to the ndarray loops
//! of the `cpu` module or to the CUDA kernels. Shape checks that do not depend on the device happen here,
//! before dispatch, so both devices see validated input. Without the `cuda` cargo feature
//! [`CudaStorage`] is an uninhabited type: the `Cuda` arms compile to nothing, and the public
//! API is the same with and without the feature.
//!
//! Data movement (transpose, slicing, padding, broadcasting, redistribution's pack/unpack) is
//! one kernel, [`Storage::pack`], executing a [`PackPlan`] computed from shapes by the layout
//! code.
//!
//! # How to add a kernel
//!
//! For a new element-wise function of one tensor add its entry to the unary vocabulary
//! (`with_unary_ops!` in `op.rs`: variant, name, op code, host formula, CUDA C statement; the
//! host arm and the kernels' `switch` case are generated from it). For one of two tensors add
//! a variant to [`BinaryOp`] (with its name), its arm in `cpu::binary`, its op code in
//! [`crate::cuda::args`] and that code's case in the kernels' `switch` in
//! [`crate::cuda::source`] (the host emulation and device tests compare it with the CPU arm).
//! Ops then call `x.local.unary(UnaryOp::NewOp)`. For a kernel with a new signature, add it to
//! [`BackendStorage`] (the compiler then lists every device that lacks it), implement it for
//! the host (`ArrayD<T>` in `cpu.rs`, an ndarray loop with the op enum matched outside the
//! loop) and for [`CudaStorage`] (its kernel in `crate::cuda::source`, its arguments in
//! `crate::cuda::args`), add a method here that checks shapes once for every device and then
//! runs `on_device!(self, |s| BackendStorage::new_kernel(s, ..))`, and a unit test against a
//! plain ndarray reference at the end of this file.
//!
//! # How to add a compute device
//!
//! A type implementing [`BackendStorage`] (its `Handle` is what allocates on it), a variant of
//! [`Storage`] and of [`Target`], and one arm in the dispatch macros
//! (`on_device!`, `on_devices!`) and in the constructors that match a `Target`.

mod backend;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
mod no_cuda;
mod vmath;

#[cfg(feature = "cuda")]
pub use cuda::CudaStorage;
#[cfg(not(feature = "cuda"))]
pub use no_cuda::CudaStorage;

pub use backend::BackendStorage;

use crate::device::{Device, Target};
use crate::element::{Element, Scalar};
use crate::error::{Error, Result};
use crate::layout::pack::{self, PackPlan};
use crate::op::{AdamWStep, BinaryOp, RandomFill, Reduction, SgdStep, SoftmaxKind, UnaryOp};
use ndarray::ArrayD;
use std::borrow::Cow;
use std::fmt;

/// The body of a `Cuda` match arm: the expression with the `cuda` feature, and the proof that
/// the arm cannot be reached without it (the storage is uninhabited). Extra idents are the
/// arm's other bindings, marked used.
#[cfg(feature = "cuda")]
macro_rules! on_cuda {
    ($c:ident $(, $other:ident)* => $e:expr) => {
        $e
    };
}
#[cfg(not(feature = "cuda"))]
macro_rules! on_cuda {
    ($c:ident $(, $other:ident)* => $e:expr) => {{
        $(let _ = $other;)*
        $c.absurd()
    }};
}

/// `$body` on the backend storage `$s` of the one storage `$x`, whatever its device: the
/// result (a backend storage) wrapped back into the same arm.
macro_rules! on_device {
    ($x:expr, |$s:ident| $body:expr) => {
        match $x {
            Storage::Cpu($s) => ($body).map(Storage::Cpu),
            Storage::Cuda($s) => on_cuda!($s => ($body).map(Storage::Cuda)),
        }
    };
}

/// [`on_device!`] for an op of two storages (`$op` names it in the error when their
/// devices differ).
macro_rules! on_devices {
    ($op:expr, $x:expr, $y:expr, |$a:ident, $b:ident| $body:expr) => {
        match ($x, $y) {
            (Storage::Cpu($a), Storage::Cpu($b)) => ($body).map(Storage::Cpu),
            (Storage::Cuda($a), Storage::Cuda($b)) => on_cuda!($a, $b => ($body).map(Storage::Cuda)),
            (x, y) => Err(device_mismatch($op, x.device(), y.device())),
        }
    };
}

/// The local data of a DTensor shard: a host array or a CUDA buffer, always row-major.
pub enum Storage<T: Scalar> {
    /// Host memory.
    Cpu(ArrayD<T>),
    /// Device memory (uninhabited without the `cuda` feature).
    Cuda(CudaStorage<T>),
}

impl<T: Scalar> Clone for Storage<T> {
    fn clone(&self) -> Self {
        match self {
            Storage::Cpu(a) => Storage::Cpu(a.clone()),
            Storage::Cuda(c) => on_cuda!(c => Storage::Cuda(c.clone())),
        }
    }
}

impl<T: Scalar> From<ArrayD<T>> for Storage<T> {
    fn from(a: ArrayD<T>) -> Self {
        Storage::Cpu(a)
    }
}

impl<T: Scalar> fmt::Debug for Storage<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Storage::Cpu(a) => write!(f, "Cpu({a:?})"),
            Storage::Cuda(c) => on_cuda!(c => write!(f, "{c:?}")),
        }
    }
}

/// Same device-independent contents (a device shard is compared through a host copy; one
/// that cannot be copied compares unequal).
impl<T: Scalar> PartialEq for Storage<T> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Storage::Cpu(a), Storage::Cpu(b)) => a == b,
            _ => matches!((self.to_host(), other.to_host()), (Ok(a), Ok(b)) if a == b),
        }
    }
}

/// Compares with a host array (a device shard through a host copy).
impl<T: Scalar> PartialEq<ArrayD<T>> for Storage<T> {
    fn eq(&self, other: &ArrayD<T>) -> bool {
        match self {
            Storage::Cpu(a) => a == other,
            Storage::Cuda(_) => self.to_host().is_ok_and(|a| a == *other),
        }
    }
}

fn device_mismatch(context: &str, a: Device, b: Device) -> Error {
    Error::DeviceMismatch { context: context.into(), left: a.to_string(), right: b.to_string() }
}

/// PyTorch's error for a reduction without identity (max, min, argmax) over an empty dim.
pub(crate) fn empty_reduction(op: &str, dim: usize) -> Error {
    Error::InvalidArgument {
        context: op.into(),
        reason: format!("expected reduction dim {dim} to have non-zero size (the reduction has no identity)"),
    }
}

fn shape_mismatch(context: String, expected: &[usize], actual: &[usize]) -> Error {
    Error::ShapeMismatch { context, expected: expected.to_vec(), actual: actual.to_vec() }
}

/// Broadcast shape of two shapes (numpy rules), or the error naming both.
pub fn broadcast_shape(op: &str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(shape_mismatch(format!("{op}: shapes cannot be broadcast together"), a, b)),
        };
    }
    Ok(out)
}

/// `shape` with its last two dims swapped when `swap` is set (and it has two).
pub(crate) fn swapped_last(shape: &[usize], swap: bool) -> Vec<usize> {
    let mut s = shape.to_vec();
    let n = s.len();
    if swap && n >= 2 {
        s.swap(n - 2, n - 1);
    }
    s
}

/// Output shape of `a @ b` for `[.., m, k] @ [k, n]` or `[.., m, k] @ [.., k, n]`.
pub fn matmul_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let bad = |why: &str| shape_mismatch(format!("matmul: {why}"), a, b);
    if a.len() < 2 || b.len() < 2 {
        return Err(bad("both operands need at least 2 dims"));
    }
    let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
    let (k2, n) = (b[b.len() - 2], b[b.len() - 1]);
    if k != k2 {
        return Err(bad("inner dimensions differ"));
    }
    if b.len() > 2 && b[..b.len() - 2] != a[..a.len() - 2] {
        return Err(bad("batch dimensions differ (the right operand must be 2-D or have the same batch dims)"));
    }
    let mut out = a[..a.len() - 2].to_vec();
    out.extend([m, n]);
    Ok(out)
}

impl<T: Scalar> Storage<T> {
    // ------------------------------------------------------------ metadata

    /// Shape of the shard.
    pub fn shape(&self) -> &[usize] {
        match self {
            Storage::Cpu(a) => a.shape(),
            Storage::Cuda(c) => on_cuda!(c => c.shape()),
        }
    }

    /// Number of dims.
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    /// Has no elements?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the data lives.
    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(c) => on_cuda!(c => Device::Cuda(c.device().ordinal())),
        }
    }

    /// Where storage made from this one (same device, same stream) is allocated.
    pub fn target(&self) -> Target {
        match self {
            Storage::Cpu(_) => Target::Cpu,
            Storage::Cuda(c) => on_cuda!(c => Target::Cuda(std::sync::Arc::clone(c.device()))),
        }
    }

    /// The host array, if the data lives on the host.
    pub fn as_cpu(&self) -> Option<&ArrayD<T>> {
        match self {
            Storage::Cpu(a) => Some(a),
            Storage::Cuda(_) => None,
        }
    }

    /// The host array, mutably, if the data lives on the host.
    pub fn as_cpu_mut(&mut self) -> Option<&mut ArrayD<T>> {
        match self {
            Storage::Cpu(a) => Some(a),
            Storage::Cuda(_) => None,
        }
    }

    /// The host array, or [`Error::Unsupported`] naming `context` for device data.
    pub fn cpu(&self, context: &str) -> Result<&ArrayD<T>> {
        self.as_cpu().ok_or_else(|| Error::Unsupported {
            op: context.into(),
            reason: format!("the data lives on {}; copy it with `to_host()`", self.device()),
        })
    }

    /// A host copy of the data.
    pub fn to_host(&self) -> Result<ArrayD<T>> {
        match self {
            Storage::Cpu(a) => Ok(a.clone()),
            Storage::Cuda(c) => on_cuda!(c => BackendStorage::to_host(c)),
        }
    }

    /// The data as a host array (moved, not copied, when it already is one).
    pub fn into_host(self) -> Result<ArrayD<T>> {
        match self {
            Storage::Cpu(a) => Ok(a),
            Storage::Cuda(c) => on_cuda!(c => BackendStorage::to_host(&c)),
        }
    }

    /// Row-major host data: borrowed for a row-major host array, else a copy.
    pub(crate) fn host_data(&self) -> Result<Cow<'_, [T]>> {
        match self {
            Storage::Cpu(a) => Ok(cpu::row_major(a)),
            Storage::Cuda(c) => {
                on_cuda!(c => BackendStorage::to_host(c).map(|a| Cow::Owned(a.into_raw_vec_and_offset().0)))
            }
        }
    }

    /// The row-major host data, mutably (host storage is made row-major first); `None` for
    /// device storage.
    pub(crate) fn host_data_mut(&mut self) -> Option<&mut [T]> {
        match self {
            Storage::Cpu(a) => {
                if !a.is_standard_layout() {
                    *a = a.as_standard_layout().into_owned();
                }
                a.as_slice_mut()
            }
            Storage::Cuda(_) => None,
        }
    }

    /// Row-major data of `shape` from the host, placed on the same device as `self`.
    pub(crate) fn with_host_data(&self, shape: &[usize], data: Vec<T>) -> Result<Storage<T>> {
        Storage::from_host(cpu::from_vec(shape, data)?, &self.target())
    }

    // ------------------------------------------------------------ creation

    /// Places a host array on `target` (moved on the host, copied to a device).
    pub fn from_host(a: ArrayD<T>, target: &Target) -> Result<Storage<T>> {
        match target {
            Target::Cpu => BackendStorage::from_host(&(), a).map(Storage::Cpu),
            Target::Cuda(d) => on_cuda!(d => BackendStorage::from_host(d, a).map(Storage::Cuda)),
        }
    }

    /// Every element `value`.
    /// The shape is checked ([`Error::ShapeOverflow`]) and the buffer allocated fallibly
    /// ([`Error::OutOfMemory`]), as every buffer sized by a caller's shape.
    pub fn full(target: &Target, shape: &[usize], value: T) -> Result<Storage<T>> {
        crate::shape::checked_numel("full", shape)?;
        match target {
            Target::Cpu => BackendStorage::full(&(), shape, value).map(Storage::Cpu),
            Target::Cuda(d) => on_cuda!(d => BackendStorage::full(d, shape, value).map(Storage::Cuda)),
        }
    }

    /// All zeros.
    pub fn zeros(target: &Target, shape: &[usize]) -> Result<Storage<T>> {
        Self::full(target, shape, T::zero())
    }

    /// Every element `value`, on the device of `self`.
    pub fn new_full(&self, shape: &[usize], value: T) -> Result<Storage<T>> {
        Self::full(&self.target(), shape, value)
    }
}

impl<T: Element> Storage<T> {
    /// The shard (`shape` at `offset`) of a counter-based random tensor of `global` shape.
    pub fn random(
        target: &Target,
        fill: &RandomFill,
        global: &[usize],
        offset: &[usize],
        shape: &[usize],
    ) -> Result<Storage<T>> {
        if global.len() != shape.len() || offset.len() != shape.len() {
            return Err(shape_mismatch("random: rank of the global shape / offset".into(), shape, global));
        }
        match target {
            Target::Cpu => BackendStorage::random(&(), fill, global, offset, shape).map(Storage::Cpu),
            Target::Cuda(d) => on_cuda!(d => BackendStorage::random(d, fill, global, offset, shape).map(Storage::Cuda)),
        }
    }

    // ------------------------------------------------------------ kernels

    /// Element-wise `op` of one tensor.
    pub fn unary(&self, op: UnaryOp) -> Result<Storage<T>> {
        on_device!(self, |s| BackendStorage::unary(s, op))
    }

    /// Element-wise `op` of two tensors with numpy broadcasting.
    pub fn binary(&self, op: BinaryOp, other: &Storage<T>) -> Result<Storage<T>> {
        let shape = broadcast_shape(op.name(), self.shape(), other.shape())?;
        on_devices!(op.name(), self, other, |a, b| BackendStorage::binary(a, op, b, &shape))
    }

    /// Reduces `dims` (any order, duplicates ignored); reduced dims are kept as size 1 with
    /// `keepdim`, else dropped.
    pub fn reduce(&self, kind: Reduction, dims: &[usize], keepdim: bool) -> Result<Storage<T>> {
        let mut dims = dims.to_vec();
        dims.sort_unstable();
        dims.dedup();
        if let Some(&d) = dims.iter().find(|&&d| d >= self.ndim()) {
            return Err(Error::DimOutOfRange { context: kind.name().into(), dim: d as isize, ndim: self.ndim() });
        }
        on_device!(self, |s| BackendStorage::reduce(s, kind, &dims, keepdim))
    }

    /// Softmax or log-softmax of every lane along `dim`.
    pub fn softmax(&self, dim: usize, kind: SoftmaxKind) -> Result<Storage<T>> {
        self.check_dim("softmax", dim)?;
        on_device!(self, |s| BackendStorage::softmax(s, dim, kind))
    }

    /// Input gradient of [`Storage::softmax`] from its output (`self`) and the output's
    /// gradient `g` (same shape).
    pub fn softmax_backward(&self, g: &Storage<T>, dim: usize, kind: SoftmaxKind) -> Result<Storage<T>> {
        self.check_dim("softmax_backward", dim)?;
        if self.shape() != g.shape() {
            return Err(shape_mismatch("softmax_backward: gradient vs output".into(), self.shape(), g.shape()));
        }
        on_devices!("softmax_backward", self, g, |y, g| BackendStorage::softmax_backward(y, g, dim, kind))
    }

    /// `self [.., m, k] @ other [k, n]` or `self [.., m, k] @ other [.., k, n]`.
    pub fn matmul(&self, other: &Storage<T>) -> Result<Storage<T>> {
        self.matmul_t(other, false, false)
    }

    /// [`matmul`](Self::matmul) of `self` and `other`, each with its last two dims swapped
    /// first when its flag is set: `a @ bᵀ` is `a.matmul_t(&b, false, true)`. On the host the
    /// kernel reads the swapped operand through its strides, so nothing is copied.
    pub fn matmul_t(&self, other: &Storage<T>, transpose_self: bool, transpose_other: bool) -> Result<Storage<T>> {
        let (sa, sb) = (swapped_last(self.shape(), transpose_self), swapped_last(other.shape(), transpose_other));
        let shape = matmul_shape(&sa, &sb)?;
        on_devices!("matmul", self, other, |a, b| {
            BackendStorage::matmul(a, b, transpose_self, transpose_other, &shape)
        })
    }

    /// Embedding lookup in this table shard (`[rows, cols]`, rows `row0..` of a table of
    /// `vocab` rows) at `ids` in `[0, vocab)`: `ids.shape + [cols]`, zeros for ids of other
    /// shards. Ids are `i64` for every table type (a float id would round in the 16-bit types).
    pub fn embedding(&self, ids: &Storage<i64>, row0: usize, vocab: usize) -> Result<Storage<T>> {
        if self.ndim() != 2 {
            return Err(shape_mismatch("embedding: table must be [rows, dim]".into(), &[0, 0], self.shape()));
        }
        on_devices!("embedding", self, ids, |t, i| BackendStorage::embedding(t, i, row0, vocab))
    }

    /// Gradient of [`Storage::embedding`] for a table shard of `rows` rows from `row0`: the
    /// rows of this gradient (`ids.shape + [cols]`) scatter-added at `ids`.
    pub fn embedding_backward(&self, ids: &Storage<i64>, rows: usize, row0: usize, vocab: usize) -> Result<Storage<T>> {
        if self.ndim() != ids.ndim() + 1 || self.shape()[..ids.ndim()] != *ids.shape() {
            return Err(shape_mismatch("embedding_backward: gradient vs ids".into(), ids.shape(), self.shape()));
        }
        on_devices!("embedding_backward", self, ids, |g, i| BackendStorage::embedding_backward(g, i, rows, row0, vocab))
    }

    /// The lower (`lower`) or upper triangle of the last two dims relative to `diagonal`
    /// (PyTorch `tril`/`triu`), for a shard whose last two dims start at global row `row0`
    /// and column `col0`; zeros elsewhere.
    pub fn tri(&self, lower: bool, diagonal: i64, row0: usize, col0: usize) -> Result<Storage<T>> {
        if self.ndim() < 2 {
            return Err(shape_mismatch("tril/triu: needs at least 2 dims".into(), &[0, 0], self.shape()));
        }
        on_device!(self, |s| BackendStorage::tri(s, lower, diagonal, row0, col0))
    }

    /// Index of the maximum (`max`) or minimum along `dim` (first occurrence; NaN counts as
    /// the extreme), as `i64` (PyTorch). An empty `dim` is an error (PyTorch).
    pub fn arg_reduce(&self, dim: usize, max: bool, keepdim: bool) -> Result<Storage<i64>> {
        let op = if max { "argmax" } else { "argmin" };
        self.check_dim(op, dim)?;
        if self.shape()[dim] == 0 {
            return Err(empty_reduction(op, dim));
        }
        on_device!(self, |s| BackendStorage::arg_reduce(s, dim, max, keepdim))
    }

    /// Gradient of [`Storage::index_select`]: this gradient's slices added at `ids` along `dim`
    /// of zeros whose `dim` has size `n`.
    pub fn index_add(&self, dim: usize, ids: &Storage<i64>, n: usize) -> Result<Storage<T>> {
        self.check_dim("index_select_backward", dim)?;
        if ids.ndim() != 1 || ids.len() != self.shape()[dim] {
            return Err(shape_mismatch("index_select_backward: index vs gradient".into(), self.shape(), ids.shape()));
        }
        on_devices!("index_select_backward", self, ids, |g, i| BackendStorage::index_add(g, dim, i, n))
    }

    /// Gradient of [`Storage::gather`]: this gradient (the shape of `ids`) added at the
    /// gathered positions of zeros of `shape`.
    pub fn scatter_add(&self, dim: usize, ids: &Storage<i64>, shape: &[usize]) -> Result<Storage<T>> {
        let fits = ids.shape() == self.shape()
            && shape.len() == self.ndim()
            && dim < shape.len()
            && (0..shape.len()).all(|d| d == dim || self.shape()[d] <= shape[d]);
        if !fits {
            return Err(shape_mismatch("gather_backward: gradient vs index".into(), self.shape(), ids.shape()));
        }
        on_devices!("gather_backward", self, ids, |g, i| BackendStorage::scatter_add(g, dim, i, shape))
    }

    fn check_like(&self, what: &str, other: &Storage<T>) -> Result<()> {
        self.same_device(other, what)?;
        if self.shape() != other.shape() {
            return Err(shape_mismatch(format!("{what} vs parameter"), self.shape(), other.shape()));
        }
        Ok(())
    }

    /// One SGD update of this parameter shard, in place (`buf`: the momentum buffer, present
    /// exactly when `step.momentum != 0`).
    pub fn sgd_step(&mut self, grad: &Storage<T>, buf: Option<&mut Storage<T>>, step: &SgdStep) -> Result<()> {
        self.check_like("sgd: gradient", grad)?;
        if let Some(b) = &buf {
            self.check_like("sgd: momentum buffer", b)?;
        }
        match (self, grad, buf) {
            (Storage::Cpu(w), Storage::Cpu(g), None) => BackendStorage::sgd_step(w, g, None, step),
            (Storage::Cpu(w), Storage::Cpu(g), Some(Storage::Cpu(b))) => BackendStorage::sgd_step(w, g, Some(b), step),
            (Storage::Cuda(w), Storage::Cuda(g), None) => on_cuda!(w, g => BackendStorage::sgd_step(w, g, None, step)),
            (Storage::Cuda(w), Storage::Cuda(g), Some(Storage::Cuda(b))) => {
                on_cuda!(w, g, b => BackendStorage::sgd_step(w, g, Some(b), step))
            }
            (w, g, _) => Err(device_mismatch("sgd", w.device(), g.device())),
        }
    }

    /// One AdamW update of this parameter shard and its moments, in place.
    pub fn adamw_step(
        &mut self,
        grad: &Storage<T>,
        m: &mut Storage<T>,
        v: &mut Storage<T>,
        step: &AdamWStep,
    ) -> Result<()> {
        self.check_like("adamw: gradient", grad)?;
        self.check_like("adamw: first moment", m)?;
        self.check_like("adamw: second moment", v)?;
        match (self, grad, m, v) {
            (Storage::Cpu(w), Storage::Cpu(g), Storage::Cpu(m), Storage::Cpu(v)) => {
                BackendStorage::adamw_step(w, g, m, v, step)
            }
            (Storage::Cuda(w), Storage::Cuda(g), Storage::Cuda(m), Storage::Cuda(v)) => {
                on_cuda!(w, g, m, v => BackendStorage::adamw_step(w, g, m, v, step))
            }
            (w, g, _, _) => Err(device_mismatch("adamw", w.device(), g.device())),
        }
    }
}

/// Kernels of id tensors.
impl Storage<i64> {
    /// One-hot encoding of these ids (in `[0, classes)`) as ones of `T`: `shape + [classes]`.
    /// The ids stay integers; only the ones and zeros are `T`.
    pub fn one_hot<T: Element>(&self, classes: usize) -> Result<Storage<T>> {
        crate::shape::checked_bytes::<T>("one_hot", &[self.len(), classes])?;
        match self {
            Storage::Cpu(a) => <ArrayD<T> as BackendStorage<T>>::one_hot(a, classes).map(Storage::Cpu),
            Storage::Cuda(c) => {
                on_cuda!(c => <CudaStorage<T> as BackendStorage<T>>::one_hot(c, classes).map(Storage::Cuda))
            }
        }
    }
}

/// Moves and copies: every element type.
impl<T: Scalar> Storage<T> {
    /// The comparison `op` (`Eq`, `Ne`, `Lt`, `Le`, `Gt`, `Ge`; checked by the caller) of
    /// `self` and `other` with numpy broadcasting: 1 where it holds, else 0.
    pub fn compare(&self, op: BinaryOp, other: &Storage<T>) -> Result<Storage<T>> {
        let shape = broadcast_shape(op.name(), self.shape(), other.shape())?;
        on_devices!(op.name(), self, other, |a, b| BackendStorage::compare(a, op, b, &shape))
    }

    /// `a` where this mask is non-zero, else `b` (numpy broadcasting of all three).
    pub fn where_(&self, a: &Storage<T>, b: &Storage<T>) -> Result<Storage<T>> {
        let shape = broadcast_shape("where", &broadcast_shape("where", self.shape(), a.shape())?, b.shape())?;
        match (self, a, b) {
            (Storage::Cpu(c), Storage::Cpu(x), Storage::Cpu(y)) => {
                BackendStorage::where_(c, x, y, &shape).map(Storage::Cpu)
            }
            (Storage::Cuda(c), Storage::Cuda(x), Storage::Cuda(y)) => {
                on_cuda!(c, x, y => BackendStorage::where_(c, x, y, &shape).map(Storage::Cuda))
            }
            _ if self.device() != a.device() => Err(device_mismatch("where", self.device(), a.device())),
            _ => Err(device_mismatch("where", a.device(), b.device())),
        }
    }

    /// The slices at `ids` (1-D) along `dim` (PyTorch `index_select`).
    pub fn index_select(&self, dim: usize, ids: &Storage<i64>) -> Result<Storage<T>> {
        self.check_dim("index_select", dim)?;
        if ids.ndim() != 1 {
            return Err(shape_mismatch("index_select: index must be 1-D".into(), &[0], ids.shape()));
        }
        on_devices!("index_select", self, ids, |a, i| BackendStorage::index_select(a, dim, i))
    }

    /// PyTorch `gather` along `dim` at `ids` (same rank; every other dim of `ids` no larger
    /// than this tensor's): the shape of `ids`.
    pub fn gather(&self, dim: usize, ids: &Storage<i64>) -> Result<Storage<T>> {
        self.check_dim("gather", dim)?;
        let fits = ids.ndim() == self.ndim() && (0..self.ndim()).all(|d| d == dim || ids.shape()[d] <= self.shape()[d]);
        if !fits {
            return Err(shape_mismatch("gather: index vs input".into(), self.shape(), ids.shape()));
        }
        on_devices!("gather", self, ids, |a, i| BackendStorage::gather(a, dim, i))
    }
    fn same_device(&self, other: &Self, op: &str) -> Result<()> {
        if self.device() == other.device() {
            Ok(())
        } else {
            Err(device_mismatch(op, self.device(), other.device()))
        }
    }

    /// Executes a pack plan: strided box copies from this (row-major) data into a fresh
    /// storage of shape `plan.dst_shape` on the same device, zeros where no block writes.
    pub fn pack(&self, plan: &PackPlan) -> Result<Storage<T>> {
        plan.check()?;
        if plan.src_len != self.len() {
            return Err(shape_mismatch(
                format!("pack: plan for {} source elements", plan.src_len),
                &[plan.src_len],
                self.shape(),
            ));
        }
        on_device!(self, |s| BackendStorage::pack(s, plan))
    }

    /// [`Storage::pack`] that reuses this storage when the plan is the identity.
    /// On the host a plan that keeps a prefix (padding dropped from the end) truncates the
    /// buffer instead of copying it.
    pub fn into_packed(self, plan: &PackPlan) -> Result<Storage<T>> {
        if plan.src_len != self.len() {
            return self.pack(plan);
        }
        if plan.is_identity() {
            return self.into_reshape(&plan.dst_shape);
        }
        match self {
            Storage::Cpu(a) if plan.is_prefix() => cpu::into_prefix(a, &plan.dst_shape).map(Storage::Cpu),
            other => other.pack(plan),
        }
    }

    /// Same data, new shape (same number of elements).
    pub fn into_reshape(self, shape: &[usize]) -> Result<Storage<T>> {
        let n: usize = shape.iter().product();
        if n != self.len() {
            return Err(shape_mismatch("reshape: number of elements".into(), self.shape(), shape));
        }
        on_device!(self, |s| BackendStorage::into_reshape(s, shape))
    }

    /// A copy with a new shape (same number of elements).
    pub fn reshape(&self, shape: &[usize]) -> Result<Storage<T>> {
        self.clone().into_reshape(shape)
    }

    /// The axes reordered (`axes[k]` is the source axis of output axis `k`), as a row-major copy.
    pub fn permute(&self, axes: &[usize]) -> Result<Storage<T>> {
        let mut seen = axes.to_vec();
        seen.sort_unstable();
        if seen != (0..self.ndim()).collect::<Vec<_>>() {
            return Err(shape_mismatch(format!("permute: axes {axes:?} for a tensor"), self.shape(), axes));
        }
        self.pack(&pack::permute(self.shape(), axes))
    }

    /// Dims `a` and `b` swapped, as a row-major copy.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Storage<T>> {
        self.check_dim("transpose", a.max(b))?;
        let mut axes: Vec<usize> = (0..self.ndim()).collect();
        axes.swap(a, b);
        self.pack(&pack::permute(self.shape(), &axes))
    }

    /// Broadcast to `shape` (numpy rules), as a row-major copy.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Storage<T>> {
        let plan = pack::broadcast(self.shape(), shape)
            .ok_or_else(|| shape_mismatch("expand: shapes do not broadcast".into(), shape, self.shape()))?;
        self.pack(&plan)
    }

    /// The box of `extents` at `start`, as a row-major copy.
    pub fn slice(&self, start: &[usize], extents: &[usize]) -> Result<Storage<T>> {
        let inside = start.len() == self.ndim()
            && extents.len() == self.ndim()
            && (0..self.ndim()).all(|d| start[d] + extents[d] <= self.shape()[d]);
        if !inside {
            return Err(shape_mismatch(format!("slice at {start:?}: box outside the tensor"), self.shape(), extents));
        }
        self.pack(&pack::slice(self.shape(), start, extents))
    }

    /// Concatenation of `parts` (same device, same shape except `dim`) along `dim`.
    pub fn cat(parts: &[&Storage<T>], dim: usize) -> Result<Storage<T>> {
        let Some(first) = parts.first() else {
            return Err(Error::InvalidArgument { context: "cat".into(), reason: "no tensors to concatenate".into() });
        };
        first.check_dim("cat", dim)?;
        for p in parts {
            let same = p.ndim() == first.ndim() && (0..p.ndim()).all(|d| d == dim || p.shape()[d] == first.shape()[d]);
            if !same {
                return Err(shape_mismatch(format!("cat along dim {dim}"), first.shape(), p.shape()));
            }
            first.same_device(p, "cat")?;
        }
        // Same device checked above: every part is in the first one's arm.
        match first {
            Storage::Cpu(_) => {
                let arrays: Vec<&ArrayD<T>> = parts.iter().filter_map(|p| p.as_cpu()).collect();
                BackendStorage::cat(&arrays, dim).map(Storage::Cpu)
            }
            Storage::Cuda(c) => on_cuda!(c => {
                let rest = parts[1..].iter().filter_map(|p| if let Storage::Cuda(c) = p { Some(c) } else { None });
                let parts: Vec<&CudaStorage<T>> = std::iter::once(c).chain(rest).collect();
                BackendStorage::cat(&parts, dim).map(Storage::Cuda)
            }),
        }
    }

    /// This tensor placed at `start` inside zeros of `shape` (the gradient of a slice).
    pub fn pad_into(&self, shape: &[usize], start: &[usize]) -> Result<Storage<T>> {
        let inside = shape.len() == self.ndim()
            && start.len() == self.ndim()
            && (0..self.ndim()).all(|d| start[d] + self.shape()[d] <= shape[d]);
        if !inside {
            return Err(shape_mismatch(format!("pad at {start:?}: box outside the tensor"), shape, self.shape()));
        }
        self.pack(&pack::pad(self.shape(), shape, start))
    }

    /// Element-type conversion.
    pub fn cast<U: Scalar>(&self) -> Result<Storage<U>> {
        on_device!(self, |s| BackendStorage::cast::<U>(s))
    }

    fn check_dim(&self, op: &str, dim: usize) -> Result<()> {
        if dim < self.ndim() {
            Ok(())
        } else {
            Err(Error::DimOutOfRange { context: op.into(), dim: dim as isize, ndim: self.ndim() })
        }
    }
}

/// Executes `plan` on a host array without wrapping it (packing the caller's global tensor).
pub(crate) fn pack_host<T: Scalar>(a: &ArrayD<T>, plan: &PackPlan) -> Result<ArrayD<T>> {
    plan.check()?;
    let data = cpu::row_major(a);
    if data.len() != plan.src_len {
        return Err(shape_mismatch("pack: source".into(), &[plan.src_len], a.shape()));
    }
    cpu::pack(&data, plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{Distribution, UnaryOp::*};
    use ndarray::{Array2, Axis, IxDyn};

    fn arr(shape: &[usize], f: impl Fn(usize) -> f64) -> ArrayD<f64> {
        let mut i = 0;
        ArrayD::from_shape_fn(IxDyn(shape), |_| {
            i += 1;
            f(i)
        })
    }

    fn cpu(s: Storage<f64>) -> ArrayD<f64> {
        s.into_host().unwrap()
    }

    fn close(a: &ArrayD<f64>, b: &ArrayD<f64>) -> bool {
        a.shape() == b.shape() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-12 * (1.0 + y.abs()))
    }

    #[test]
    fn unary_ops_match_scalar_references() {
        let x = arr(&[3, 4], |i| i as f64 * 0.37 - 2.0);
        let pos = x.mapv(f64::abs).mapv(|v| v + 0.1);
        let s = Storage::Cpu(x.clone());
        let p = Storage::Cpu(pos.clone());
        // (op, needs a positive input, scalar reference)
        type Case = (UnaryOp, bool, fn(f64) -> f64);
        let cases: [Case; 10] = [
            (Neg, false, |v| -v),
            (Exp, false, f64::exp),
            (Log, true, f64::ln),
            (Relu, false, |v| v.max(0.0)),
            (Tanh, false, f64::tanh),
            (Sqrt, true, f64::sqrt),
            (ReluGrad, false, |v| if v > 0.0 { 1.0 } else { 0.0 }),
            (TanhGrad, false, |y| 1.0 - y * y),
            (SqrtGrad, true, |y| 0.5 / y),
            // The tanh form, written out here independently of `op::gelu`.
            (Gelu, false, |v| {
                0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
            }),
        ];
        for (op, positive, f) in cases {
            let (st, input) = if positive { (&p, &pos) } else { (&s, &x) };
            assert!(close(&cpu(st.unary(op).unwrap()), &input.mapv(f)), "{op}");
        }
        assert_eq!(cpu(s.unary(AddScalar(1.5)).unwrap()), x.mapv(|v| v + 1.5));
        assert_eq!(cpu(s.unary(MulScalar(-2.0)).unwrap()), x.mapv(|v| v * -2.0));
        let h = 1e-6;
        let fd = (cpu(s.unary(AddScalar(h)).unwrap().unary(Gelu).unwrap())
            - cpu(s.unary(AddScalar(-h)).unwrap().unary(Gelu).unwrap()))
            / (2.0 * h);
        let g = cpu(s.unary(GeluGrad).unwrap());
        assert!(fd.iter().zip(&g).all(|(a, b)| (a - b).abs() < 1e-6), "gelu_grad vs finite differences");
    }

    #[test]
    fn activation_kernels_match_scalar_references() {
        let x = arr(&[3, 4], |i| i as f64 * 0.37 - 2.0);
        let s = Storage::Cpu(x.clone());
        type Case = (UnaryOp, fn(f64) -> f64);
        let cases: [Case; 8] = [
            (Silu, |v| v / (1.0 + (-v).exp())),
            (Sigmoid, |v| 1.0 / (1.0 + (-v).exp())),
            (Softplus { beta: 1.0, threshold: 20.0 }, |v| (1.0 + v.exp()).ln()),
            (Pow(3.0), |v| v * v * v),
            (Abs, f64::abs),
            (Clamp { lo: -1.0, hi: 0.5 }, |v| v.clamp(-1.0, 0.5)),
            (Sign, f64::signum),
            (NonZero, |v| if v != 0.0 { 1.0 } else { 0.0 }),
        ];
        for (op, f) in cases {
            assert!(close(&cpu(s.unary(op).unwrap()), &x.mapv(f)), "{op}");
        }
        let p = Storage::Cpu(x.mapv(|v| v.abs() + 0.1));
        assert!(close(&cpu(p.unary(Rsqrt).unwrap()), &x.mapv(|v| 1.0 / (v.abs() + 0.1).sqrt())));
        // Derivatives against central differences of the forward kernels.
        let h = 1e-6;
        let derivs = [
            (Silu, SiluGrad, false),
            (Sigmoid, SigmoidGrad, true),
            (Softplus { beta: 2.0, threshold: 1.0 }, SoftplusGrad { beta: 2.0, threshold: 1.0 }, false),
            (Pow(-1.5), PowGrad(-1.5), false),
            (Rsqrt, RsqrtGrad, true),
            (GeluErf, GeluErfGrad, false),
        ];
        for (f, df, of_output) in derivs {
            let base = if matches!(f, Pow(_) | Rsqrt) { &p } else { &s };
            let fd = (cpu(base.unary(AddScalar(h)).unwrap().unary(f).unwrap())
                - cpu(base.unary(AddScalar(-h)).unwrap().unary(f).unwrap()))
                / (2.0 * h);
            let at = if of_output { base.unary(f).unwrap() } else { base.clone() };
            let d = cpu(at.unary(df).unwrap());
            assert!(fd.iter().zip(&d).all(|(a, b)| (a - b).abs() < 1e-5), "{df}");
        }
        // The dropout scale: 0 below p, 1/(1-p) above.
        let u = Storage::Cpu(arr(&[4], |i| i as f64 * 0.25 - 0.1));
        assert_eq!(cpu(u.unary(DropoutScale(0.5)).unwrap()).into_raw_vec_and_offset().0, vec![0.0, 0.0, 2.0, 2.0]);
    }

    #[test]
    fn selection_kernels_match_ndarray_references() {
        let a = arr(&[3, 4], |i| ((i * 5) % 7) as f64);
        let s = Storage::Cpu(a.clone());
        // where with a broadcast row mask
        let m = Storage::Cpu(ArrayD::from_shape_vec(IxDyn(&[4]), vec![1.0, 0.0, 0.0, 1.0]).unwrap());
        let z = Storage::Cpu(ArrayD::from_elem(IxDyn(&[]), -1.0));
        let w = cpu(m.where_(&s, &z).unwrap());
        assert_eq!(
            w,
            ArrayD::from_shape_fn(IxDyn(&[3, 4]), |ix| if ix[1] % 3 == 0 { a[[ix[0], ix[1]]] } else { -1.0 })
        );
        // tril of a shard starting at row 1, column 2 of the global matrix
        let t = cpu(s.tri(true, 0, 1, 2).unwrap());
        assert_eq!(
            t,
            ArrayD::from_shape_fn(IxDyn(&[3, 4]), |ix| if ix[1] + 2 <= ix[0] + 1 { a[[ix[0], ix[1]]] } else { 0.0 })
        );
        // argmax / argmin (first occurrence)
        let am = s.arg_reduce(1, true, false).unwrap().into_host().unwrap();
        for (r, &v) in am.iter().enumerate() {
            let row = a.index_axis(Axis(0), r);
            let mx = row.iter().copied().fold(f64::MIN, f64::max);
            assert_eq!(v as usize, row.iter().position(|&x| x == mx).unwrap());
        }
        assert!(matches!(
            Storage::Cpu(arr(&[2, 0], |_| 0.0)).arg_reduce(1, true, false),
            Err(Error::InvalidArgument { .. })
        ));
        // cat, pad, index_select, gather
        let c = cpu(Storage::cat(&[&s, &s.slice(&[0, 0], &[3, 1]).unwrap()], 1).unwrap());
        assert_eq!(c, ndarray::concatenate(Axis(1), &[a.view(), a.slice(ndarray::s![.., 0..1]).into_dyn()]).unwrap());
        let padded = cpu(s.pad_into(&[5, 6], &[1, 2]).unwrap());
        assert_eq!(padded.slice(ndarray::s![1..4, 2..6]).into_dyn(), a);
        assert_eq!(padded.sum(), a.sum());
        let ids = Storage::Cpu(ArrayD::from_shape_vec(IxDyn(&[3]), vec![3i64, 0, 3]).unwrap());
        assert_eq!(cpu(s.index_select(1, &ids).unwrap()), a.select(Axis(1), &[3, 0, 3]));
        let back = cpu(Storage::Cpu(a.select(Axis(1), &[3, 0, 3])).index_add(1, &ids, 4).unwrap());
        assert_eq!(back.index_axis(Axis(1), 3), a.index_axis(Axis(1), 3).mapv(|v| 2.0 * v));
        assert_eq!(back.index_axis(Axis(1), 1).sum(), 0.0);
        let gi = Storage::Cpu(ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![1i64, 3, 0, 0]).unwrap());
        let g = cpu(s.gather(1, &gi).unwrap());
        assert_eq!(g.into_raw_vec_and_offset().0, vec![a[[0, 1]], a[[0, 3]], a[[1, 0]], a[[1, 0]]]);
        let sc = cpu(Storage::Cpu(arr(&[2, 2], |_| 1.0)).scatter_add(1, &gi, &[3, 4]).unwrap());
        assert_eq!((sc[[1, 0]], sc[[0, 1]], sc[[0, 3]], sc.sum()), (2.0, 1.0, 1.0, 4.0));
        assert!(s.gather(1, &Storage::Cpu(ArrayD::from_elem(IxDyn(&[1, 1]), 4i64))).is_err());
        // NaN-propagating max/min folds
        let n = Storage::Cpu(ArrayD::from_shape_vec(IxDyn(&[3]), vec![1.0, f64::NAN, 3.0]).unwrap());
        assert!(cpu(n.reduce(Reduction::Max, &[0], false).unwrap()).iter().all(|v| v.is_nan()));
        assert!(cpu(n.reduce(Reduction::Min, &[0], false).unwrap()).iter().all(|v| v.is_nan()));
    }

    #[test]
    fn binary_ops_broadcast_like_ndarray() {
        let a = arr(&[2, 3, 4], |i| i as f64);
        let b = arr(&[3, 1], |i| i as f64 + 0.5);
        let (sa, sb) = (Storage::Cpu(a.clone()), Storage::Cpu(b.clone()));
        assert_eq!(cpu(sa.binary(BinaryOp::Add, &sb).unwrap()), &a + &b);
        assert_eq!(cpu(sa.binary(BinaryOp::Sub, &sb).unwrap()), &a - &b);
        assert_eq!(cpu(sa.binary(BinaryOp::Mul, &sb).unwrap()), &a * &b);
        assert_eq!(cpu(sa.binary(BinaryOp::Div, &sb).unwrap()), &a / &b);
        let eq = cpu(sa.binary(BinaryOp::Eq, &sa).unwrap());
        assert!(eq.iter().all(|&v| v == 1.0));
        let bad = sa.binary(BinaryOp::Add, &Storage::Cpu(arr(&[5], |i| i as f64)));
        assert!(matches!(bad, Err(Error::ShapeMismatch { .. })));
    }

    #[test]
    fn reductions_over_dims() {
        let a = arr(&[2, 3, 4], |i| ((i * 7) % 11) as f64);
        let s = Storage::Cpu(a.clone());
        let sum = cpu(s.reduce(Reduction::Sum, &[2, 0], false).unwrap());
        assert_eq!(sum, a.sum_axis(Axis(2)).sum_axis(Axis(0)));
        let mean = cpu(s.reduce(Reduction::Mean, &[1], true).unwrap());
        assert!(close(&mean, &a.mean_axis(Axis(1)).unwrap().insert_axis(Axis(1))));
        let max = cpu(s.reduce(Reduction::Max, &[0, 1, 2], false).unwrap());
        assert_eq!(max.shape(), &[] as &[usize]);
        assert_eq!(max.iter().next(), a.iter().copied().reduce(f64::max).as_ref());
        assert!(matches!(s.reduce(Reduction::Sum, &[3], false), Err(Error::DimOutOfRange { .. })));
        let min = cpu(s.reduce(Reduction::Min, &[1], false).unwrap());
        assert_eq!(min, a.fold_axis(Axis(1), f64::INFINITY, |m, &v| m.min(v)));
        // Max and min propagate NaN (PyTorch), whatever its position.
        let mut n = a.clone();
        n[[1, 2, 0]] = f64::NAN;
        let n = Storage::Cpu(n);
        for kind in [Reduction::Max, Reduction::Min] {
            let r = cpu(n.reduce(kind, &[1, 2], false).unwrap());
            assert!(!r[[0]].is_nan() && r[[1]].is_nan(), "{kind:?}: {r:?}");
        }
    }

    #[test]
    fn softmax_rows_and_backward() {
        let x = arr(&[3, 5], |i| (i as f64 * 0.7).sin() * 3.0);
        let s = Storage::Cpu(x.clone());
        for dim in [0, 1] {
            let y = cpu(s.softmax(dim, SoftmaxKind::Softmax).unwrap());
            let e = x.mapv(f64::exp);
            let want = &e / &e.sum_axis(Axis(dim)).insert_axis(Axis(dim));
            assert!(close(&y, &want), "softmax dim {dim}");
            let ly = cpu(s.softmax(dim, SoftmaxKind::LogSoftmax).unwrap());
            assert!(close(&ly, &want.mapv(f64::ln)), "log_softmax dim {dim}");
            // Backward against finite differences of sum(g * softmax(x)).
            let g = arr(&[3, 5], |i| (i % 4) as f64 - 1.5);
            for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
                let out = s.softmax(dim, kind).unwrap();
                let gx = cpu(out.softmax_backward(&Storage::Cpu(g.clone()), dim, kind).unwrap());
                let f = |x: &ArrayD<f64>| (&cpu(Storage::Cpu(x.clone()).softmax(dim, kind).unwrap()) * &g).sum();
                for (k, gk) in gx.iter().enumerate() {
                    let (mut xp, mut xm) = (x.clone(), x.clone());
                    xp.as_slice_mut().unwrap()[k] += 1e-6;
                    xm.as_slice_mut().unwrap()[k] -= 1e-6;
                    let fd = (f(&xp) - f(&xm)) / 2e-6;
                    assert!((fd - gk).abs() < 1e-6, "{kind:?} dim {dim} element {k}: {fd} vs {gk}");
                }
            }
        }
    }

    #[test]
    fn matmul_2d_batched_and_broadcast_rhs() {
        let a = arr(&[2, 3, 4], |i| i as f64 - 5.0);
        let b = arr(&[4, 2], |i| (i as f64) * 0.5);
        let b3 = arr(&[2, 4, 2], |i| (i % 5) as f64);
        let dot = |x: ndarray::ArrayView2<f64>, y: ndarray::ArrayView2<f64>| x.dot(&y);
        let c = cpu(Storage::Cpu(a.clone()).matmul(&Storage::Cpu(b.clone())).unwrap());
        let c3 = cpu(Storage::Cpu(a.clone()).matmul(&Storage::Cpu(b3.clone())).unwrap());
        let b2: Array2<f64> = b.clone().into_dimensionality().unwrap();
        for i in 0..2 {
            let ai = a.index_axis(Axis(0), i).into_dimensionality().unwrap();
            assert_eq!(c.index_axis(Axis(0), i), dot(ai, b2.view()).into_dyn());
            let bi = b3.index_axis(Axis(0), i).into_dimensionality().unwrap();
            assert_eq!(c3.index_axis(Axis(0), i), dot(ai, bi).into_dyn());
        }
        // A column-major input computes the same.
        let at = Storage::Cpu(a.index_axis(Axis(0), 0).t().to_owned().reversed_axes().into_dyn());
        assert_eq!(cpu(at.matmul(&Storage::Cpu(b)).unwrap()), c.index_axis(Axis(0), 0).to_owned());
        let bad = Storage::Cpu(a).matmul(&Storage::Cpu(b3).reshape(&[8, 2]).unwrap());
        assert!(matches!(bad, Err(Error::ShapeMismatch { .. })), "{bad:?}");
    }

    #[test]
    fn strided_copies_transpose_slice_broadcast() {
        let a = arr(&[2, 3, 4], |i| i as f64);
        let s = Storage::Cpu(a.clone());
        let t = cpu(s.transpose(0, 2).unwrap());
        assert_eq!(t, a.view().permuted_axes(vec![2, 1, 0]).to_owned());
        assert!(t.is_standard_layout());
        assert_eq!(cpu(s.permute(&[1, 2, 0]).unwrap()), a.view().permuted_axes(vec![1, 2, 0]).to_owned());
        assert_eq!(cpu(s.slice(&[1, 1, 0], &[1, 2, 3]).unwrap()), a.slice(ndarray::s![1..2, 1..3, 0..3]).into_dyn());
        let row = Storage::Cpu(arr(&[1, 4], |i| i as f64));
        let b = cpu(row.broadcast_to(&[2, 3, 4]).unwrap());
        assert_eq!(b, row.as_cpu().unwrap().broadcast(vec![2, 3, 4]).unwrap().to_owned());
        assert!(s.slice(&[1, 0, 0], &[2, 1, 1]).is_err());
        assert!(s.permute(&[0, 0, 1]).is_err());
        assert!(row.broadcast_to(&[3, 5]).is_err());
        // Non-standard input layouts are read correctly.
        let f = Storage::Cpu(a.view().reversed_axes().to_owned());
        assert_eq!(cpu(f.slice(&[0, 0, 0], &[4, 3, 2]).unwrap()), a.view().reversed_axes().to_owned());
    }

    #[test]
    fn embedding_gather_scatter_and_one_hot() {
        let table = arr(&[4, 3], |i| i as f64);
        let ids = ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![3i64, 0, 1, 3]).unwrap();
        // A shard holding rows 2..4 of a 5-row table.
        let shard = Storage::Cpu(table.slice(ndarray::s![2..4, ..]).to_owned().into_dyn());
        let out = cpu(shard.embedding(&Storage::Cpu(ids.clone()), 2, 5).unwrap());
        assert_eq!(out.shape(), &[2, 2, 3]);
        assert_eq!(out.slice(ndarray::s![0, 0, ..]), table.slice(ndarray::s![3, ..]));
        assert!(out.slice(ndarray::s![0, 1, ..]).iter().all(|&v| v == 0.0));
        let g = Storage::Cpu(arr(&[2, 2, 3], |i| i as f64));
        let gt = cpu(g.embedding_backward(&Storage::Cpu(ids.clone()), 2, 2, 5).unwrap());
        // Row 3 (local 1) gets ids (0,0) and (1,1): rows 0 and 3 of g.
        let gd = g.as_cpu().unwrap().clone().into_shape_with_order((4, 3)).unwrap();
        assert_eq!(gt.slice(ndarray::s![1, ..]), &gd.row(0) + &gd.row(3));
        assert!(gt.slice(ndarray::s![0, ..]).iter().all(|&v| v == 0.0));
        let oh = cpu(Storage::Cpu(ids.clone()).one_hot::<f64>(4).unwrap());
        assert_eq!(oh.sum_axis(Axis(2)), ArrayD::<f64>::ones(IxDyn(&[2, 2])));
        assert_eq!(oh[[0, 0, 3]], 1.0);
        for bad in [-1i64, 4, i64::MIN] {
            let bad = Storage::Cpu(ArrayD::from_elem(IxDyn(&[1]), bad)).one_hot::<f64>(4);
            assert!(matches!(bad, Err(Error::InvalidArgument { .. })));
        }
        assert!(shard.embedding(&Storage::Cpu(ArrayD::from_elem(IxDyn(&[1]), 5i64)), 2, 5).is_err());
    }

    #[test]
    fn creation_cast_and_random_fill() {
        let z = Storage::<f32>::full(&Target::Cpu, &[2, 3], 2.5).unwrap();
        assert_eq!(z, ArrayD::from_elem(IxDyn(&[2, 3]), 2.5f32));
        assert_eq!(z.device(), Device::Cpu);
        let c = z.cast::<f64>().unwrap();
        assert_eq!(c, ArrayD::from_elem(IxDyn(&[2, 3]), 2.5f64));
        // A random shard is the same slice of the full random tensor.
        let fill = RandomFill { seed: 5, offset: 3, dist: Distribution::Normal };
        let full = Storage::<f64>::random(&Target::Cpu, &fill, &[5, 6], &[0, 0], &[5, 6]).unwrap();
        let part = Storage::<f64>::random(&Target::Cpu, &fill, &[5, 6], &[2, 1], &[3, 4]).unwrap();
        assert_eq!(part, full.slice(&[2, 1], &[3, 4]).unwrap());
        let mut s = crate::rng::Stream::new(5, 3);
        assert_eq!(full.as_cpu().unwrap()[[1, 2]], s.normal::<f64>(8));
    }

    #[test]
    fn optimizer_updates_match_scalar_formulas() {
        let w0 = arr(&[5], |i| i as f64 - 2.0);
        let g = Storage::Cpu(arr(&[5], |i| (i as f64).sin()));
        let gv = g.as_cpu().unwrap().clone();
        let mut w = Storage::Cpu(w0.clone());
        let mut buf = w.new_full(&[5], 0.0).unwrap();
        let step = SgdStep { lr: 0.1, momentum: 0.9, weight_decay: 0.01, first: true };
        w.sgd_step(&g, Some(&mut buf), &step).unwrap();
        let d = &gv + &w0.mapv(|x| 0.01 * x);
        assert!(close(&cpu(buf.clone()), &d));
        assert!(close(&cpu(w.clone()), &(&w0 - &d.mapv(|x| 0.1 * x))));
        w.sgd_step(&g, Some(&mut buf), &SgdStep { first: false, ..step }).unwrap();
        let w1 = &w0 - &d.mapv(|x| 0.1 * x);
        let d2 = &d.mapv(|x| 0.9 * x) + &(&gv + &w1.mapv(|x| 0.01 * x));
        assert!(close(&cpu(w.clone()), &(&w1 - &d2.mapv(|x| 0.1 * x))));

        let mut w = Storage::Cpu(w0.clone());
        let (mut m, mut v) = (w.new_full(&[5], 0.0).unwrap(), w.new_full(&[5], 0.0).unwrap());
        let p = AdamWStep {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
            bias_correction1: 0.1,
            bias_correction2: 1.0 - 0.999,
        };
        w.adamw_step(&g, &mut m, &mut v, &p).unwrap();
        // First step: m/c1 = g, v/c2 = g², so the update is lr·g/(|g| + eps).
        let want = w0.mapv(|x| x - 0.01 * 0.1 * x) - gv.mapv(|x| 0.01 * x / (x.abs() + 1e-8));
        assert!(close(&cpu(w.clone()), &want));
        assert!(matches!(w.sgd_step(&Storage::Cpu(arr(&[4], |_| 0.0)), None, &step), Err(Error::ShapeMismatch { .. })));
    }

    #[test]
    fn pack_reuses_identity_plans_and_checks_sizes() {
        let a = Storage::Cpu(arr(&[4, 3], |i| i as f64));
        let same = a.clone().into_packed(&pack::split(&[4, 3], 0, 1, &[4, 3])).unwrap();
        assert_eq!(same.shape(), &[1, 4, 3]);
        let padded = a.pack(&pack::split(&[4, 3], 0, 1, &[5, 3])).unwrap();
        assert_eq!(padded.as_cpu().unwrap().slice(ndarray::s![0, 4, ..]).sum(), 0.0);
        assert!(a.pack(&pack::split(&[5, 3], 0, 1, &[5, 3])).is_err());
    }

    #[test]
    fn padded_packs_write_zeros_only_in_the_gaps() {
        // 1..=12 (`arr` counts from 1).
        let a = Storage::Cpu(arr(&[3, 4], |i| i as f64));
        // Columns split in two blocks of 4 rows (one padding row each).
        let cols = a.pack(&pack::split(&[3, 4], 1, 2, &[4, 2])).unwrap();
        let want = [1., 2., 5., 6., 9., 10., 0., 0., 3., 4., 7., 8., 11., 12., 0., 0.];
        assert_eq!(cpu(cols).iter().copied().collect::<Vec<_>>(), want);
        // Rows split as torch.chunk (2, 1) into blocks of 2 rows: padding at the end only.
        let rows = a.pack(&pack::split(&[3, 4], 0, 2, &[2, 4])).unwrap();
        let want: Vec<f64> = (1..=12).map(f64::from).chain([0.0; 4]).collect();
        assert_eq!(cpu(rows).iter().copied().collect::<Vec<_>>(), want);
        // In the middle of a zero destination.
        let mid = a.pack(&pack::pad(&[3, 4], &[5, 4], &[1, 0])).unwrap();
        let want: Vec<f64> = [0.0; 4].into_iter().chain((1..=12).map(f64::from)).chain([0.0; 4]).collect();
        assert_eq!(cpu(mid).iter().copied().collect::<Vec<_>>(), want);
    }

    #[test]
    fn joins_that_only_drop_trailing_padding_truncate_and_equal_the_copy() {
        // 7 rows over 3 blocks of 3 (torch.chunk: 3, 3, 1): padding only at the end of the
        // last block along the leading dim, so the join is a prefix; along dim 1 it is not.
        for (block, n, dim, dst) in [
            (vec![3, 2], 3, 0, vec![7, 2]),
            (vec![3, 2], 2, 0, vec![5, 2]),
            (vec![2, 3], 3, 1, vec![2, 7]),
            (vec![0, 2], 2, 0, vec![0, 2]),
        ] {
            let plan = pack::join(&block, n, dim, &dst);
            let len = n * block.iter().product::<usize>();
            let src = Storage::Cpu(arr(&[len], |i| i as f64 + 1.0));
            assert_eq!(plan.is_prefix(), dim == 0, "{block:?} {n} {dim} {dst:?}");
            let fast = src.clone().into_packed(&plan).unwrap();
            let copied = src.pack(&plan).unwrap();
            assert_eq!(fast.shape(), dst.as_slice());
            assert_eq!(cpu(fast), cpu(copied), "{block:?} {n} {dim} {dst:?}");
        }
        // A source that starts inside its buffer (a sliced view) is cut right too.
        let whole = arr(&[6], |i| i as f64);
        let view = Storage::Cpu(whole.slice(ndarray::s![2..]).to_owned().into_dyn());
        let tail = Storage::Cpu(whole.slice_move(ndarray::s![2..]).into_dyn());
        let plan = pack::join(&[2], 2, 0, &[3]);
        assert_eq!(cpu(tail.into_packed(&plan).unwrap()), cpu(view.pack(&plan).unwrap()));
    }
}
