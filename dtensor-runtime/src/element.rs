//! Element types a DTensor can hold.

use std::fmt;

/// Runtime tag of an element type; collectives move bytes and use it to reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float (`f32`).
    F32,
    /// 64-bit IEEE float (`f64`).
    F64,
}

impl DType {
    /// The dtype's name in a safetensors header (`F32`, `F64`).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F64 => "F64",
        }
    }

    /// The dtype a safetensors header names, if the runtime has it.
    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        [DType::F32, DType::F64].into_iter().find(|d| d.safetensors_name() == name)
    }

    /// Size of one element in bytes.
    pub fn size_of(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
        })
    }
}

/// What the `cuda` feature needs of an element type on top of [`Element`]'s host bounds
/// (cudarc's device traits and a cuBLAS gemm); nothing without the feature.
#[cfg(feature = "cuda")]
pub use crate::storage::cuda::CudaElement as DeviceElement;

/// What the `cuda` feature needs of an element type on top of [`Element`]'s host bounds
/// (cudarc's device traits and a cuBLAS gemm); nothing without the feature.
#[cfg(not(feature = "cuda"))]
pub trait DeviceElement {}
#[cfg(not(feature = "cuda"))]
impl DeviceElement for f32 {}
#[cfg(not(feature = "cuda"))]
impl DeviceElement for f64 {}

/// A floating point element usable in a [`DTensor`](crate::DTensor).
pub trait Element:
    ndarray::LinalgScalar
    + ndarray::ScalarOperand
    + num_traits::Float
    + num_traits::FromPrimitive
    + bytemuck::Pod
    + Default
    + Send
    + Sync
    + fmt::Debug
    + fmt::Display
    + std::iter::Sum
    + std::ops::AddAssign
    + std::ops::SubAssign
    + std::ops::MulAssign
    + std::ops::DivAssign
    + DeviceElement
    + 'static
{
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// Lossy conversion from f64.
    fn of_f64(v: f64) -> Self;
    /// Conversion to f64.
    fn as_f64(self) -> f64;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn of_f64(v: f64) -> Self {
        v as f32
    }
    fn as_f64(self) -> f64 {
        self as f64
    }
}

impl Element for f64 {
    const DTYPE: DType = DType::F64;
    fn of_f64(v: f64) -> Self {
        v
    }
    fn as_f64(self) -> f64 {
        self
    }
}
