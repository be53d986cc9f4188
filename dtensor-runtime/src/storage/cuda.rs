//! `CudaStorage<T>`: a row-major shard in the memory of one [`CudaDevice`], and the CUDA arm
//! of the kernel surface (feature `cuda`).
//!
//! All work is queued on the device handle's stream. The buffer is shared behind an `Arc`, so
//! cloning a storage (as every `DTensor` clone does) and reshaping it are free; in-place
//! updates copy first when the buffer is shared. A zero-sized shard holds no allocation (the
//! driver rejects 0-byte allocations).
//!
//! Implemented on the device: host↔device copies, zero fills, cuBLAS matmul of
//! `[.., m, k] @ [k, n]`, and the element-wise kernels of `crate::cuda::kernels` (same-shape
//! operands). Every other kernel answers [`Error::Unsupported`] until its device kernel lands.

use super::op::{AdamWStep, BinaryOp, RandomFill, Reduction, SgdStep, SoftmaxKind, UnaryOp};
use super::Storage;
use crate::cuda::{cuda_err, CudaDevice};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::layout::pack::PackPlan;
use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};
use ndarray::{ArrayD, IxDyn};
use std::fmt;
use std::sync::Arc;

/// What an element type needs to live on a CUDA device: cudarc's device traits, a kernel
/// name suffix and a cuBLAS gemm (implemented for f32 and f64).
pub trait CudaElement: DeviceRepr + ValidAsZeroBits + Copy + 'static {
    /// Kernel name suffix (`f32`, `f64`).
    const SUFFIX: &'static str;
    #[doc(hidden)]
    fn gemm(
        blas: &CudaBlas,
        cfg: GemmConfig<Self>,
        a: &CudaSlice<Self>,
        b: &CudaSlice<Self>,
        c: &mut CudaSlice<Self>,
    ) -> Result<()>;
}

macro_rules! cuda_element {
    ($t:ty, $sfx:literal) => {
        impl CudaElement for $t {
            const SUFFIX: &'static str = $sfx;
            fn gemm(
                blas: &CudaBlas,
                cfg: GemmConfig<Self>,
                a: &CudaSlice<Self>,
                b: &CudaSlice<Self>,
                c: &mut CudaSlice<Self>,
            ) -> Result<()> {
                // SAFETY: the caller sized a, b, c for cfg (see `CudaStorage::matmul`).
                unsafe { blas.gemm(cfg, a, b, c) }.map_err(|e| cuda_err("cuBLAS gemm", e))
            }
        }
    };
}
cuda_element!(f32, "f32");
cuda_element!(f64, "f64");

/// A row-major shard in device memory.
pub struct CudaStorage<T: Element> {
    /// `None` for zero-sized shards.
    data: Option<Arc<CudaSlice<T>>>,
    shape: Vec<usize>,
    device: Arc<CudaDevice>,
}

impl<T: Element> Clone for CudaStorage<T> {
    fn clone(&self) -> Self {
        CudaStorage { data: self.data.clone(), shape: self.shape.clone(), device: Arc::clone(&self.device) }
    }
}

impl<T: Element> fmt::Debug for CudaStorage<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cuda<{}>({:?} on {:?})", T::DTYPE, self.shape, self.device)
    }
}

/// The error of a kernel that has no CUDA implementation yet.
fn not_yet(op: &str) -> Error {
    Error::Unsupported { op: op.into(), reason: "not yet implemented on CUDA".into() }
}

fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Unsupported {
        op: "matmul".into(),
        reason: format!("{what} = {v} exceeds cuBLAS' 32-bit dimension limit"),
    })
}

/// The name of the element-wise kernel of a unary op, if it has one.
fn unary_kernel(op: UnaryOp) -> Option<&'static str> {
    Some(match op {
        UnaryOp::Neg => "neg",
        UnaryOp::Exp => "exp",
        UnaryOp::Relu => "relu",
        UnaryOp::Gelu => "gelu",
        UnaryOp::MulScalar(_) => "scale",
        UnaryOp::AddScalar(_) => "add_scalar",
        _ => return None,
    })
}

/// The name of the element-wise kernel of a binary op, if it has one.
fn binary_kernel(op: BinaryOp) -> Option<&'static str> {
    Some(match op {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        _ => return None,
    })
}

impl<T: Element> CudaStorage<T> {
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

    /// Every element `value` (zeros are a memset; other values need the fill kernel).
    pub(super) fn full(device: &Arc<CudaDevice>, shape: &[usize], value: T) -> Result<Self> {
        if value == T::zero() {
            Self::zeros(device, shape)
        } else {
            Err(not_yet("full"))
        }
    }

    pub(super) fn random(
        _device: &Arc<CudaDevice>,
        _fill: &RandomFill,
        _global: &[usize],
        _offset: &[usize],
        _shape: &[usize],
    ) -> Result<Self> {
        Err(not_yet("random fill (Philox)"))
    }

    /// A host copy (waits for the queued work).
    pub fn to_host(&self) -> Result<ArrayD<T>> {
        let v = match &self.data {
            Some(d) => self.device.stream().clone_dtoh(&**d).map_err(|e| cuda_err("device to host copy", e))?,
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

    fn same_device(&self, other: &Self, op: &str) -> Result<()> {
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

    /// Launches the element-wise kernel `name` over `self` (and `second`: the other operand or
    /// a scalar) into a fresh buffer of the same shape.
    fn launch(&self, name: &str, second: Second<'_, T>) -> Result<Self> {
        let mut out = Self::zeros(&self.device, &self.shape)?;
        let (Some(a), Some(o)) = (&self.data, &mut out.data) else {
            return Ok(out); // empty: nothing to compute
        };
        let o = Arc::get_mut(o).ok_or_else(|| cuda_err("fresh output buffer", "shared"))?;
        let n = a.len();
        let cfg = LaunchConfig::for_num_elems(u32::try_from(n).map_err(|_| Error::Unsupported {
            op: name.into(),
            reason: format!("{n} elements exceed one kernel launch"),
        })?);
        let f = self.device.kernels()?.function(name, T::SUFFIX)?;
        let n64 = n as u64;
        let stream = self.device.stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&**a);
        match &second {
            Second::Tensor(t) => b.arg(*t),
            Second::Scalar(x) => b.arg(x),
        };
        b.arg(o).arg(&n64);
        // SAFETY: every kernel takes (a, b-or-scalar, out, n) and touches indices < n only;
        // both inputs and the output hold n elements.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err(&format!("launching {name}"), e))?;
        Ok(out)
    }

    pub(super) fn unary(&self, op: UnaryOp) -> Result<Self> {
        let name = unary_kernel(op).ok_or_else(|| not_yet(op.name()))?;
        self.launch(name, Second::Scalar(T::of_f64(op.scalar())))
    }

    pub(super) fn binary(&self, op: BinaryOp, other: &Self, shape: &[usize]) -> Result<Self> {
        self.same_device(other, op.name())?;
        let name = binary_kernel(op).ok_or_else(|| not_yet(op.name()))?;
        if self.shape != other.shape || self.shape != shape {
            return Err(not_yet(&format!("{op} with broadcasting")));
        }
        match &other.data {
            Some(b) => self.launch(name, Second::Tensor(b)),
            None => Self::zeros(&self.device, shape), // empty operands
        }
    }

    /// `self [.., m, k] @ other [k, n]` with one cuBLAS gemm (leading dims are batch rows).
    pub(super) fn matmul(&self, other: &Self, out_shape: &[usize]) -> Result<Self> {
        self.same_device(other, "matmul")?;
        if other.shape.len() != 2 {
            return Err(not_yet("batched matmul with a batched right operand"));
        }
        let (k, n) = (other.shape[0], other.shape[1]);
        let rows: usize = self.shape[..self.shape.len() - 1].iter().product();
        let mut out = Self::zeros(&self.device, out_shape)?;
        let (Some(a), Some(b), Some(c)) = (&self.data, &other.data, &mut out.data) else {
            return Ok(out); // an empty operand: the product is zeros (or empty)
        };
        let c = Arc::get_mut(c).ok_or_else(|| cuda_err("fresh output buffer", "shared"))?;
        // Row-major C = A B is column-major Cᵀ = Bᵀ Aᵀ: pass B first, dims swapped.
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: to_i32(n, "n")?,
            n: to_i32(rows, "rows")?,
            k: to_i32(k, "k")?,
            alpha: T::one(),
            lda: to_i32(n, "n")?,
            ldb: to_i32(k, "k")?,
            beta: T::zero(),
            ldc: to_i32(n, "n")?,
        };
        T::gemm(&*self.device.blas()?, cfg, b, a, c)?;
        Ok(out)
    }

    pub(super) fn reduce(&self, kind: Reduction, _dims: &[usize], _keepdim: bool) -> Result<Self> {
        Err(not_yet(kind.name()))
    }

    pub(super) fn softmax(&self, _dim: usize, _kind: SoftmaxKind) -> Result<Self> {
        Err(not_yet("softmax"))
    }

    pub(super) fn softmax_backward(&self, _g: &Self, _dim: usize, _kind: SoftmaxKind) -> Result<Self> {
        Err(not_yet("softmax_backward"))
    }

    pub(super) fn pack(&self, _plan: &PackPlan) -> Result<Self> {
        Err(not_yet("strided copy (pack plan)"))
    }

    pub(super) fn embedding(&self, _ids: &Self, _row0: usize, _vocab: usize) -> Result<Self> {
        Err(not_yet("embedding"))
    }

    pub(super) fn embedding_backward(&self, _ids: &Self, _rows: usize, _row0: usize, _vocab: usize) -> Result<Self> {
        Err(not_yet("embedding_backward"))
    }

    pub(super) fn one_hot(&self, _classes: usize) -> Result<Self> {
        Err(not_yet("one_hot"))
    }

    pub(super) fn where_(&self, _a: &Self, _b: &Self, _shape: &[usize]) -> Result<Self> {
        Err(not_yet("where"))
    }

    pub(super) fn tri(&self, _lower: bool, _diagonal: i64, _row0: usize, _col0: usize) -> Result<Self> {
        Err(not_yet("tril/triu"))
    }

    pub(super) fn arg_reduce(&self, _dim: usize, max: bool, _keepdim: bool) -> Result<Self> {
        Err(not_yet(if max { "argmax" } else { "argmin" }))
    }

    pub(super) fn cat(&self, _parts: &[&Storage<T>], _dim: usize) -> Result<Self> {
        Err(not_yet("cat"))
    }

    pub(super) fn index_select(&self, _dim: usize, _ids: &Self) -> Result<Self> {
        Err(not_yet("index_select"))
    }

    pub(super) fn index_add(&self, _dim: usize, _ids: &Self, _n: usize) -> Result<Self> {
        Err(not_yet("index_select_backward"))
    }

    pub(super) fn gather(&self, _dim: usize, _ids: &Self) -> Result<Self> {
        Err(not_yet("gather"))
    }

    pub(super) fn scatter_add(&self, _dim: usize, _ids: &Self, _shape: &[usize]) -> Result<Self> {
        Err(not_yet("gather_backward"))
    }

    pub(super) fn cast<U: Element>(&self) -> Result<CudaStorage<U>> {
        Err(not_yet("cast"))
    }

    pub(super) fn sgd_step(&mut self, _g: &Self, _buf: Option<&mut Storage<T>>, _step: &SgdStep) -> Result<()> {
        Err(not_yet("sgd update"))
    }

    pub(super) fn adamw_step(
        &mut self,
        _g: &Self,
        _m: &mut Storage<T>,
        _v: &mut Storage<T>,
        _step: &AdamWStep,
    ) -> Result<()> {
        Err(not_yet("adamw update"))
    }
}

/// The second kernel argument: the other operand or a scalar.
enum Second<'a, T> {
    Tensor(&'a CudaSlice<T>),
    Scalar(T),
}
