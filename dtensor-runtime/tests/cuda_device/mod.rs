//! What the CUDA device tests share: the device or a printed skip, and host/device copies.
#![allow(dead_code)]

use dtensor_runtime::cuda::CudaDevice;
use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::storage::CudaStorage;
use dtensor_runtime::{Error, Scalar, Storage};
use std::sync::Arc;

/// Device 0, or `None` after checking the error is typed and printing the test's
/// `GPUCHECK test | SKIP | reason` row.
pub fn device(test: &str) -> Option<Arc<CudaDevice>> {
    match CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(matches!(e, Error::Unavailable { .. }), "{test}: expected Error::Unavailable, got {e:?}");
            println!("GPUCHECK {test} | SKIP | {e}");
            None
        }
    }
}

/// `a` copied to the device.
pub fn up<T: Scalar>(dev: &Arc<CudaDevice>, a: &ArrayD<T>) -> Storage<T> {
    Storage::Cuda(CudaStorage::from_host(dev, a).unwrap())
}

/// The storage's data on the host.
pub fn down<T: Scalar>(s: Storage<T>) -> ArrayD<T> {
    s.into_host().unwrap()
}
