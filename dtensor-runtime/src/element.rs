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
    /// 64-bit signed integer (`i64`): token ids, class targets.
    I64,
    /// 32-bit signed integer (`i32`).
    I32,
    /// 8-bit unsigned integer (`u8`): byte masks.
    U8,
}

impl DType {
    /// Every dtype the runtime has.
    pub const ALL: [DType; 7] = [DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::U8];

    /// The floating point dtypes (what [`Element`] is implemented for).
    pub const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::BF16, DType::F16];

    /// The dtype's name in a safetensors header (`F32`, `F64`, `BF16`, `F16`, `I64`, `I32`, `U8`).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F64 => "F64",
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::U8 => "U8",
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
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
        }
    }

    /// Size of one element in bytes.
    pub fn size_of(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::BF16 | DType::F16 => 2,
            DType::U8 => 1,
        }
    }

    /// Whether this is a 16-bit float, whose arithmetic the kernels carry out in f32.
    pub fn is_half(self) -> bool {
        matches!(self, DType::BF16 | DType::F16)
    }

    /// Whether this is a floating point dtype (one [`Element`] is implemented for).
    pub fn is_float(self) -> bool {
        !matches!(self, DType::I64 | DType::I32 | DType::U8)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the `cuda` feature needs of an element type on top of [`Scalar`]'s host bounds
/// (cudarc's device traits and a cuBLAS gemm); nothing without the feature.
#[cfg(feature = "cuda")]
pub use crate::cuda::CudaElement as DeviceElement;

/// What the `cuda` feature needs of an element type on top of [`Scalar`]'s host bounds
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
#[cfg(not(feature = "cuda"))]
impl DeviceElement for i64 {}
#[cfg(not(feature = "cuda"))]
impl DeviceElement for i32 {}
#[cfg(not(feature = "cuda"))]
impl DeviceElement for u8 {}

/// Every element type a [`DTensor`](crate::DTensor) can hold: the floats ([`Element`]) and
/// the integers `i64`, `i32`, `u8`.
///
/// What every tensor supports needs only this: storage, factories with a value, moves,
/// redistribution, collectives, checkpoints, casts, comparisons (`eq_mask` … `ge_mask`,
/// `compare_mask`), `where_`/`masked_fill`, the shape ops (views, `permute`, `transpose`,
/// `cat`/`stack`, `narrow`/`slice`/`split`/`chunk`, `expand`, `repeat`) and `index_select` /
/// `gather`. These ops are written once for every `Scalar` and record autograd only for the
/// floats (an integer tensor cannot require grad). Arithmetic needs [`Element`], so a float op
/// on an integer tensor is a compile error: no integer op that could lose meaning (a
/// truncating division, an overflowing sum) is offered. Integer reductions in collectives are exact
/// (integer arithmetic, wrapping on overflow as PyTorch and NCCL do); `Avg` of integers is
/// an [`Error::Unsupported`](crate::Error::Unsupported), as PyTorch refuses it.
pub trait Scalar:
    bytemuck::Pod
    + num_traits::Zero
    + num_traits::One
    + PartialEq
    + PartialOrd
    + Default
    + Send
    + Sync
    + fmt::Debug
    + fmt::Display
    + DeviceElement
    + 'static
{
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// Conversion from f64 (rounded for the 16-bit floats; truncated toward zero and
    /// saturated for integers, as Rust's `as`).
    fn of_f64(v: f64) -> Self;
    /// Conversion to f64 (exact except for integers beyond 2⁵³).
    fn as_f64(self) -> f64;
    /// Conversion from i64 with Rust's `as` (PyTorch's integer casts): the integers wrap when
    /// narrower, the floats round to nearest.
    fn of_i64(v: i64) -> Self;
    /// Conversion to i64 with Rust's `as`: exact for the integers, truncated toward zero and
    /// saturated for the floats (casts between integers go through this, never through f64).
    fn as_i64(self) -> i64;
}

/// A floating point element usable in a [`DTensor`](crate::DTensor): `f32`, `f64`, and the
/// 16-bit [`half::bf16`] and [`half::f16`].
///
/// The 16-bit types store and move as 16 bits, but every kernel whose result depends on
/// rounding (matmul, reductions, softmax, collectives' reductions) widens them to f32,
/// computes, and rounds once at the end, as PyTorch's CPU kernels do; the CUDA kernels
/// (feature `cuda`) do the same.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a floating-point element type: this op needs f32, f64, bf16 or f16",
    label = "needs a floating-point tensor, not `{Self}`",
    note = "integer tensors (i64, i32, u8) support storage, moves, redistribution, casts, comparisons, `where_`, shape ops and indexing, and serve as `embedding` ids and `cross_entropy` targets; call `.cast::<f32>()` first for arithmetic"
)]
pub trait Element:
    IndexElement
    + ndarray::LinalgScalar
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
}

/// Element types that can carry indices ([`DTensor::embedding`](crate::DTensor::embedding) ids,
/// [`DTensor::cross_entropy`](crate::DTensor::cross_entropy) targets, `one_hot`,
/// `index_select` / `gather` indices): the signed integers, and the floats for whole-number
/// ids (a float type holds every integer only up to 2²⁴ in f32, 2¹¹ in f16, 2⁸ in bf16).
/// Every op converts ids once to `i64` (integers exactly; floats only when whole numbers, else
/// an [`Error::InvalidArgument`](crate::Error::InvalidArgument)) and its kernels read `i64`,
/// never the data's element type: a bf16 table serves every id of a large vocabulary.
pub trait IndexElement: Scalar {}
impl IndexElement for i64 {}
impl IndexElement for i32 {}
impl IndexElement for f32 {}
impl IndexElement for f64 {}
impl IndexElement for bf16 {}
impl IndexElement for f16 {}

macro_rules! half_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {}
        impl Scalar for $t {
            const DTYPE: DType = $d;
            /// Through f32, as PyTorch converts a double to a 16-bit float.
            fn of_f64(v: f64) -> Self {
                <$t>::from_f32(v as f32)
            }
            fn as_f64(self) -> f64 {
                self.to_f64()
            }
            /// Through f32, as PyTorch converts an integer to a 16-bit float.
            fn of_i64(v: i64) -> Self {
                <$t>::from_f32(v as f32)
            }
            fn as_i64(self) -> i64 {
                self.to_f32() as i64
            }
        }
    };
}
half_element!(bf16, DType::BF16);
half_element!(f16, DType::F16);

impl Element for f32 {}
impl Scalar for f32 {
    const DTYPE: DType = DType::F32;
    fn of_f64(v: f64) -> Self {
        v as f32
    }
    fn as_f64(self) -> f64 {
        self as f64
    }
    fn of_i64(v: i64) -> Self {
        v as f32
    }
    fn as_i64(self) -> i64 {
        self as i64
    }
}

impl Element for f64 {}
impl Scalar for f64 {
    const DTYPE: DType = DType::F64;
    fn of_f64(v: f64) -> Self {
        v
    }
    fn as_f64(self) -> f64 {
        self
    }
    fn of_i64(v: i64) -> Self {
        v as f64
    }
    fn as_i64(self) -> i64 {
        self as i64
    }
}

macro_rules! int_scalar {
    ($t:ty, $d:expr) => {
        impl Scalar for $t {
            const DTYPE: DType = $d;
            fn of_f64(v: f64) -> Self {
                v as $t
            }
            fn as_f64(self) -> f64 {
                self as f64
            }
            fn of_i64(v: i64) -> Self {
                v as $t
            }
            fn as_i64(self) -> i64 {
                self as i64
            }
        }
    };
}
int_scalar!(i64, DType::I64);
int_scalar!(i32, DType::I32);
int_scalar!(u8, DType::U8);

/// `v` as a `U`, when `U` is `V` itself (an identity, never a conversion); `None` otherwise.
/// How code written once for every [`Scalar`] reaches a float-only path: on the type's
/// identity, so no element type carries hooks into the layers above.
pub(crate) fn same_type<V: 'static, U: 'static>(v: V) -> Option<U> {
    let mut slot = Some(v);
    (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<U>>().and_then(Option::take)
}
