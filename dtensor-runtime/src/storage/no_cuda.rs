//! `CudaStorage` without the `cuda` feature: an uninhabited type, so no value of it exists and
//! every `Cuda` arm of the kernel surface is statically unreachable (no panics, no stubs).

use crate::element::Scalar;
use std::convert::Infallible;
use std::fmt;
use std::marker::PhantomData;

/// Device-resident storage. Built without the `cuda` feature, so it cannot exist.
pub struct CudaStorage<T: Scalar> {
    never: Infallible,
    _element: PhantomData<T>,
}

impl<T: Scalar> CudaStorage<T> {
    /// Proof that this code is unreachable.
    pub(crate) fn absurd(&self) -> ! {
        match self.never {}
    }
}

impl<T: Scalar> fmt::Debug for CudaStorage<T> {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.absurd()
    }
}
