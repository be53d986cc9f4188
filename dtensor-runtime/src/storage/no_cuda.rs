//! `CudaStorage` without the `cuda` feature: an uninhabited type, so no value of it exists and
//! every `Cuda` arm of the kernel surface is statically unreachable (no panics, no stubs).

use crate::element::Element;
use std::convert::Infallible;
use std::fmt;
use std::marker::PhantomData;

/// Device-resident storage. Built without the `cuda` feature, so it cannot exist.
pub struct CudaStorage<T: Element> {
    never: Infallible,
    _element: PhantomData<T>,
}

impl<T: Element> CudaStorage<T> {
    /// Proof that this code is unreachable.
    pub(crate) fn absurd(&self) -> ! {
        match self.never {}
    }
}

impl<T: Element> fmt::Debug for CudaStorage<T> {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.absurd()
    }
}
