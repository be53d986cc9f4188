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
        // NaN propagates (PyTorch's max/min; `Float::max` would drop it).
        ReduceOp::Min => apply(a, &xs, |a, b| if a.is_nan() || a < b { a } else { b }),
        ReduceOp::Max => apply(a, &xs, |a, b| if a.is_nan() || a > b { a } else { b }),
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
    }
}
