//! `CudaDevice` without the `cuda` feature: an uninhabited type (opening a device reports that
//! the feature is missing), so the device-facing API is the same with and without it.

use crate::error::Result;
use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;

/// A CUDA device. Built without the `cuda` feature, so none can be opened.
pub struct CudaDevice {
    never: Infallible,
}

impl CudaDevice {
    /// Always [`Error::Unavailable`](crate::Error::Unavailable): the feature is off.
    pub fn new(_ordinal: usize) -> Result<Arc<CudaDevice>> {
        Err(super::not_built("CUDA"))
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> usize {
        self.absurd()
    }

    /// Proof that this code is unreachable.
    pub(crate) fn absurd(&self) -> ! {
        match self.never {}
    }
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.absurd()
    }
}
