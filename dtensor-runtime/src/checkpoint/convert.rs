//! Element types a safetensors file may hold and how they load into a [`Scalar`]: the
//! element's own dtype is copied as is; the other loadable dtypes (`BF16`, `F16`, `F32`,
//! `F64`, `I64`, `I32`, `U8`) are converted on load by the rule of
//! [`DTensor::cast`](crate::DTensor::cast), Rust's `as` (PyTorch's casts): floats round to
//! nearest when the target is narrower, floats into integers truncate and saturate, integers
//! convert through i64 (exact) and wrap into a narrower integer.

use crate::element::Scalar;
use safetensors::Dtype;

/// Bytes per element of a dtype that loads into a [`Scalar`], `None` for the others
/// (booleans, 8- and 16-bit integers other than `U8`, 8-bit and sub-byte floats, complex).
pub(crate) fn loadable_size(dtype: Dtype) -> Option<usize> {
    match dtype {
        Dtype::U8 => Some(1),
        Dtype::BF16 | Dtype::F16 => Some(2),
        Dtype::F32 | Dtype::I32 => Some(4),
        Dtype::F64 | Dtype::I64 => Some(8),
        _ => None,
    }
}

/// Decodes little-endian `bytes` of `dtype` into `dst` (`bytes.len()` is `dst.len()` times the
/// dtype's size; `dtype` is one [`loadable_size`] accepts).
pub(crate) fn decode_into<T: Scalar>(dtype: Dtype, bytes: &[u8], dst: &mut [T]) {
    fn each<T: Scalar, const N: usize>(bytes: &[u8], dst: &mut [T], f: impl Fn([u8; N]) -> T) {
        for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(N)) {
            *d = f(c.try_into().expect("chunks of N bytes"));
        }
    }
    // The one conversion rule of `DTensor::cast` (Rust's `as`, as PyTorch's casts): integers go
    // through i64, so I64 values beyond 2^53 stay exact and narrower integer targets wrap;
    // floats go through f64 (exact for every source float).
    match dtype {
        Dtype::BF16 => each(bytes, dst, |b| T::of_f64(half::bf16::from_le_bytes(b).to_f64())),
        Dtype::F16 => each(bytes, dst, |b| T::of_f64(half::f16::from_le_bytes(b).to_f64())),
        Dtype::F32 => each(bytes, dst, |b| T::of_f64(f32::from_le_bytes(b) as f64)),
        Dtype::F64 => each(bytes, dst, |b| T::of_f64(f64::from_le_bytes(b))),
        Dtype::I64 => each(bytes, dst, |b| T::of_i64(i64::from_le_bytes(b))),
        Dtype::I32 => each(bytes, dst, |b| T::of_i64(i32::from_le_bytes(b) as i64)),
        Dtype::U8 => each(bytes, dst, |b: [u8; 1]| T::of_i64(b[0] as i64)),
        other => unreachable!("{other:?} is not loadable (checked by the caller)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_loadable_dtype_decodes() {
        let v = [1.5f64, -2.25, 0.0, 1e-3];
        let mut out = [0f32; 4];
        let bf: Vec<u8> = v.iter().flat_map(|&x| half::bf16::from_f64(x).to_le_bytes()).collect();
        decode_into(Dtype::BF16, &bf, &mut out);
        assert_eq!(out[..3], [1.5, -2.25, 0.0]);
        assert_eq!(out[3], half::bf16::from_f64(1e-3).to_f32());
        let h: Vec<u8> = v.iter().flat_map(|&x| half::f16::from_f64(x).to_le_bytes()).collect();
        decode_into(Dtype::F16, &h, &mut out);
        assert_eq!(out[3], half::f16::from_f64(1e-3).to_f32());
        let d: Vec<u8> = v.iter().flat_map(|&x| x.to_le_bytes()).collect();
        let mut out64 = [0f64; 4];
        decode_into(Dtype::F64, &d, &mut out64);
        assert_eq!(out64, v);
        decode_into(Dtype::F64, &d, &mut out);
        assert_eq!(out[3], 1e-3f32, "f64 -> f32 rounds to nearest");
        assert_eq!(loadable_size(Dtype::I16), None);
        assert_eq!(loadable_size(Dtype::I64), Some(8));
        let i: Vec<u8> = [-3i64, 7].iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut ints = [0i32; 2];
        decode_into(Dtype::I64, &i, &mut ints);
        assert_eq!(ints, [-3, 7]);
        decode_into(Dtype::U8, &[200, 1], &mut out[..2]);
        assert_eq!(out[..2], [200.0, 1.0]);
        assert_eq!(loadable_size(Dtype::BF16), Some(2));
    }
}
