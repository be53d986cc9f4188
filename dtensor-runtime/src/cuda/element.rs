//! What an element type needs to live on a CUDA device (feature `cuda`): cudarc's device
//! traits, its kernel name suffix and its cuBLAS gemm. [`Scalar`](crate::Scalar) requires it
//! (as `DeviceElement`), so it sits beside the device handle, below everything that computes.

use super::cuda_err;
use crate::error::Result;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

/// What an element type needs to live on a CUDA device: cudarc's device traits, a kernel
/// name suffix and cuBLAS gemms (the floats; the 16-bit ones accumulate in f32).
pub trait CudaElement: DeviceRepr + ValidAsZeroBits + Copy + 'static {
    /// Kernel name suffix (`f32`, `bf16`, `i64`, ...).
    const SUFFIX: &'static str;
    /// The type the arithmetic kernels compute in and take their scalars in: the element type
    /// for f32 and f64, f32 for the 16-bit floats and for the integers (which have no such
    /// kernels).
    type Arg: DeviceRepr + Copy + std::ops::Div<Output = Self::Arg>;
    #[doc(hidden)]
    fn arg(v: f64) -> Self::Arg;
    #[doc(hidden)]
    fn gemm(
        blas: &CudaBlas,
        cfg: GemmConfig<Self>,
        a: &CudaSlice<Self>,
        b: &CudaSlice<Self>,
        c: &mut CudaSlice<Self>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn gemm_strided_batched(
        blas: &CudaBlas,
        cfg: StridedBatchedConfig<Self>,
        a: &CudaSlice<Self>,
        b: &CudaSlice<Self>,
        c: &mut CudaSlice<Self>,
    ) -> Result<()>;
}

/// A float: cudarc's cuBLAS gemms (for bf16 and f16 `cublasGemmEx` with `CUBLAS_COMPUTE_32F`:
/// products accumulated in f32 and rounded once, as the host's 16-bit matmul).
macro_rules! cuda_float {
    ($t:ty, $sfx:literal, $arg:ty) => {
        impl CudaElement for $t {
            const SUFFIX: &'static str = $sfx;
            type Arg = $arg;
            fn arg(v: f64) -> $arg {
                v as $arg
            }
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
            fn gemm_strided_batched(
                blas: &CudaBlas,
                cfg: StridedBatchedConfig<Self>,
                a: &CudaSlice<Self>,
                b: &CudaSlice<Self>,
                c: &mut CudaSlice<Self>,
            ) -> Result<()> {
                // SAFETY: the caller sized a, b, c for cfg (see `CudaStorage::matmul`).
                unsafe { blas.gemm_strided_batched(cfg, a, b, c) }
                    .map_err(|e| cuda_err("cuBLAS strided-batched gemm", e))
            }
        }
    };
}
cuda_float!(f32, "f32", f32);
cuda_float!(f64, "f64", f64);
cuda_float!(half::bf16, "bf16", f32);
cuda_float!(half::f16, "f16", f32);

/// An integer: it lives on a device, is communicated (NCCL has them all), filled, moved (pack
/// plans, `cat`) and cast; arithmetic needs a float tensor, so no other kernel is reached, and
/// a gemm is a typed error.
macro_rules! cuda_int {
    ($t:ty, $sfx:literal) => {
        impl CudaElement for $t {
            const SUFFIX: &'static str = $sfx;
            type Arg = f32;
            fn arg(v: f64) -> f32 {
                v as f32
            }
            fn gemm(
                _: &CudaBlas,
                _: GemmConfig<Self>,
                _: &CudaSlice<Self>,
                _: &CudaSlice<Self>,
                _: &mut CudaSlice<Self>,
            ) -> Result<()> {
                Err(crate::cuda::no_kernels("matmul", $sfx))
            }
            fn gemm_strided_batched(
                _: &CudaBlas,
                _: StridedBatchedConfig<Self>,
                _: &CudaSlice<Self>,
                _: &CudaSlice<Self>,
                _: &mut CudaSlice<Self>,
            ) -> Result<()> {
                Err(crate::cuda::no_kernels("matmul", $sfx))
            }
        }
    };
}
cuda_int!(i64, "i64");
cuda_int!(i32, "i32");
cuda_int!(u8, "u8");
