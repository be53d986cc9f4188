//! `CudaStorage<T>`: a row-major shard in the memory of one [`CudaDevice`], and the CUDA arm
//! of the kernel surface (feature `cuda`).
//!
//! All work is queued on the device handle's stream (cuBLAS and the NVRTC kernels of
//! `crate::cuda::source` alike). The buffer is shared behind an `Arc`, so cloning a storage (as
//! every `DTensor` clone does) and reshaping it are free; in-place updates copy first when the
//! buffer is shared. A zero-sized shard holds no allocation (the driver rejects 0-byte
//! allocations) and launches nothing.
//!
//! On the device: every unary and binary op (broadcast by strides, no copies), reductions,
//! softmax, pack plans (one launch per plan), embedding, casts, fills, the optimizer updates,
//! Philox random fills bit-identical to the host's, cuBLAS gemm / strided-batched gemm, `where`
//! (broadcast by strides), `tril`/`triu` of a shard at any global offset, `argmax`/`argmin`
//! (first index on ties, NaN as the extreme), `cat`, and `index_select`, `gather` and their
//! backwards. Ids are `i64` buffers for every element type (never a float, which would round
//! them), and `argmax`/`argmin` write `i64` indices. Invalid ids are the host's typed
//! [`Error::InvalidArgument`], checked on the device before use. The backwards sum each output
//! element's contributions in index order instead of with atomics: deterministic, and
//! bit-identical to the host. Inputs the kernels
//! cannot index are typed errors: more than [`MAX_DIMS`](crate::cuda::source::MAX_DIMS) dims,
//! or dimensions beyond cuBLAS' 32-bit limit.
//!
//! The floats all have these kernels: f32 and f64 compute in themselves, bf16 and f16 load
//! into f32, compute, and round each result once, as the host kernels do (matmul through
//! `cublasGemmEx` with f32 accumulation; the embedding backward, which adds with atomics,
//! through an f32 copy of the gradient). The integers have the kernels that move elements
//! (fills, pack plans, `cat`, `index_select`, `gather`) and the casts to and from every dtype
//! (Rust's `as`, as on the host); every other op needs a float tensor, so they reach no other
//! kernel.

use super::backend::BackendStorage;
use crate::cuda::args::{self, binary_code, reduce_code, unary_code, Gather, Reduce, Strided};
use crate::cuda::counters::{count, Work};
use crate::cuda::source::{BLOCK, ID_DTYPE};
use crate::cuda::{cuda_err, CudaDevice};
use crate::element::{Element, Scalar};
use crate::error::{Error, Result};
use crate::layout::pack::PackPlan;
use crate::op::{AdamWStep, BinaryOp, Distribution, RandomFill, Reduction, SgdStep, SoftmaxKind, UnaryOp};
use cudarc::cublas::{sys::cublasOperation_t, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, CudaViewMut, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg,
};
use ndarray::{ArrayD, IxDyn};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

// SAFETY: plain old data with the layout of the C struct (repr(C), same field order).
unsafe impl DeviceRepr for Strided {}
// SAFETY: plain old data with the layout of the C struct (repr(C), same field order).
unsafe impl DeviceRepr for Reduce {}
// SAFETY: plain old data with the layout of the C struct (repr(C), same field order).
unsafe impl DeviceRepr for Gather {}

/// One thread per element, grid-stride loops beyond 2²⁰ blocks.
fn per_element(n: u64) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as u64).clamp(1, 1 << 20) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// One block per output (reductions, softmax lanes), grid-stride beyond 2²⁰.
fn per_block(n: u64) -> LaunchConfig {
    let blocks = n.clamp(1, 1 << 20) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

fn launch(name: &str, args: &mut LaunchArgs<'_>, cfg: LaunchConfig) -> Result<()> {
    count(Work::Launch);
    // SAFETY: every caller passes the arguments of the kernel's C signature in order, with
    // buffers of the lengths the kernel indexes (checked shapes, `n` = the element count).
    unsafe { args.launch(cfg) }.map(|_| ()).map_err(|e| cuda_err(&format!("launching {name}"), e))
}

fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Unsupported {
        op: "matmul".into(),
        reason: format!("{what} = {v} exceeds cuBLAS' 32-bit dimension limit"),
    })
}

/// `data`, mutably: copied on `device` first when shared with another storage.
fn unshare<'a, T: Scalar>(
    data: &'a mut Option<Arc<CudaSlice<T>>>,
    device: &CudaDevice,
) -> Result<Option<&'a mut CudaSlice<T>>> {
    let Some(d) = data else { return Ok(None) };
    if Arc::get_mut(d).is_none() {
        count(Work::DeviceToDevice);
        let copy = device.stream().clone_dtod(&**d).map_err(|e| cuda_err("copy before an in-place update", e))?;
        *d = Arc::new(copy);
    }
    Ok(Arc::get_mut(d))
}

/// Enqueues `o[i] = a[i] op b[i]` over `n` elements of `dtype` at raw device addresses on
/// `device`'s stream, `b` one element broadcast to all when `scalar_b`: the element-wise step
/// of a reduction over buffers that no storage owns (the device collectives of `cuda-threads`).
/// Errors: [`Error::Unsupported`] for a dtype without the `binary` kernel (the integers).
///
/// # Safety
/// `a` and `o` hold `n` elements of `dtype` (`b` `n`, or 1 when `scalar_b`) in memory of
/// `device`'s GPU that stays alive until the stream has passed the kernel; `o` may be `a`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn binary_raw(
    device: &CudaDevice,
    dtype: crate::element::DType,
    op: BinaryOp,
    a: u64,
    b: u64,
    o: u64,
    n: usize,
    scalar_b: bool,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let b_len = if scalar_b { 1 } else { n };
    let g = args::broadcast(op.name(), &[n], &[n], &[b_len])?;
    let (n, code) = (n as u64, binary_code(op)?);
    let f = device.kernels()?.function("binary", dtype.name())?;
    let mut l = device.stream().launch_builder(&f);
    l.arg(&a).arg(&b).arg(&o).arg(&n).arg(&code).arg(&g);
    launch(op.name(), &mut l, per_element(n))
}

/// A row-major shard in device memory.
pub struct CudaStorage<T: Scalar> {
    /// `None` for zero-sized shards.
    data: Option<Arc<CudaSlice<T>>>,
    shape: Vec<usize>,
    device: Arc<CudaDevice>,
}

impl<T: Scalar> Clone for CudaStorage<T> {
    fn clone(&self) -> Self {
        CudaStorage { data: self.data.clone(), shape: self.shape.clone(), device: Arc::clone(&self.device) }
    }
}

impl<T: Scalar> fmt::Debug for CudaStorage<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cuda<{}>({:?} on {:?})", T::DTYPE, self.shape, self.device)
    }
}

impl<T: Scalar> CudaStorage<T> {
    /// Copies a host array to `device` (row-major).
    pub fn from_host(device: &Arc<CudaDevice>, a: &ArrayD<T>) -> Result<Self> {
        let std = a.as_standard_layout();
        let data = std.as_slice().ok_or_else(|| Error::Unsupported {
            op: "host to device copy".into(),
            reason: "the host array is not contiguous".into(),
        })?;
        Self::from_slice(device, a.shape(), data)
    }

    /// Copies row-major `data` of `shape` to `device`.
    pub fn from_slice(device: &Arc<CudaDevice>, shape: &[usize], data: &[T]) -> Result<Self> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(Error::ShapeMismatch {
                context: "host to device copy".into(),
                expected: shape.to_vec(),
                actual: vec![data.len()],
            });
        }
        let data = if n == 0 {
            None
        } else {
            count(Work::HostToDevice(std::mem::size_of_val(data)));
            Some(Arc::new(device.stream().clone_htod(data).map_err(|e| cuda_err("host to device copy", e))?))
        };
        Ok(CudaStorage { data, shape: shape.to_vec(), device: Arc::clone(device) })
    }

    /// A zero-filled shard.
    pub fn zeros(device: &Arc<CudaDevice>, shape: &[usize]) -> Result<Self> {
        let n: usize = shape.iter().product();
        let data = if n == 0 {
            None
        } else {
            Some(Arc::new(device.stream().alloc_zeros::<T>(n).map_err(|e| cuda_err("device allocation", e))?))
        };
        Ok(CudaStorage { data, shape: shape.to_vec(), device: Arc::clone(device) })
    }

    /// A shard whose every element the caller's kernel writes before anyone reads it.
    fn uninit(device: &Arc<CudaDevice>, shape: &[usize]) -> Result<Self> {
        let n: usize = shape.iter().product();
        let data = if n == 0 {
            None
        } else {
            // SAFETY: the caller's kernel writes all n elements (queued on this stream) before
            // any read of them.
            Some(Arc::new(unsafe { device.stream().alloc::<T>(n) }.map_err(|e| cuda_err("device allocation", e))?))
        };
        Ok(CudaStorage { data, shape: shape.to_vec(), device: Arc::clone(device) })
    }

    fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// The shard's bytes, for a collective on the device (`None` when empty).
    fn bytes(&self) -> Option<CudaView<'_, u8>> {
        let d = self.data.as_ref()?;
        // SAFETY: every element type is plain old data, so its bytes may be read as bytes.
        unsafe { d.transmute::<u8>(d.len() * std::mem::size_of::<T>()) }
    }

    /// The buffer, mutably: copied first when shared with another storage.
    fn data_mut(&mut self) -> Result<Option<&mut CudaSlice<T>>> {
        unshare(&mut self.data, &self.device)
    }

    /// The shard's bytes and its device, as a collective reads them (`None` when empty, since
    /// an empty shard holds no allocation).
    pub fn device_bytes(&self) -> (Option<CudaView<'_, u8>>, &Arc<CudaDevice>) {
        (self.bytes(), &self.device)
    }

    /// The shard's bytes and its device, as a collective writes them (copied first when
    /// shared; `None` when empty).
    pub fn device_bytes_mut(&mut self) -> Result<(Option<CudaViewMut<'_, u8>>, &Arc<CudaDevice>)> {
        let CudaStorage { data, device, .. } = self;
        let Some(d) = unshare(data, device)? else { return Ok((None, device)) };
        let n = d.len() * std::mem::size_of::<T>();
        // SAFETY: every element type is plain old data: any bytes written are a valid value.
        Ok((unsafe { d.transmute_mut::<u8>(n) }, device))
    }

    /// Every element `value`.
    pub(super) fn full(device: &Arc<CudaDevice>, shape: &[usize], value: T) -> Result<Self> {
        if value == T::zero() {
            return Self::zeros(device, shape);
        }
        let mut out = Self::uninit(device, shape)?;
        let n = out.len() as u64;
        if let Some(o) = out.data_mut()? {
            let f = device.kernels()?.function("fill", T::SUFFIX)?;
            let mut b = device.stream().launch_builder(&f);
            b.arg(o).arg(&n).arg(&value);
            launch("fill", &mut b, per_element(n))?;
        }
        Ok(out)
    }

    /// The shard (`shape` at `offset`) of a random tensor of `global` shape: element for
    /// element the host generator's value (`crate::rng`), computed by the same steps.
    pub(super) fn random(
        device: &Arc<CudaDevice>,
        fill: &RandomFill,
        global: &[usize],
        offset: &[usize],
        shape: &[usize],
    ) -> Result<Self> {
        let (g, base) = args::random(global, offset, shape)?;
        let k = rand_philox::splitmix64(fill.seed);
        let (k0, k1) = (k as u32, (k >> 32) as u32);
        let normal = i32::from(fill.dist == Distribution::Normal);
        let mut out = Self::uninit(device, shape)?;
        let n = out.len() as u64;
        if let Some(o) = out.data_mut()? {
            let f = device.kernels()?.function("random", T::SUFFIX)?;
            let mut b = device.stream().launch_builder(&f);
            b.arg(o).arg(&n).arg(&g).arg(&base).arg(&k0).arg(&k1).arg(&fill.offset).arg(&normal);
            launch("random", &mut b, per_element(n))?;
        }
        Ok(out)
    }

    /// A host copy (waits for the queued work).
    pub fn to_host(&self) -> Result<ArrayD<T>> {
        let v = match &self.data {
            Some(d) => {
                count(Work::DeviceToHost(d.len() * std::mem::size_of::<T>()));
                self.device.stream().clone_dtoh(&**d).map_err(|e| cuda_err("device to host copy", e))?
            }
            None => vec![],
        };
        ArrayD::from_shape_vec(IxDyn(&self.shape), v).map_err(|e| cuda_err("shaping the host copy", e))
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The device (and stream) the data lives on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    fn same_device<U: Scalar>(&self, other: &CudaStorage<U>, op: &str) -> Result<()> {
        if Arc::ptr_eq(&self.device, &other.device) {
            Ok(())
        } else {
            Err(Error::DeviceMismatch {
                context: op.into(),
                left: format!("{:?}", self.device),
                right: format!("{:?}", other.device),
            })
        }
    }

    pub(super) fn into_reshape(self, shape: &[usize]) -> Result<Self> {
        Ok(CudaStorage { shape: shape.to_vec(), ..self })
    }

    pub(super) fn unary(&self, op: UnaryOp) -> Result<Self> {
        let mut out = Self::uninit(&self.device, &self.shape)?;
        let (Some(a), Some(o)) = (&self.data, out.data_mut()?) else {
            return Ok(out);
        };
        let (n, code) = (self.len() as u64, unary_code(op)?);
        let (s, t) = args::unary_scalars(op);
        let (s, t) = (T::arg(s), T::arg(t));
        let f = self.device.kernels()?.function("unary", T::SUFFIX)?;
        let mut b = self.device.stream().launch_builder(&f);
        b.arg(&**a).arg(o).arg(&n).arg(&code).arg(&s).arg(&t);
        launch(op.name(), &mut b, per_element(n))?;
        Ok(out)
    }

    /// `op` of `self` and `other` broadcast to `shape` (numpy rules, checked by the caller):
    /// broadcast dims get stride 0, nothing is copied.
    pub(super) fn binary(&self, op: BinaryOp, other: &Self, shape: &[usize]) -> Result<Self> {
        self.same_device(other, op.name())?;
        let g = args::broadcast(op.name(), shape, &self.shape, &other.shape)?;
        let mut out = Self::uninit(&self.device, shape)?;
        let (Some(a), Some(bb), Some(o)) = (&self.data, &other.data, out.data_mut()?) else {
            return Ok(out); // an empty operand broadcasts only to an empty output
        };
        let (n, code) = (shape.iter().product::<usize>() as u64, binary_code(op)?);
        let f = self.device.kernels()?.function("binary", T::SUFFIX)?;
        let mut b = self.device.stream().launch_builder(&f);
        b.arg(&**a).arg(&**bb).arg(o).arg(&n).arg(&code).arg(&g);
        launch(op.name(), &mut b, per_element(n))?;
        Ok(out)
    }

    /// `self [.., m, k] @ other [k, n]` with one cuBLAS gemm (leading dims are batch rows), or
    /// `self [.., m, k] @ other [.., k, n]` with one strided-batched gemm.
    pub(super) fn matmul(&self, other: &Self, out_shape: &[usize]) -> Result<Self> {
        self.same_device(other, "matmul")?;
        let nb = other.shape.len();
        let (k, n) = (other.shape[nb - 2], other.shape[nb - 1]);
        let m = self.shape[self.shape.len() - 2];
        let rows: usize = self.shape[..self.shape.len() - 1].iter().product();
        let mut out = Self::zeros(&self.device, out_shape)?;
        let blas = if out.data.is_some() { Some(self.device.blas()?) } else { None };
        let (Some(a), Some(b), Some(c), Some(blas)) = (&self.data, &other.data, out.data_mut()?, blas) else {
            return Ok(out); // an empty operand: the product is zeros (or empty)
        };
        // Row-major C = A B is column-major Cᵀ = Bᵀ Aᵀ: pass B first, dims swapped.
        let gemm = |cols: usize| -> Result<GemmConfig<T>> {
            Ok(GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_N,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: to_i32(n, "n")?,
                n: to_i32(cols, "rows")?,
                k: to_i32(k, "k")?,
                alpha: T::one(),
                lda: to_i32(n, "n")?,
                ldb: to_i32(k, "k")?,
                beta: T::zero(),
                ldc: to_i32(n, "n")?,
            })
        };
        count(Work::Blas);
        if nb == 2 {
            T::gemm(&blas, gemm(rows)?, b, a, c)
        } else {
            let cfg = StridedBatchedConfig {
                gemm: gemm(m)?,
                batch_size: to_i32(rows / m.max(1), "batch")?,
                stride_a: (k * n) as i64,
                stride_b: (m * k) as i64,
                stride_c: (m * n) as i64,
            };
            T::gemm_strided_batched(&blas, cfg, b, a, c)
        }?;
        Ok(out)
    }
}

impl<T: Element> CudaStorage<T> {
    /// Reduces `dims` (sorted, distinct, checked) in one launch: one block per output element.
    pub(super) fn reduce(&self, kind: Reduction, dims: &[usize], keepdim: bool) -> Result<Self> {
        let (g, out_shape, nred) = args::reduce(kind.name(), &self.shape, dims, keepdim)?;
        let (code, mean) = reduce_code(kind);
        // In the compute type, as the host (which widens the 16-bit floats to f32).
        let scale = T::arg(1.0) / T::arg(nred as f64);
        let mut out = Self::uninit(&self.device, &out_shape)?;
        let nout = out.len() as u64;
        let Some(o) = out.data_mut()? else { return Ok(out) };
        // An empty input reduces to the identity (a zero-sized source needs a valid pointer).
        let empty;
        let a = match &self.data {
            Some(a) => &**a,
            None => {
                empty = self.device.stream().alloc_zeros::<T>(1).map_err(|e| cuda_err("device allocation", e))?;
                &empty
            }
        };
        let (nred, mean) = (nred as u64, i32::from(mean));
        let f = self.device.kernels()?.function("reduce", T::SUFFIX)?;
        let mut b = self.device.stream().launch_builder(&f);
        b.arg(a).arg(o).arg(&nout).arg(&nred).arg(&code).arg(&mean).arg(&scale).arg(&g);
        launch(kind.name(), &mut b, per_block(nout))?;
        Ok(out)
    }
}

impl<T: Scalar> CudaStorage<T> {
    pub(super) fn softmax(&self, dim: usize, kind: SoftmaxKind) -> Result<Self> {
        let mut out = Self::uninit(&self.device, &self.shape)?;
        let (Some(x), Some(o)) = (&self.data, out.data_mut()?) else { return Ok(out) };
        let (lanes, len, inner) = args::lanes(&self.shape, dim);
        let log = i32::from(kind == SoftmaxKind::LogSoftmax);
        let f = self.device.kernels()?.function("softmax", T::SUFFIX)?;
        let mut b = self.device.stream().launch_builder(&f);
        b.arg(&**x).arg(o).arg(&lanes).arg(&len).arg(&inner).arg(&log);
        launch("softmax", &mut b, per_block(lanes))?;
        Ok(out)
    }

    pub(super) fn softmax_backward(&self, g: &Self, dim: usize, kind: SoftmaxKind) -> Result<Self> {
        self.same_device(g, "softmax_backward")?;
        let mut out = Self::uninit(&self.device, &self.shape)?;
        let (Some(y), Some(gd), Some(o)) = (&self.data, &g.data, out.data_mut()?) else { return Ok(out) };
        let (lanes, len, inner) = args::lanes(&self.shape, dim);
        let log = i32::from(kind == SoftmaxKind::LogSoftmax);
        let f = self.device.kernels()?.function("softmax_bwd", T::SUFFIX)?;
        let mut b = self.device.stream().launch_builder(&f);
        b.arg(&**y).arg(&**gd).arg(o).arg(&lanes).arg(&len).arg(&inner).arg(&log);
        launch("softmax_backward", &mut b, per_block(lanes))?;
        Ok(out)
    }

    /// Executes a checked pack plan with one launch: the blocks go to the device as one table,
    /// one thread copies one element. The output is zeroed first only when the blocks leave
    /// padding.
    pub(super) fn pack(&self, plan: &PackPlan) -> Result<Self> {
        let (table, total) = args::pack_table(plan)?;
        let mut out = if plan.covers_destination() {
            Self::uninit(&self.device, &plan.dst_shape)?
        } else {
            Self::zeros(&self.device, &plan.dst_shape)?
        };
        let (Some(src), Some(o)) = (&self.data, out.data_mut()?) else { return Ok(out) };
        if total == 0 {
            return Ok(out);
        }
        let nblocks = (table.len() / args::PACK_ROW) as u64;
        count(Work::HostToDevice(std::mem::size_of_val(table.as_slice())));
        let table = self.device.stream().clone_htod(&table).map_err(|e| cuda_err("pack plan upload", e))?;
        let f = self.device.kernels()?.function("pack", T::SUFFIX)?;
        let mut b = self.device.stream().launch_builder(&f);
        b.arg(&**src).arg(o).arg(&table).arg(&nblocks).arg(&total);
        launch("pack", &mut b, per_element(total))?;
        Ok(out)
    }

    /// Launches a kernel that flags invalid ids, then reports them as the host kernels do.
    fn checked_ids(
        &self,
        op: &str,
        n: u64,
        vocab: usize,
        build: impl FnOnce(&mut CudaSlice<i32>) -> Result<()>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let mut bad = self.device.stream().alloc_zeros::<i32>(1).map_err(|e| cuda_err("device allocation", e))?;
        build(&mut bad)?;
        count(Work::DeviceToHost(std::mem::size_of::<i32>()));
        let flag = self.device.stream().clone_dtoh(&bad).map_err(|e| cuda_err("reading the id check", e))?;
        if flag.first().copied().unwrap_or(0) != 0 {
            return Err(Error::InvalidArgument {
                context: op.into(),
                reason: format!("an index is out of range [0, {vocab})"),
            });
        }
        Ok(())
    }

    pub(super) fn embedding(&self, ids: &CudaStorage<i64>, row0: usize, vocab: usize) -> Result<Self> {
        self.same_device(ids, "embedding")?;
        let (rows, cols) = (self.shape[0], self.shape[1]);
        let mut shape = ids.shape.clone();
        shape.push(cols);
        let mut out = Self::uninit(&self.device, &shape)?;
        let nids = ids.len() as u64;
        let (c64, r64, z64, v64) = (cols as u64, rows as u64, row0 as u64, vocab as u64);
        // An empty table shard still answers (zeros); the kernel needs a valid pointer.
        let empty;
        let table = match &self.data {
            Some(t) => &**t,
            None => {
                empty = self.device.stream().alloc_zeros::<T>(1).map_err(|e| cuda_err("device allocation", e))?;
                &empty
            }
        };
        let (Some(i), Some(o)) = (&ids.data, out.data_mut()?) else { return Ok(out) };
        let f = self.device.kernels()?.function("embedding", T::SUFFIX)?;
        let dev = Arc::clone(&self.device);
        self.checked_ids("embedding", nids * c64, vocab, |bad| {
            let mut b = dev.stream().launch_builder(&f);
            b.arg(table).arg(&**i).arg(o).arg(&nids).arg(&c64).arg(&r64).arg(&z64).arg(&v64).arg(bad);
            launch("embedding", &mut b, per_element(nids * c64))
        })?;
        Ok(out)
    }

    pub(super) fn embedding_backward(
        &self,
        ids: &CudaStorage<i64>,
        rows: usize,
        row0: usize,
        vocab: usize,
    ) -> Result<Self> {
        self.same_device(ids, "embedding_backward")?;
        if T::DTYPE.is_half() {
            // The 16-bit floats have no atomicAdd of their own: accumulate in f32 and round
            // once, as the host does (the ids stay i64).
            return self.cast::<f32>()?.embedding_backward(ids, rows, row0, vocab)?.cast::<T>();
        }
        let cols = *self.shape.last().unwrap_or(&0);
        let mut out = Self::zeros(&self.device, &[rows, cols])?;
        let nids = ids.len() as u64;
        let (c64, r64, z64, v64) = (cols as u64, rows as u64, row0 as u64, vocab as u64);
        // Without gradient rows there are no ids to check (as on the host).
        let (Some(g), Some(i)) = (&self.data, &ids.data) else { return Ok(out) };
        // A shard of no rows still checks the ids (as on the host): into a dummy buffer,
        // which no id falls in.
        let mut dummy;
        let o = match out.data_mut()? {
            Some(o) => o,
            None => {
                dummy = self.device.stream().alloc_zeros::<T>(1).map_err(|e| cuda_err("device allocation", e))?;
                &mut dummy
            }
        };
        let f = self.device.kernels()?.function("embedding_bwd", T::SUFFIX)?;
        let dev = Arc::clone(&self.device);
        self.checked_ids("embedding_backward", nids * c64, vocab, |bad| {
            let mut b = dev.stream().launch_builder(&f);
            b.arg(&**g).arg(&**i).arg(o).arg(&nids).arg(&c64).arg(&r64).arg(&z64).arg(&v64).arg(bad);
            launch("embedding_backward", &mut b, per_element(nids * c64))
        })?;
        Ok(out)
    }

    /// A fresh output of `shape` whose every element the kernel `name` writes, launched by
    /// `build` (output, kernel, element count) only when the output is not empty.
    fn launch_into(
        &self,
        shape: &[usize],
        name: &str,
        build: impl FnOnce(&mut CudaSlice<T>, &CudaFunction, u64) -> Result<()>,
    ) -> Result<Self> {
        let mut out = Self::uninit(&self.device, shape)?;
        let n = out.len() as u64;
        if let Some(o) = out.data_mut()? {
            let f = self.device.kernels()?.function(name, T::SUFFIX)?;
            build(o, &f, n)?;
        }
        Ok(out)
    }

    /// `a` where this mask is non-zero, else `b`, all broadcast to `shape` by strides.
    pub(super) fn where_(&self, a: &Self, b: &Self, shape: &[usize]) -> Result<Self> {
        self.same_device(a, "where")?;
        self.same_device(b, "where")?;
        let (g, h) = args::where_(shape, &self.shape, &a.shape, &b.shape)?;
        let (Some(c), Some(x), Some(y)) = (&self.data, &a.data, &b.data) else {
            return Self::zeros(&self.device, shape); // an empty operand broadcasts only to an empty output
        };
        let dev = Arc::clone(&self.device);
        self.launch_into(shape, "where", |o, f, n| {
            let mut k = dev.stream().launch_builder(f);
            k.arg(&**c).arg(&**x).arg(&**y).arg(o).arg(&n).arg(&g).arg(&h);
            launch("where", &mut k, per_element(n))
        })
    }

    pub(super) fn tri(&self, lower: bool, diagonal: i64, row0: usize, col0: usize) -> Result<Self> {
        let nd = self.shape.len();
        let (rows, cols) = (self.shape[nd - 2] as u64, self.shape[nd - 1] as u64);
        let (lower, r0, c0) = (i32::from(lower), row0 as i64, col0 as i64);
        let Some(a) = &self.data else { return Ok(self.clone()) };
        let dev = Arc::clone(&self.device);
        self.launch_into(&self.shape, "tri", |o, f, n| {
            let mut k = dev.stream().launch_builder(f);
            k.arg(&**a).arg(o).arg(&n).arg(&rows).arg(&cols).arg(&lower).arg(&diagonal).arg(&r0).arg(&c0);
            launch("tril/triu", &mut k, per_element(n))
        })
    }

    /// One thread per lane scans it in order, so ties go to the first index as on the host;
    /// the indices are `i64` (PyTorch).
    pub(super) fn arg_reduce(&self, dim: usize, max: bool, keepdim: bool) -> Result<CudaStorage<i64>> {
        let mut shape = self.shape.clone();
        if keepdim {
            shape[dim] = 1;
        } else {
            shape.remove(dim);
        }
        let (lanes, len, inner) = args::lanes(&self.shape, dim);
        let mut out = CudaStorage::<i64>::uninit(&self.device, &shape)?;
        let (Some(a), Some(o)) = (&self.data, out.data_mut()?) else {
            return CudaStorage::zeros(&self.device, &shape); // an empty input has no lanes
        };
        let f = self.device.kernels()?.function("arg_reduce", T::SUFFIX)?;
        let max = i32::from(max);
        let mut k = self.device.stream().launch_builder(&f);
        k.arg(&**a).arg(o).arg(&lanes).arg(&len).arg(&inner).arg(&max);
        launch("arg_reduce", &mut k, per_element(lanes))?;
        Ok(out)
    }

    /// One launch per non-empty part (shapes and devices checked by the caller).
    pub(super) fn cat(&self, parts: &[&CudaStorage<T>], dim: usize) -> Result<Self> {
        for c in parts {
            self.same_device(c, "cat")?;
        }
        let cuda = parts;
        let total: usize = cuda.iter().map(|c| c.shape[dim]).sum();
        let mut shape = self.shape.clone();
        shape[dim] = total;
        let mut out = Self::uninit(&self.device, &shape)?;
        let Some(o) = out.data_mut()? else { return Ok(out) };
        let f = self.device.kernels()?.function("cat", T::SUFFIX)?;
        let mut start = 0;
        for c in cuda.iter() {
            let (width, stride, offset) = args::cat_part(&c.shape, dim, total, start);
            start += c.shape[dim];
            let Some(src) = &c.data else { continue };
            let n = c.len() as u64;
            let mut k = self.device.stream().launch_builder(&f);
            k.arg(&**src).arg(&mut *o).arg(&n).arg(&width).arg(&stride).arg(&offset);
            launch("cat", &mut k, per_element(n))?;
        }
        Ok(out)
    }

    pub(super) fn index_select(&self, dim: usize, ids: &CudaStorage<i64>) -> Result<Self> {
        self.same_device(ids, "index_select")?;
        ids.check_ids("index_select", self.shape[dim])?;
        let mut shape = self.shape.clone();
        shape[dim] = ids.len();
        let (_, len, inner) = args::along(&self.shape, dim);
        let (Some(a), Some(i)) = (&self.data, &ids.data) else { return Self::zeros(&self.device, &shape) };
        let (nids, dev) = (ids.len() as u64, Arc::clone(&self.device));
        self.launch_into(&shape, "index_select", |o, f, n| {
            let mut k = dev.stream().launch_builder(f);
            k.arg(&**a).arg(&**i).arg(o).arg(&n).arg(&len).arg(&nids).arg(&inner);
            launch("index_select", &mut k, per_element(n))
        })
    }

    /// Each output element sums its ids' slices in id order: deterministic, unlike atomics,
    /// and bit-identical to the host, at the cost of a scan of the ids per element (the ids of
    /// an `index_select` are few).
    pub(super) fn index_add(&self, dim: usize, ids: &CudaStorage<i64>, n: usize) -> Result<Self> {
        self.same_device(ids, "index_select_backward")?;
        ids.check_ids("index_select_backward", n)?;
        let mut shape = self.shape.clone();
        shape[dim] = n;
        let (_, nids, inner) = args::along(&self.shape, dim);
        let (Some(g), Some(i)) = (&self.data, &ids.data) else { return Self::zeros(&self.device, &shape) };
        let (len, dev) = (n as u64, Arc::clone(&self.device));
        self.launch_into(&shape, "index_add", |o, f, n| {
            let mut k = dev.stream().launch_builder(f);
            k.arg(&**g).arg(&**i).arg(o).arg(&n).arg(&len).arg(&nids).arg(&inner);
            launch("index_select_backward", &mut k, per_element(n))
        })
    }

    pub(super) fn gather(&self, dim: usize, ids: &CudaStorage<i64>) -> Result<Self> {
        self.same_device(ids, "gather")?;
        ids.check_ids("gather", self.shape[dim])?;
        let g = args::gather("gather", &ids.shape, &self.shape, dim)?;
        let (Some(a), Some(i)) = (&self.data, &ids.data) else { return Self::zeros(&self.device, &ids.shape) };
        let (len, dev) = (self.shape[dim] as u64, Arc::clone(&self.device));
        self.launch_into(&ids.shape, "gather", |o, f, n| {
            let mut k = dev.stream().launch_builder(f);
            k.arg(&**a).arg(&**i).arg(o).arg(&n).arg(&len).arg(&g);
            launch("gather", &mut k, per_element(n))
        })
    }

    /// Each output element sums the gradient entries of its lane whose id names it, in lane
    /// order: deterministic, unlike PyTorch's atomics, and bit-identical to the host, at the
    /// cost of a scan of the lane (the gradient's `dim`) per element.
    pub(super) fn scatter_add(&self, dim: usize, ids: &CudaStorage<i64>, shape: &[usize]) -> Result<Self> {
        self.same_device(ids, "gather_backward")?;
        ids.check_ids("gather_backward", shape[dim])?;
        let g = args::gather("gather_backward", shape, &self.shape, dim)?;
        let (Some(gr), Some(i)) = (&self.data, &ids.data) else { return Self::zeros(&self.device, shape) };
        let (len, dev) = (shape[dim] as u64, Arc::clone(&self.device));
        self.launch_into(shape, "scatter_add", |o, f, n| {
            let mut k = dev.stream().launch_builder(f);
            k.arg(&**gr).arg(&**i).arg(o).arg(&n).arg(&len).arg(&g);
            launch("gather_backward", &mut k, per_element(n))
        })
    }

    pub(super) fn cast<U: Scalar>(&self) -> Result<CudaStorage<U>> {
        let mut out = CudaStorage::<U>::uninit(&self.device, &self.shape)?;
        let (Some(a), Some(o)) = (&self.data, out.data_mut()?) else { return Ok(out) };
        let n = self.len() as u64;
        let f = self.device.kernels()?.function(&format!("cast_{}", T::SUFFIX), U::SUFFIX)?;
        let mut b = self.device.stream().launch_builder(&f);
        b.arg(&**a).arg(o).arg(&n);
        launch("cast", &mut b, per_element(n))?;
        Ok(out)
    }

    pub(super) fn sgd_step(&mut self, g: &Self, buf: Option<&mut CudaStorage<T>>, step: &SgdStep) -> Result<()> {
        self.same_device(g, "sgd")?;
        let n = self.len() as u64;
        let (lr, m, wd) = (T::arg(step.lr), T::arg(step.momentum), T::arg(step.weight_decay));
        let first = i32::from(step.first);
        let dev = Arc::clone(&self.device);
        if let Some(b) = &buf {
            self.same_device(b, "sgd: momentum buffer")?;
        }
        let (Some(w), Some(gd)) = (self.data_mut()?, &g.data) else { return Ok(()) };
        match buf {
            Some(bs) => {
                let Some(bd) = bs.data_mut()? else { return Ok(()) };
                let f = dev.kernels()?.function("sgd_momentum", T::SUFFIX)?;
                let mut b = dev.stream().launch_builder(&f);
                b.arg(w).arg(&**gd).arg(bd).arg(&n).arg(&lr).arg(&m).arg(&wd).arg(&first);
                launch("sgd", &mut b, per_element(n))
            }
            None => {
                let f = dev.kernels()?.function("sgd", T::SUFFIX)?;
                let mut b = dev.stream().launch_builder(&f);
                b.arg(w).arg(&**gd).arg(&n).arg(&lr).arg(&wd);
                launch("sgd", &mut b, per_element(n))
            }
        }
    }

    pub(super) fn adamw_step(
        &mut self,
        g: &Self,
        m: &mut CudaStorage<T>,
        v: &mut CudaStorage<T>,
        step: &AdamWStep,
    ) -> Result<()> {
        self.same_device(g, "adamw")?;
        self.same_device(m, "adamw: first moment")?;
        self.same_device(v, "adamw: second moment")?;
        let n = self.len() as u64;
        let c = T::arg;
        let (lr, b1, b2, eps) = (c(step.lr), c(step.beta1), c(step.beta2), c(step.eps));
        let (wd, c1, c2) = (c(step.weight_decay), c(step.bias_correction1), c(step.bias_correction2));
        let dev = Arc::clone(&self.device);
        let (Some(w), Some(gd), Some(md), Some(vd)) = (self.data_mut()?, &g.data, m.data_mut()?, v.data_mut()?) else {
            return Ok(());
        };
        let f = dev.kernels()?.function("adamw", T::SUFFIX)?;
        let mut b = dev.stream().launch_builder(&f);
        b.arg(w).arg(&**gd).arg(md).arg(vd).arg(&n);
        b.arg(&lr).arg(&b1).arg(&b2).arg(&eps).arg(&wd).arg(&c1).arg(&c2);
        launch("adamw", &mut b, per_element(n))
    }
}

/// The kernels of id tensors (`i64` on every device).
impl CudaStorage<i64> {
    /// Ones of `U` at these ids along a new last dim of `classes` (zeros elsewhere); an id
    /// outside `[0, classes)` is the host's typed error.
    pub(super) fn one_hot<U: Element>(&self, classes: usize) -> Result<CudaStorage<U>> {
        let mut shape = self.shape.clone();
        shape.push(classes);
        let mut out = CudaStorage::<U>::zeros(&self.device, &shape)?;
        let nids = self.len() as u64;
        let c64 = classes as u64;
        let Some(i) = &self.data else { return Ok(out) };
        let Some(o) = out.data_mut()? else {
            // No classes: every id is out of range (as on the host).
            return Err(Error::InvalidArgument {
                context: "one_hot".into(),
                reason: format!("an index is out of range [0, {classes})"),
            });
        };
        let f = self.device.kernels()?.function("one_hot", U::SUFFIX)?;
        let dev = Arc::clone(&self.device);
        self.checked_ids("one_hot", nids, classes, |bad| {
            let mut b = dev.stream().launch_builder(&f);
            b.arg(&**i).arg(o).arg(&nids).arg(&c64).arg(bad);
            launch("one_hot", &mut b, per_element(nids))
        })?;
        Ok(out)
    }

    /// Checks that these ids lie in `[0, bound)` (as the host kernels do, every id, before any
    /// use), or the typed error of `op`.
    fn check_ids(&self, op: &str, bound: usize) -> Result<()> {
        let Some(i) = &self.data else { return Ok(()) };
        let (n, b64) = (self.len() as u64, bound as u64);
        let f = self.device.kernels()?.function("check_ids", ID_DTYPE)?;
        let dev = Arc::clone(&self.device);
        self.checked_ids(op, n, bound, |bad| {
            let mut b = dev.stream().launch_builder(&f);
            b.arg(&**i).arg(&n).arg(&b64).arg(bad);
            launch(op, &mut b, per_element(n))
        })
    }
}

/// CUDA as a compute device: every kernel of the checklist, on device buffers (the inherent
/// methods above, which take precedence in these calls).
impl<T: Scalar> BackendStorage<T> for CudaStorage<T> {
    type Handle = Arc<CudaDevice>;
    type Of<U: Scalar> = CudaStorage<U>;

    fn from_host(h: &Arc<CudaDevice>, a: ArrayD<T>) -> Result<Self> {
        CudaStorage::from_host(h, &a)
    }
    fn full(h: &Arc<CudaDevice>, shape: &[usize], value: T) -> Result<Self> {
        CudaStorage::full(h, shape, value)
    }
    fn random(
        h: &Arc<CudaDevice>,
        fill: &RandomFill,
        global: &[usize],
        offset: &[usize],
        shape: &[usize],
    ) -> Result<Self>
    where
        T: Element,
    {
        CudaStorage::random(h, fill, global, offset, shape)
    }
    fn dims(&self) -> &[usize] {
        &self.shape
    }
    fn to_host(&self) -> Result<ArrayD<T>> {
        CudaStorage::to_host(self)
    }
    fn into_reshape(self, shape: &[usize]) -> Result<Self> {
        CudaStorage::into_reshape(self, shape)
    }
    fn cast<U: Scalar>(&self) -> Result<CudaStorage<U>> {
        CudaStorage::cast::<U>(self)
    }
    fn pack(&self, plan: &PackPlan) -> Result<Self> {
        CudaStorage::pack(self, plan)
    }
    fn cat(parts: &[&Self], dim: usize) -> Result<Self> {
        match parts.first() {
            Some(first) => CudaStorage::cat(first, parts, dim),
            None => Err(Error::InvalidArgument { context: "cat".into(), reason: "no tensors to concatenate".into() }),
        }
    }
    fn compare(&self, op: BinaryOp, other: &Self, shape: &[usize]) -> Result<Self> {
        CudaStorage::binary(self, op, other, shape)
    }
    fn where_(&self, a: &Self, b: &Self, shape: &[usize]) -> Result<Self> {
        CudaStorage::where_(self, a, b, shape)
    }
    fn index_select(&self, dim: usize, ids: &CudaStorage<i64>) -> Result<Self> {
        CudaStorage::index_select(self, dim, ids)
    }
    fn gather(&self, dim: usize, ids: &CudaStorage<i64>) -> Result<Self> {
        CudaStorage::gather(self, dim, ids)
    }
    fn unary(&self, op: UnaryOp) -> Result<Self>
    where
        T: Element,
    {
        CudaStorage::unary(self, op)
    }
    fn binary(&self, op: BinaryOp, other: &Self, shape: &[usize]) -> Result<Self>
    where
        T: Element,
    {
        CudaStorage::binary(self, op, other, shape)
    }
    fn reduce(&self, kind: Reduction, dims: &[usize], keepdim: bool) -> Result<Self>
    where
        T: Element,
    {
        CudaStorage::reduce(self, kind, dims, keepdim)
    }
    fn softmax(&self, dim: usize, kind: SoftmaxKind) -> Result<Self>
    where
        T: Element,
    {
        CudaStorage::softmax(self, dim, kind)
    }
    fn softmax_backward(&self, g: &Self, dim: usize, kind: SoftmaxKind) -> Result<Self>
    where
        T: Element,
    {
        CudaStorage::softmax_backward(self, g, dim, kind)
    }
    /// cuBLAS reads only row- or column-major operands: a swapped operand is copied first.
    fn matmul(&self, other: &Self, transpose_self: bool, transpose_other: bool, out_shape: &[usize]) -> Result<Self>
    where
        T: Element,
    {
        fn swapped<T: Scalar>(x: &CudaStorage<T>, t: bool) -> Result<Cow<'_, CudaStorage<T>>> {
            if !t {
                return Ok(Cow::Borrowed(x));
            }
            let n = x.shape.len();
            let mut axes: Vec<usize> = (0..n).collect();
            axes.swap(n - 2, n - 1);
            CudaStorage::pack(x, &crate::layout::pack::permute(&x.shape, &axes)).map(Cow::Owned)
        }
        let (a, b) = (swapped(self, transpose_self)?, swapped(other, transpose_other)?);
        CudaStorage::matmul(&a, &b, out_shape)
    }
    fn embedding(&self, ids: &CudaStorage<i64>, row0: usize, vocab: usize) -> Result<Self>
    where
        T: Element,
    {
        CudaStorage::embedding(self, ids, row0, vocab)
    }
    fn embedding_backward(&self, ids: &CudaStorage<i64>, rows: usize, row0: usize, vocab: usize) -> Result<Self>
    where
        T: Element,
    {
        CudaStorage::embedding_backward(self, ids, rows, row0, vocab)
    }
    fn tri(&self, lower: bool, diagonal: i64, row0: usize, col0: usize) -> Result<Self>
    where
        T: Element,
    {
        CudaStorage::tri(self, lower, diagonal, row0, col0)
    }
    fn arg_reduce(&self, dim: usize, max: bool, keepdim: bool) -> Result<CudaStorage<i64>>
    where
        T: Element,
    {
        CudaStorage::arg_reduce(self, dim, max, keepdim)
    }
    fn index_add(&self, dim: usize, ids: &CudaStorage<i64>, n: usize) -> Result<Self>
    where
        T: Element,
    {
        CudaStorage::index_add(self, dim, ids, n)
    }
    fn scatter_add(&self, dim: usize, ids: &CudaStorage<i64>, shape: &[usize]) -> Result<Self>
    where
        T: Element,
    {
        CudaStorage::scatter_add(self, dim, ids, shape)
    }
    fn one_hot(ids: &CudaStorage<i64>, classes: usize) -> Result<Self>
    where
        T: Element,
    {
        ids.one_hot::<T>(classes)
    }
    fn sgd_step(&mut self, grad: &Self, buf: Option<&mut Self>, step: &SgdStep) -> Result<()>
    where
        T: Element,
    {
        CudaStorage::sgd_step(self, grad, buf, step)
    }
    fn adamw_step(&mut self, grad: &Self, m: &mut Self, v: &mut Self, step: &AdamWStep) -> Result<()>
    where
        T: Element,
    {
        CudaStorage::adamw_step(self, grad, m, v, step)
    }
}
