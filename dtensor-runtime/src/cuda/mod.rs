//! CUDA devices (cargo feature `cuda`, through cudarc): library checks, the device handle and
//! its compiled kernels.
//!
//! Layers, in the spirit of cudarc's sys/result/safe split: cudarc provides the raw bindings
//! and checked calls; [`CudaDevice`] owns one context, one stream and the lazily created
//! cuBLAS handle and kernel module; device-resident tensor data is
//! [`CudaStorage`](crate::storage::CudaStorage), one arm of the kernel surface
//! [`Storage`](crate::storage::Storage).
//!
//! Library names: cudarc is built with its CUDA 13.0 bindings (feature `cuda-13000`), whose
//! loader tries `libX.so`, then `libX.so.13`, `libX.so.12`, ... With the 12.x bindings it tried
//! `.12` and older only, so the `libnvrtc.so.13` and `libcublas.so.13` of CUDA 13 (all that pip's
//! `nvidia-*` cu13 wheels install) were never found. A CUDA 12 installation still loads, by its
//! `.12` names, for the functions both versions share (symbols are looked up on first use).
//!
//! cudarc loads the CUDA libraries at run time and *panics* when one is missing; every entry
//! point here checks with cudarc's `is_culib_present` first and returns
//! [`Error::Unavailable`] instead. Without the `cuda` feature [`CudaDevice`] is an uninhabited
//! type whose constructor, like [`availability`] and [`device_count`], reports the feature as
//! missing.

use crate::error::{Error, Result};

#[cfg(not(feature = "cuda"))]
mod absent;
pub mod args;
pub mod counters;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod element;
#[cfg(feature = "cuda")]
pub mod kernels;
pub mod source;

#[cfg(not(feature = "cuda"))]
pub use absent::CudaDevice;
pub use counters::DeviceCounters;
#[cfg(feature = "cuda")]
pub use device::CudaDevice;
#[cfg(feature = "cuda")]
pub use element::CudaElement;

/// A CUDA library this crate loads at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaLib {
    /// The driver (`libcuda.so`).
    Driver,
    /// The runtime compiler (`libnvrtc.so`), for element-wise kernels.
    Nvrtc,
    /// cuBLAS (`libcublas.so`), for matmul.
    Cublas,
    /// NCCL (`libnccl.so`), for the NCCL communicator.
    Nccl,
}

impl CudaLib {
    fn name(self) -> &'static str {
        match self {
            CudaLib::Driver => "the CUDA driver library (libcuda.so)",
            CudaLib::Nvrtc => "NVRTC (libnvrtc.so)",
            CudaLib::Cublas => "cuBLAS (libcublas.so)",
            CudaLib::Nccl => "NCCL (libnccl.so)",
        }
    }
}

/// `Ok` when `lib` can be loaded, else [`Error::Unavailable`] saying what is missing.
///
/// NCCL: cudarc tries `libnccl.so`, `libnccl.so.12`, `.11`, ... but not `libnccl.so.2`, the
/// name NCCL packages (and pip's `nvidia-nccl-cu13`) install. If only `libnccl.so.2` exists,
/// create a link `ln -s /path/libnccl.so.2 /some/dir/libnccl.so` and put `/some/dir` on
/// `LD_LIBRARY_PATH` (scripts/gpu-check.sh does this).
pub fn require(lib: CudaLib) -> Result<()> {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: these only try to dlopen the library by name.
        let present = unsafe {
            match lib {
                CudaLib::Driver => cudarc::driver::sys::is_culib_present(),
                CudaLib::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                CudaLib::Cublas => cudarc::cublas::sys::is_culib_present(),
                CudaLib::Nccl => cudarc::nccl::sys::is_culib_present(),
            }
        };
        if present {
            return Ok(());
        }
        let hint = if lib == CudaLib::Nccl {
            "; cudarc does not try libnccl.so.2: link it as libnccl.so in a directory on LD_LIBRARY_PATH"
        } else {
            "; is it on LD_LIBRARY_PATH?"
        };
        Err(Error::Unavailable { what: lib.name().into(), reason: format!("the library could not be loaded{hint}") })
    }
    #[cfg(not(feature = "cuda"))]
    Err(not_built(lib.name()))
}

#[cfg(not(feature = "cuda"))]
fn not_built(what: &str) -> Error {
    Error::Unavailable {
        what: what.into(),
        reason: "dtensor-runtime was built without the `cuda` cargo feature".into(),
    }
}

/// Number of CUDA devices, or [`Error::Unavailable`] (no feature, no driver, no device).
pub fn device_count() -> Result<usize> {
    #[cfg(feature = "cuda")]
    {
        require(CudaLib::Driver)?;
        let n = cudarc::driver::CudaContext::device_count().map_err(|e| Error::Unavailable {
            what: "a CUDA device".into(),
            reason: format!("the driver reports {e:?}"),
        })?;
        if n <= 0 {
            return Err(Error::Unavailable {
                what: "a CUDA device".into(),
                reason: "the driver reports 0 devices".into(),
            });
        }
        Ok(n as usize)
    }
    #[cfg(not(feature = "cuda"))]
    Err(not_built("CUDA"))
}

/// `Ok` when this process can use a CUDA device (driver loaded and at least one device).
pub fn availability() -> Result<()> {
    device_count().map(|_| ())
}

/// Maps a cudarc error into the runtime's error type.
#[cfg(feature = "cuda")]
pub(crate) fn cuda_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Backend { backend: "cuda".into(), message: format!("{what}: {e:?}") }
}

/// The error of a device op on an element type without its CUDA kernel (the integers have
/// only the copy kernels and the casts).
#[cfg(feature = "cuda")]
pub(crate) fn no_kernels(op: &str, dtype: &str) -> Error {
    Error::Unsupported { op: op.into(), reason: format!("dtype {dtype} has no CUDA kernel `{op}`") }
}
