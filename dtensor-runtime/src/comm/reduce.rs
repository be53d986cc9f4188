//! Element-wise reductions on byte buffers, shared by the CPU backends.

use crate::element::DType;
use crate::error::{Error, Result};
use crate::placement::ReduceOp;

fn typed<T: bytemuck::Pod>(b: &[u8]) -> std::borrow::Cow<'_, [T]> {
    match bytemuck::try_cast_slice(b) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        // Misaligned bytes (never produced by our own wrappers): copy to an aligned buffer.
        Err(_) => std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(b)),
    }
}

fn fold<T: bytemuck::Pod + num_traits::Float>(op: ReduceOp, acc: &mut [u8], x: &[u8]) {
    let xs = typed::<T>(x);
    // One tight loop per op (the match stays out of the loop so it vectorises).
    fn apply<T: Copy>(a: &mut [T], b: &[T], f: impl Fn(T, T) -> T) {
        a.iter_mut().zip(b).for_each(|(a, b)| *a = f(*a, *b));
    }
    let run = |a: &mut [T]| match op {
        ReduceOp::Sum | ReduceOp::Avg => apply(a, &xs, |a, b| a + b),
        // NaN-propagating, as PyTorch's max/min (`T::max` would drop a NaN operand).
        ReduceOp::Min => apply(a, &xs, |a, b| if a < b || a.is_nan() { a } else { b }),
        ReduceOp::Max => apply(a, &xs, |a, b| if a > b || a.is_nan() { a } else { b }),
        ReduceOp::Product => apply(a, &xs, |a, b| a * b),
    };
    match bytemuck::try_cast_slice_mut::<u8, T>(acc) {
        Ok(a) => run(a),
        Err(_) => {
            let mut a: Vec<T> = bytemuck::pod_collect_to_vec(acc);
            run(&mut a);
            acc.copy_from_slice(bytemuck::cast_slice(&a));
        }
    }
}

/// `acc = acc ⊕ x` element-wise. `Avg` accumulates a sum; call [`finish`] afterwards.
pub fn accumulate(dtype: DType, op: ReduceOp, acc: &mut [u8], x: &[u8]) -> Result<()> {
    if acc.len() != x.len() {
        return Err(Error::BufferMismatch {
            op: format!("reduce({op})"),
            reason: format!("peer buffer has {} bytes, local has {}", x.len(), acc.len()),
        });
    }
    match dtype {
        DType::F32 => fold::<f32>(op, acc, x),
        DType::F64 => fold::<f64>(op, acc, x),
        // `half`'s arithmetic widens each pair to f32 and rounds the result once.
        DType::BF16 => fold::<half::bf16>(op, acc, x),
        DType::F16 => fold::<half::f16>(op, acc, x),
    }
    Ok(())
}

fn combine_typed<T: bytemuck::Pod + num_traits::Float>(op: ReduceOp, out: &mut [u8], a: &[u8], b: &[u8]) {
    let (a, b) = (typed::<T>(a), typed::<T>(b));
    // One tight loop per op, as in `fold`.
    fn apply<T: Copy>(o: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
        o.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (a, b))| *o = f(*a, *b));
    }
    let run = |o: &mut [T]| match op {
        ReduceOp::Sum | ReduceOp::Avg => apply(o, &a, &b, |a, b| a + b),
        ReduceOp::Min => apply(o, &a, &b, |a, b| if a < b || a.is_nan() { a } else { b }),
        ReduceOp::Max => apply(o, &a, &b, |a, b| if a > b || a.is_nan() { a } else { b }),
        ReduceOp::Product => apply(o, &a, &b, |a, b| a * b),
    };
    match bytemuck::try_cast_slice_mut::<u8, T>(out) {
        Ok(o) => run(o),
        Err(_) => {
            let mut o: Vec<T> = bytemuck::pod_collect_to_vec(out);
            run(&mut o);
            out.copy_from_slice(bytemuck::cast_slice(&o));
        }
    }
}

/// `out = a ⊕ b` element-wise: the first fold of a reduction written straight into its
/// output (one pass instead of a copy of `a` and an [`accumulate`]). `Avg` sums; call
/// [`finish`] afterwards.
pub fn combine(dtype: DType, op: ReduceOp, out: &mut [u8], a: &[u8], b: &[u8]) -> Result<()> {
    if a.len() != out.len() || b.len() != out.len() {
        return Err(Error::BufferMismatch {
            op: format!("reduce({op})"),
            reason: format!("inputs have {} and {} bytes, the output {}", a.len(), b.len(), out.len()),
        });
    }
    match dtype {
        DType::F32 => combine_typed::<f32>(op, out, a, b),
        DType::F64 => combine_typed::<f64>(op, out, a, b),
        DType::BF16 => combine_typed::<half::bf16>(op, out, a, b),
        DType::F16 => combine_typed::<half::f16>(op, out, a, b),
    }
    Ok(())
}

/// Final step of a reduction over `n` members (divides by `n` for `Avg`).
pub fn finish(dtype: DType, op: ReduceOp, acc: &mut [u8], n: usize) {
    if op != ReduceOp::Avg {
        return;
    }
    fn div<T: bytemuck::Pod + num_traits::Float + num_traits::FromPrimitive>(acc: &mut [u8], n: usize) {
        let d = T::from_usize(n).unwrap_or_else(T::one);
        let mut v: Vec<T> = bytemuck::pod_collect_to_vec(acc);
        v.iter_mut().for_each(|x| *x = *x / d);
        acc.copy_from_slice(bytemuck::cast_slice(&v));
    }
    match dtype {
        DType::F32 => div::<f32>(acc, n),
        DType::F64 => div::<f64>(acc, n),
        DType::BF16 => div::<half::bf16>(acc, n),
        DType::F16 => div::<half::f16>(acc, n),
    }
}

/// `out = b₀ ⊕ b₁ ⊕ …` over the `out.len()`-byte blocks of `blocks`, in order (so every rank
/// that folds the same blocks gets the same bits), then [`finish`]: the reduction of a backend
/// that gathers the members' buffers and reduces locally (MPI for the 16-bit floats).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn fold_blocks(dtype: DType, op: ReduceOp, blocks: &[u8], out: &mut [u8]) -> Result<()> {
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
/// fix the result up with [`nan_mask`] and [`apply_nan_mask`].
#[cfg_attr(not(any(feature = "mpi", feature = "cuda")), allow(dead_code))]
pub(crate) fn drops_nan(op: ReduceOp) -> bool {
    matches!(op, ReduceOp::Max | ReduceOp::Min)
}

/// One element of `dtype` per element of `buf`: 1 where it is NaN, else 0. Reduced with `Max`
/// over a group it marks the elements whose true max/min is NaN.
#[cfg_attr(not(any(feature = "mpi", feature = "cuda")), allow(dead_code))]
pub(crate) fn nan_mask(dtype: DType, buf: &[u8]) -> Vec<u8> {
    fn mask<T: bytemuck::Pod + num_traits::Float>(buf: &[u8]) -> Vec<u8> {
        let m: Vec<T> = typed::<T>(buf).iter().map(|x| if x.is_nan() { T::one() } else { T::zero() }).collect();
        bytemuck::cast_slice(&m).to_vec()
    }
    match dtype {
        DType::F32 => mask::<f32>(buf),
        DType::F64 => mask::<f64>(buf),
        DType::BF16 => mask::<half::bf16>(buf),
        DType::F16 => mask::<half::f16>(buf),
    }
}

/// Sets to NaN every element of `buf` whose element in `mask` (from [`nan_mask`]) is non-zero.
#[cfg_attr(not(any(feature = "mpi", feature = "cuda")), allow(dead_code))]
pub(crate) fn apply_nan_mask(dtype: DType, buf: &mut [u8], mask: &[u8]) {
    fn apply<T: bytemuck::Pod + num_traits::Float>(buf: &mut [u8], mask: &[u8]) {
        let m = typed::<T>(mask);
        let mut v: Vec<T> = bytemuck::pod_collect_to_vec(buf);
        v.iter_mut().zip(m.iter()).filter(|(_, m)| !m.is_zero()).for_each(|(x, _)| *x = T::nan());
        buf.copy_from_slice(bytemuck::cast_slice(&v));
    }
    match dtype {
        DType::F32 => apply::<f32>(buf, mask),
        DType::F64 => apply::<f64>(buf, mask),
        DType::BF16 => apply::<half::bf16>(buf, mask),
        DType::F16 => apply::<half::f16>(buf, mask),
    }
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
            let mut out = vec![0u8; 16];
            combine(DType::F32, op, &mut out, bytemuck::cast_slice(&a), bytemuck::cast_slice(&b)).unwrap();
            let got: Vec<f32> = bytemuck::pod_collect_to_vec(&out);
            let want = reduce_f32(op, &a, &b);
            assert!(got.iter().zip(&want).all(|(g, w)| g == w || (g.is_nan() && w.is_nan())), "{op}: {got:?}");
        }
        assert!(combine(DType::F32, ReduceOp::Sum, &mut [0u8; 8], &[0u8; 4], &[0u8; 8]).is_err());
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
        assert!(drops_nan(ReduceOp::Max) && drops_nan(ReduceOp::Min) && !drops_nan(ReduceOp::Sum));
    }
}
