//! One CUDA device: context, stream, and lazily created cuBLAS handle and kernel module.

use super::{cuda_err, kernels::Kernels, require, CudaLib};
use crate::error::{Error, Result};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaStream};
use std::fmt;
use std::sync::{Arc, Mutex};

/// A handle on one CUDA device: work queued through one handle is ordered; two handles on the
/// same GPU (two ranks) run independently.
///
/// Each handle owns one non-blocking stream, shared by cuBLAS and the kernels; never the
/// legacy null stream, which synchronises with every other stream of the context (two ranks of
/// one process on it would serialise, and deadlock once a collective waits for a peer). Open
/// one handle per rank.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: Mutex<Option<Arc<CudaBlas>>>,
    kernels: Mutex<Option<Arc<Kernels>>>,
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaDevice({})", self.ctx.ordinal())
    }
}

impl CudaDevice {
    /// Opens device `ordinal` (errors: [`Error::Unavailable`] without driver or device).
    pub fn new(ordinal: usize) -> Result<Arc<CudaDevice>> {
        let count = super::device_count()?;
        if ordinal >= count {
            return Err(Error::Unavailable {
                what: format!("CUDA device {ordinal}"),
                reason: format!("this machine has {count} device(s)"),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| cuda_err("creating the CUDA context", e))?;
        let stream = ctx.new_stream().map_err(|e| cuda_err("creating the rank's stream", e))?;
        Ok(Arc::new(CudaDevice { ctx, stream, blas: Mutex::new(None), kernels: Mutex::new(None) }))
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device name reported by the driver.
    pub fn name(&self) -> Result<String> {
        self.ctx.name().map_err(|e| cuda_err("device name", e))
    }

    /// The stream all work of this handle is queued on (owned, non-blocking).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The CUDA context (made current on the calling thread by cudarc calls).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Waits until all queued work has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| cuda_err("stream synchronize", e))
    }

    /// Enqueues a copy of `bytes` bytes from device address `src` to `dst` on this handle's
    /// stream. Either may be memory of another GPU of this process: with unified addressing
    /// the driver infers the devices from the addresses (a peer copy when they differ).
    ///
    /// # Safety
    /// Both ranges are device memory of at least `bytes` bytes that stays alive, and that no
    /// other work writes (nor, for `dst`, reads), until this stream has passed the copy.
    pub(crate) unsafe fn copy_raw(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(|e| cuda_err("binding the CUDA context", e))?;
        super::counters::count(super::counters::Work::DeviceToDevice);
        // SAFETY: the caller's contract; the stream is this handle's, alive with it.
        unsafe { cudarc::driver::sys::cuMemcpyAsync(dst, src, bytes, self.stream.cu_stream()) }
            .result()
            .map_err(|e| cuda_err("device-to-device copy", e))
    }

    pub(crate) fn blas(&self) -> Result<Arc<CudaBlas>> {
        let mut b = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = &*b {
            return Ok(Arc::clone(b));
        }
        require(CudaLib::Cublas)?;
        let h =
            Arc::new(CudaBlas::new(Arc::clone(&self.stream)).map_err(|e| cuda_err("creating the cuBLAS handle", e))?);
        // The 16-bit gemms accumulate in f32 (their compute type): without this flag cuBLAS may
        // round split-k partial sums to the 16-bit output type, unlike the host's matmul.
        use cudarc::cublas::sys::{cublasMath_t, cublasSetMathMode};
        // SAFETY: a valid handle just created, and a mode of the enum.
        unsafe { cublasSetMathMode(*h.handle(), cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) }
            .result()
            .map_err(|e| cuda_err("setting the cuBLAS math mode", e))?;
        *b = Some(Arc::clone(&h));
        Ok(h)
    }

    pub(crate) fn kernels(&self) -> Result<Arc<Kernels>> {
        let mut k = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = &*k {
            return Ok(Arc::clone(k));
        }
        let m = Kernels::for_device(&self.ctx)?;
        *k = Some(Arc::clone(&m));
        Ok(m)
    }
}
