//! Element types a DTensor can hold.

pub use half::{bf16, f16};
use std::fmt;

/// Runtime tag of an element type; collectives move bytes and use it to reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float (`f32`).
    F32,
    /// 64-bit IEEE float (`f64`).
    F64,
    /// bfloat16 ([`half::bf16`]): f32's exponent range with an 8-bit significand.
    BF16,
    /// 16-bit IEEE float ([`half::f16`]).
    F16,
}

impl DType {
    /// Every dtype the runtime has.
    pub const ALL: [DType; 4] = [DType::F32, DType::F64, DType::BF16, DType::F16];

    /// The dtype's name in a safetensors header (`F32`, `F64`, `BF16`, `F16`).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F64 => "F64",
            DType::BF16 => "BF16",
            DType::F16 => "F16",
        }
    }

    /// The dtype a safetensors header names, if the runtime has it.
    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.safetensors_name() == name)
    }

    /// The Rust name of the type (`f32`, `f64`, `bf16`, `f16`), as shown and fingerprinted.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        }
    }

    /// Size of one element in bytes.
    pub fn size_of(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// Whether this is a 16-bit float, whose arithmetic the kernels carry out in f32.
    pub fn is_half(self) -> bool {
        matches!(self, DType::BF16 | DType::F16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
#[cfg(not(feature = "cuda"))]
impl DeviceElement for bf16 {}
#[cfg(not(feature = "cuda"))]
impl DeviceElement for f16 {}

/// A floating point element usable in a [`DTensor`](crate::DTensor): `f32`, `f64`, and the
/// 16-bit [`half::bf16`] and [`half::f16`].
///
/// The 16-bit types store and move as 16 bits, but every kernel whose result depends on
/// rounding (matmul, reductions, softmax, collectives' reductions) widens them to f32,
/// computes, and rounds once at the end, as PyTorch's CPU kernels do. Under the `cuda`
/// feature they can be moved to a device and communicated, but device kernels return
/// "dtype bf16 has no CUDA kernels yet" ([`Error::Unsupported`](crate::Error::Unsupported)).
pub trait Element:
    ndarray::LinalgScalar
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

macro_rules! half_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            /// Through f32, as PyTorch converts a double to a 16-bit float.
            fn of_f64(v: f64) -> Self {
                <$t>::from_f32(v as f32)
            }
            fn as_f64(self) -> f64 {
                self.to_f64()
            }
        }
    };
}
half_element!(bf16, DType::BF16);
half_element!(f16, DType::F16);

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
