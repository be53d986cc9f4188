//! `CudaTensor<T>`: a dense row-major tensor in device memory.

use super::{cuda_err, CudaDevice};
use crate::element::Element;
use crate::error::{Error, Result};
use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};
use ndarray::{ArrayD, IxDyn};
use std::fmt;
use std::sync::Arc;

/// An element type with CUDA kernels and a cuBLAS gemm (f32, f64).
pub trait CudaElement: Element + DeviceRepr + ValidAsZeroBits {
    /// Kernel name suffix.
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
                // SAFETY: the caller sized a, b, c for cfg (checked in `CudaTensor::matmul`).
                unsafe { blas.gemm(cfg, a, b, c) }.map_err(|e| cuda_err("cuBLAS gemm", e))
            }
        }
    };
}
cuda_element!(f32, "f32");
cuda_element!(f64, "f64");

/// A tensor in the memory of one [`CudaDevice`]; all its work is queued on the device stream.
///
/// ```no_run
/// # use dtensor_runtime::cuda::{CudaDevice, CudaTensor};
/// # use dtensor_runtime::ndarray::{ArrayD, IxDyn};
/// let dev = CudaDevice::new(0)?;
/// let a = ArrayD::from_shape_fn(IxDyn(&[2, 3]), |i| (i[0] * 3 + i[1]) as f32);
/// let b = ArrayD::from_shape_fn(IxDyn(&[3, 2]), |i| (i[0] + i[1]) as f32);
/// let c = CudaTensor::from_host(&dev, &a)?.matmul(&CudaTensor::from_host(&dev, &b)?)?;
/// assert_eq!(c.to_host()?.shape(), &[2, 2]);
/// # Ok::<(), dtensor_runtime::Error>(())
/// ```
pub struct CudaTensor<T: CudaElement> {
    data: Option<CudaSlice<T>>,
    shape: Vec<usize>,
    device: Arc<CudaDevice>,
}

impl<T: CudaElement> fmt::Debug for CudaTensor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaTensor<{}>({:?} on {:?})", T::DTYPE, self.shape, self.device)
    }
}

/// The second kernel argument: the other operand or a scalar.
enum Second<'a, T> {
    Tensor(Option<&'a CudaSlice<T>>),
    Scalar(T),
}

fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Unsupported {
        op: "CudaTensor::matmul".into(),
        reason: format!("{what} = {v} exceeds cuBLAS' 32-bit dimension limit"),
    })
}

impl<T: CudaElement> CudaTensor<T> {
    /// Copies a host array to the device (row-major).
    pub fn from_host(device: &Arc<CudaDevice>, a: &ArrayD<T>) -> Result<Self> {
        let v: Vec<T> = a.as_standard_layout().iter().copied().collect();
        Self::from_vec(device, a.shape(), &v)
    }

    /// Copies row-major `data` of `shape` to the device.
    pub fn from_vec(device: &Arc<CudaDevice>, shape: &[usize], data: &[T]) -> Result<Self> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(Error::ShapeMismatch {
                context: "CudaTensor::from_vec".into(),
                expected: shape.to_vec(),
                actual: vec![data.len()],
            });
        }
        // Zero-sized tensors hold no allocation (the driver rejects 0-byte allocations).
        let data = if n == 0 {
            None
        } else {
            Some(device.stream().clone_htod(data).map_err(|e| cuda_err("host to device copy", e))?)
        };
        Ok(CudaTensor { data, shape: shape.to_vec(), device: Arc::clone(device) })
    }

    /// A tensor of zeros.
    pub fn zeros(device: &Arc<CudaDevice>, shape: &[usize]) -> Result<Self> {
        let n: usize = shape.iter().product();
        let data = if n == 0 {
            None
        } else {
            Some(device.stream().alloc_zeros::<T>(n).map_err(|e| cuda_err("device allocation", e))?)
        };
        Ok(CudaTensor { data, shape: shape.to_vec(), device: Arc::clone(device) })
    }

    /// Copies the tensor back to the host (waits for queued work).
    pub fn to_host(&self) -> Result<ArrayD<T>> {
        let v = match &self.data {
            Some(d) => self.device.stream().clone_dtoh(d).map_err(|e| cuda_err("device to host copy", e))?,
            None => vec![],
        };
        ArrayD::from_shape_vec(IxDyn(&self.shape), v).map_err(|e| cuda_err("shaping the host copy", e))
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The device the data lives on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    fn same_device(&self, other: &Self, op: &str) -> Result<()> {
        if Arc::ptr_eq(&self.device, &other.device) {
            Ok(())
        } else {
            Err(Error::InvalidArgument {
                context: format!("CudaTensor::{op}"),
                reason: format!("operands live on {:?} and {:?}", self.device, other.device),
            })
        }
    }

    /// `self [.., m, k] @ other [k, n]` with cuBLAS (leading dims of `self` are batch rows).
    pub fn matmul(&self, other: &Self) -> Result<Self> {
        self.same_device(other, "matmul")?;
        let (k, n) = match (self.shape.last(), other.shape.as_slice()) {
            (Some(&k), &[k2, n]) if k == k2 => (k, n),
            _ => {
                return Err(Error::ShapeMismatch {
                    context: format!("CudaTensor::matmul of {:?} @ {:?}", self.shape, other.shape),
                    expected: vec![*self.shape.last().unwrap_or(&0), *other.shape.last().unwrap_or(&0)],
                    actual: other.shape.clone(),
                })
            }
        };
        let rows: usize = self.shape[..self.shape.len() - 1].iter().product();
        let mut out_shape = self.shape[..self.shape.len() - 1].to_vec();
        out_shape.push(n);
        let mut out = Self::zeros(&self.device, &out_shape)?;
        let (Some(a), Some(b), Some(c)) = (&self.data, &other.data, &mut out.data) else {
            return Ok(out); // an empty operand: the product is zeros (or empty)
        };
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

    /// Element-wise `op` (one of [`BINARY`](super::BINARY)) of two same-shape tensors.
    pub fn binary(&self, op: &str, other: &Self) -> Result<Self> {
        self.same_device(other, op)?;
        if self.shape != other.shape {
            return Err(Error::ShapeMismatch {
                context: format!("CudaTensor::{op} (no broadcasting on the device)"),
                expected: self.shape.clone(),
                actual: other.shape.clone(),
            });
        }
        self.launch(op, Second::Tensor(other.data.as_ref()))
    }

    /// Element-wise unary `op` (one of [`UNARY`](super::UNARY)) with scalar `s`.
    pub fn unary(&self, op: &str, s: T) -> Result<Self> {
        self.launch(op, Second::Scalar(s))
    }

    fn launch(&self, op: &str, second: Second<'_, T>) -> Result<Self> {
        if !super::kernels::BINARY.contains(&op) && !super::kernels::UNARY.contains(&op) {
            return Err(Error::Unsupported { op: op.into(), reason: "no such CUDA element-wise kernel".into() });
        }
        let mut out = Self::zeros(&self.device, &self.shape)?;
        let (Some(a), Some(o)) = (&self.data, &mut out.data) else {
            return Ok(out);
        };
        let n = a.len();
        let cfg = LaunchConfig::for_num_elems(u32::try_from(n).map_err(|_| Error::Unsupported {
            op: op.into(),
            reason: format!("{n} elements exceed one kernel launch"),
        })?);
        let f = self.device.kernels()?.function(op, T::SUFFIX)?;
        let n64 = n as u64;
        let stream = self.device.stream();
        let mut b = stream.launch_builder(&f);
        b.arg(a);
        match &second {
            Second::Tensor(Some(t)) => b.arg(*t),
            Second::Tensor(None) => return Ok(out), // unreachable: same shape as a non-empty `a`
            Second::Scalar(x) => b.arg(x),
        };
        b.arg(o).arg(&n64);
        // SAFETY: every kernel takes (a, b-or-scalar, out, n) and touches indices < n only.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err(&format!("launching {op}"), e))?;
        Ok(out)
    }

    /// `self + other`.
    pub fn add(&self, other: &Self) -> Result<Self> {
        self.binary("add", other)
    }
    /// `self - other`.
    pub fn sub(&self, other: &Self) -> Result<Self> {
        self.binary("sub", other)
    }
    /// `self * other` (element-wise).
    pub fn mul(&self, other: &Self) -> Result<Self> {
        self.binary("mul", other)
    }
    /// `max(x, 0)`.
    pub fn relu(&self) -> Result<Self> {
        self.unary("relu", T::zero())
    }
    /// Exact (erf) GELU.
    pub fn gelu(&self) -> Result<Self> {
        self.unary("gelu", T::zero())
    }
    /// `x * s`.
    pub fn scale(&self, s: T) -> Result<Self> {
        self.unary("scale", s)
    }
}
