//! Element-wise reductions on byte buffers, shared by the CPU backends.

use crate::element::DType;
use crate::error::{Error, Result};
use crate::placement::ReduceOp;
use std::mem::MaybeUninit;

/// Calls the generic `$f::<T>(args)` with `T` the Rust type of `$dtype`: the one place a new
/// dtype is added to the byte-level reductions.
macro_rules! with_dtype {
    ($dtype:expr, $f:ident($($arg:expr),*)) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            // `half`'s arithmetic widens each pair to f32 and rounds the result once.
            DType::BF16 => $f::<half::bf16>($($arg),*),
            DType::F16 => $f::<half::f16>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::U8 => $f::<u8>($($arg),*),
        }
    };
}

/// The arithmetic a reduction needs of an element type.
trait Fold: bytemuck::Pod {
    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    /// NaN-propagating, as PyTorch's max/min (`Float::max` would drop a NaN operand).
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    /// 1 where NaN, else 0 (see [`nan_mask`]).
    fn nan_flag(self) -> Self;
    fn nan() -> Self;
    /// `self / n` (`Avg`); integers never get here (refused by [`check_op`]), so they keep
    /// the sum.
    fn div_n(self, n: usize) -> Self;
}

macro_rules! float_fold {
    ($($t:ty),*) => {$(
        impl Fold for $t {
            fn sum(a: Self, b: Self) -> Self { a + b }
            fn prod(a: Self, b: Self) -> Self { a * b }
            fn max(a: Self, b: Self) -> Self { if a > b || a.is_nan() { a } else { b } }
            fn min(a: Self, b: Self) -> Self { if a < b || a.is_nan() { a } else { b } }
            fn nan_flag(self) -> Self {
                if num_traits::Float::is_nan(self) { num_traits::One::one() } else { num_traits::Zero::zero() }
            }
            fn nan() -> Self { num_traits::Float::nan() }
            fn div_n(self, n: usize) -> Self {
                self / <$t as num_traits::FromPrimitive>::from_usize(n).unwrap_or_else(num_traits::One::one)
            }
        }
    )*};
}
float_fold!(f32, f64, half::bf16, half::f16);

/// Exact integer arithmetic, wrapping on overflow as PyTorch's and NCCL's integer sums do.
macro_rules! int_fold {
    ($($t:ty),*) => {$(
        impl Fold for $t {
            fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            fn prod(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
            fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            fn nan_flag(self) -> Self { 0 }
            fn nan() -> Self { 0 }
            fn div_n(self, _: usize) -> Self { self }
        }
    )*};
}
int_fold!(i64, i32, u8);

/// Whether `op` is defined on `dtype`: `Avg` of integers is not (PyTorch refuses it too).
pub(crate) fn check_op(dtype: DType, op: ReduceOp) -> Result<()> {
    if op == ReduceOp::Avg && !dtype.is_float() {
        return Err(Error::Unsupported {
            op: format!("reduce({op})"),
            reason: format!("the average of integers (dtype {dtype}) is not an integer; cast to a float first"),
        });
    }
    Ok(())
}

fn typed<T: bytemuck::Pod>(b: &[u8]) -> std::borrow::Cow<'_, [T]> {
    match bytemuck::try_cast_slice(b) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        // Misaligned bytes (never produced by our own wrappers): copy to an aligned buffer.
        Err(_) => std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(b)),
    }
}

/// Runs `run` on `buf` viewed as `[T]` (through an aligned copy when misaligned).
fn on_typed_mut<T: bytemuck::Pod>(buf: &mut [u8], run: impl FnOnce(&mut [T])) {
    match bytemuck::try_cast_slice_mut::<u8, T>(buf) {
        Ok(a) => run(a),
        Err(_) => {
            let mut a: Vec<T> = bytemuck::pod_collect_to_vec(buf);
            run(&mut a);
            buf.copy_from_slice(bytemuck::cast_slice(&a));
        }
    }
}

fn fold<T: Fold>(op: ReduceOp, acc: &mut [u8], x: &[u8]) {
    let xs = typed::<T>(x);
    // One tight loop per op (the match stays out of the loop so it vectorises).
    fn apply<T: Copy>(a: &mut [T], b: &[T], f: impl Fn(T, T) -> T) {
        a.iter_mut().zip(b).for_each(|(a, b)| *a = f(*a, *b));
    }
    on_typed_mut::<T>(acc, |a| match op {
        ReduceOp::Sum | ReduceOp::Avg => apply(a, &xs, T::sum),
        ReduceOp::Min => apply(a, &xs, T::min),
        ReduceOp::Max => apply(a, &xs, T::max),
        ReduceOp::Product => apply(a, &xs, T::prod),
    });
}

/// `acc = acc ⊕ x` element-wise. `Avg` accumulates a sum; call [`finish`] afterwards.
pub fn accumulate(dtype: DType, op: ReduceOp, acc: &mut [u8], x: &[u8]) -> Result<()> {
    check_op(dtype, op)?;
    if acc.len() != x.len() {
        return Err(Error::BufferMismatch {
            op: format!("reduce({op})"),
            reason: format!("peer buffer has {} bytes, local has {}", x.len(), acc.len()),
        });
    }
    with_dtype!(dtype, fold(op, acc, x));
    Ok(())
}

fn combine_typed<T: Fold>(op: ReduceOp, out: &mut [MaybeUninit<u8>], a: &[u8], b: &[u8]) {
    let (a, b) = (typed::<T>(a), typed::<T>(b));
    // One tight loop per op (the match stays out of the loop, the op is a fn item, not a
    // pointer, so the loop vectorises), as in `fold`.
    fn apply<T: Copy>(o: &mut [MaybeUninit<T>], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
        o.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (a, b))| {
            o.write(f(*a, *b));
        });
    }
    let run = |o: &mut [MaybeUninit<T>]| match op {
        ReduceOp::Sum | ReduceOp::Avg => apply(o, &a, &b, T::sum),
        ReduceOp::Min => apply(o, &a, &b, T::min),
        ReduceOp::Max => apply(o, &a, &b, T::max),
        ReduceOp::Product => apply(o, &a, &b, T::prod),
    };
    if out.as_ptr().cast::<T>().is_aligned() {
        // SAFETY: `out` holds `a.len()` elements' bytes (checked by `combine`), aligned for
        // `T`; `MaybeUninit<T>` needs no initialised contents.
        run(unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<MaybeUninit<T>>(), a.len()) });
    } else {
        let mut v: Vec<MaybeUninit<T>> = vec![MaybeUninit::uninit(); a.len()];
        run(&mut v);
        // SAFETY: `run` wrote every element of `v`.
        let v: Vec<T> = v.into_iter().map(|x| unsafe { x.assume_init() }).collect();
        out.write_copy_of_slice(bytemuck::cast_slice(&v));
    }
}

/// `out = a ⊕ b` element-wise: the first fold of a reduction written straight into its
/// output (one pass instead of a copy of `a` and an [`accumulate`]), which need not be
/// initialised; returns it initialised. `Avg` sums; call [`finish`] afterwards.
pub fn combine<'o>(
    dtype: DType,
    op: ReduceOp,
    out: &'o mut [MaybeUninit<u8>],
    a: &[u8],
    b: &[u8],
) -> Result<&'o mut [u8]> {
    check_op(dtype, op)?;
    if a.len() != out.len() || b.len() != out.len() {
        return Err(Error::BufferMismatch {
            op: format!("reduce({op})"),
            reason: format!("inputs have {} and {} bytes, the output {}", a.len(), b.len(), out.len()),
        });
    }
    if !a.len().is_multiple_of(dtype.size_of()) {
        return Err(Error::BufferMismatch {
            op: format!("reduce({op})"),
            reason: format!("{} bytes is not a whole number of {dtype}", a.len()),
        });
    }
    with_dtype!(dtype, combine_typed(op, out, a, b));
    // SAFETY: `combine_typed` wrote all `a.len() == out.len()` bytes.
    Ok(unsafe { &mut *(std::ptr::from_mut::<[MaybeUninit<u8>]>(out) as *mut [u8]) })
}

/// Final step of a reduction over `n` members (divides by `n` for `Avg`).
pub fn finish(dtype: DType, op: ReduceOp, acc: &mut [u8], n: usize) {
    if op != ReduceOp::Avg {
        return;
    }
    fn div<T: Fold>(acc: &mut [u8], n: usize) {
        on_typed_mut::<T>(acc, |v| v.iter_mut().for_each(|x| *x = x.div_n(n)));
    }
    with_dtype!(dtype, div(acc, n))
}

/// `out = b₀ ⊕ b₁ ⊕ …` over the `out.len()`-byte blocks of `blocks`, in order (so every rank
/// that folds the same blocks gets the same bits), then [`finish`]: the reduction of a backend
/// that gathers the members' buffers and reduces locally (MPI for the 16-bit floats).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn fold_blocks(dtype: DType, op: ReduceOp, blocks: &[u8], out: &mut [u8]) -> Result<()> {
    check_op(dtype, op)?;
    let n = if out.is_empty() { 0 } else { blocks.len() / out.len() };
    for (k, b) in blocks.chunks_exact(out.len().max(1)).enumerate() {
        if k == 0 {
            out.copy_from_slice(b);
        } else {
            accumulate(dtype, op, out, b)?;
        }
    }
    finish(dtype, op, out, n);
    Ok(())
}

/// Whether a backend whose native max/min drop NaN operands (MPI's `MPI_MAX`/`MPI_MIN`, NCCL's) must
/// fix the result up with [`nan_mask`] and [`apply_nan_mask`] (integers have no NaN).
#[cfg_attr(not(any(feature = "mpi", feature = "cuda")), allow(dead_code))]
pub(crate) fn drops_nan(dtype: DType, op: ReduceOp) -> bool {
    dtype.is_float() && matches!(op, ReduceOp::Max | ReduceOp::Min)
}

/// One element of `dtype` per element of `buf`: 1 where it is NaN, else 0. Reduced with `Max`
/// over a group it marks the elements whose true max/min is NaN.
#[cfg_attr(not(any(feature = "mpi", feature = "cuda")), allow(dead_code))]
pub(crate) fn nan_mask(dtype: DType, buf: &[u8]) -> Vec<u8> {
    fn mask<T: Fold>(buf: &[u8]) -> Vec<u8> {
        let m: Vec<T> = typed::<T>(buf).iter().map(|x| x.nan_flag()).collect();
        bytemuck::cast_slice(&m).to_vec()
    }
    with_dtype!(dtype, mask(buf))
}

/// Sets to NaN every element of `buf` whose element in `mask` (from [`nan_mask`]) is non-zero.
#[cfg_attr(not(any(feature = "mpi", feature = "cuda")), allow(dead_code))]
pub(crate) fn apply_nan_mask(dtype: DType, buf: &mut [u8], mask: &[u8]) {
    fn apply<T: Fold>(buf: &mut [u8], mask: &[u8]) {
        let m = typed::<T>(mask);
        on_typed_mut::<T>(buf, |v| {
            // Mask elements are exactly 0 or 1, so "non-zero" is "some byte set".
            let set = |m: &T| bytemuck::bytes_of(m).iter().any(|&b| b != 0);
            v.iter_mut().zip(m.iter()).filter(|(_, m)| set(m)).for_each(|(x, _)| *x = T::nan())
        });
    }
    with_dtype!(dtype, apply(buf, mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reduce_f32(op: ReduceOp, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut acc = bytemuck::cast_slice::<f32, u8>(a).to_vec();
        accumulate(DType::F32, op, &mut acc, bytemuck::cast_slice(b)).unwrap();
        bytemuck::pod_collect_to_vec(&acc)
    }

    #[test]
    fn max_and_min_propagate_nan_from_either_side() {
        let nan = f32::NAN;
        for op in [ReduceOp::Max, ReduceOp::Min] {
            let r = reduce_f32(op, &[nan, 1.0, 2.0, nan], &[1.0, nan, 3.0, nan]);
            assert!(r[0].is_nan() && r[1].is_nan() && r[3].is_nan(), "{op}: {r:?}");
            assert_eq!(r[2], if op == ReduceOp::Max { 3.0 } else { 2.0 });
        }
        let mut acc = bytemuck::cast_slice::<f64, u8>(&[1.0, f64::NAN]).to_vec();
        accumulate(DType::F64, ReduceOp::Max, &mut acc, bytemuck::cast_slice(&[f64::NAN, 0.5])).unwrap();
        let r: Vec<f64> = bytemuck::pod_collect_to_vec(&acc);
        assert!(r[0].is_nan() && r[1].is_nan());
    }

    #[test]
    fn combine_equals_copy_then_accumulate() {
        let (a, b) = ([1.0f32, f32::NAN, -2.0, 4.0], [3.0f32, 1.0, f32::NAN, -5.0]);
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product] {
            let mut out = [std::mem::MaybeUninit::<u8>::uninit(); 16];
            let out = combine(DType::F32, op, &mut out, bytemuck::cast_slice(&a), bytemuck::cast_slice(&b)).unwrap();
            let got: Vec<f32> = bytemuck::pod_collect_to_vec(out);
            let want = reduce_f32(op, &a, &b);
            assert!(got.iter().zip(&want).all(|(g, w)| g == w || (g.is_nan() && w.is_nan())), "{op}: {got:?}");
        }
        assert!(combine(DType::F32, ReduceOp::Sum, &mut [MaybeUninit::new(0); 8], &[0u8; 4], &[0u8; 8]).is_err());
    }

    #[test]
    fn nan_mask_round_trip() {
        let buf = bytemuck::cast_slice::<f32, u8>(&[1.0, f32::NAN, 3.0]).to_vec();
        let mask = nan_mask(DType::F32, &buf);
        assert_eq!(bytemuck::pod_collect_to_vec::<u8, f32>(&mask), vec![0.0, 1.0, 0.0]);
        let mut out = bytemuck::cast_slice::<f32, u8>(&[5.0, 6.0, 7.0]).to_vec();
        apply_nan_mask(DType::F32, &mut out, &mask);
        let out: Vec<f32> = bytemuck::pod_collect_to_vec(&out);
        assert!(out[0] == 5.0 && out[1].is_nan() && out[2] == 7.0);
        assert!(drops_nan(DType::F32, ReduceOp::Max) && drops_nan(DType::F32, ReduceOp::Min));
        assert!(!drops_nan(DType::F32, ReduceOp::Sum) && !drops_nan(DType::I64, ReduceOp::Max));
    }
}
