//! Checked shape arithmetic: the one place where an element count, a byte size or the
//! strides of a shape are formed from numbers a caller (or a file) supplied.
//!
//! The bound is ndarray's, so that every shape an array can have passes: the product of the
//! non-zero dims fits in `isize`. A shape within it has its element count, every contiguous
//! stride and every in-bounds offset in range, so code that works on a checked shape may use
//! plain arithmetic. A shape past it is an [`Error::ShapeOverflow`] in debug and release
//! builds alike: a wrapped value is never used.
//!
//! ```
//! use dtensor_runtime::shape::{checked_bytes, checked_numel, checked_strides};
//! assert_eq!(checked_numel("example", &[2, 3, 4]).unwrap(), 24);
//! assert_eq!(checked_strides("example", &[2, 0, 4]).unwrap(), vec![4, 4, 1]);
//! assert!(checked_numel("example", &[1 << 40, 1 << 40]).is_err());
//! // Zero-sized, but its strides would overflow: refused too.
//! assert!(checked_numel("example", &[0, 1 << 40, 1 << 40]).is_err());
//! assert!(checked_bytes::<f64>("example", &[1 << 61]).is_err());
//! ```

use crate::error::{Error, Result};

/// Resolves a possibly negative dim (`-1` is the last) against a rank: `None` when out of
/// range. The one rule for every dim argument and every `Shard(dim)` (the macro crate's copy
/// is tested against it).
///
/// ```
/// use dtensor_runtime::shape::normalize_dim;
/// assert_eq!(normalize_dim(-1, 3), Some(2));
/// assert_eq!(normalize_dim(3, 3), None);
/// assert_eq!(normalize_dim(-4, 3), None);
/// ```
pub fn normalize_dim(dim: isize, ndim: usize) -> Option<usize> {
    let n = isize::try_from(ndim).ok()?;
    let d = if dim < 0 { dim.checked_add(n)? } else { dim };
    (0..n).contains(&d).then_some(d as usize)
}

fn overflow(context: &str, shape: &[usize]) -> Error {
    Error::ShapeOverflow { context: context.to_string(), shape: shape.to_vec() }
}

/// Number of elements of `shape`, after checking the shape is within the bound of the module
/// docs (`context` names the caller in the error).
pub fn checked_numel(context: &str, shape: &[usize]) -> Result<usize> {
    let mut extent: usize = 1; // product of the non-zero dims
    for &s in shape.iter().filter(|&&s| s > 0) {
        extent = extent.checked_mul(s).filter(|&e| e <= isize::MAX as usize).ok_or_else(|| overflow(context, shape))?;
    }
    Ok(if shape.contains(&0) { 0 } else { extent })
}

/// Size in bytes of a `T` tensor of `shape`, checked to fit in `isize` (the most one
/// allocation can hold).
pub fn checked_bytes<T>(context: &str, shape: &[usize]) -> Result<usize> {
    checked_numel(context, shape)?
        .checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| overflow(context, shape))
}

/// Row-major (C-contiguous) strides of a shape within [`checked_numel`]'s bound (a zero-sized
/// dim counts as 1, as in ndarray); [`checked_strides`] checks first.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    strides
}

/// Row-major (C-contiguous) strides of `shape`, after [`checked_numel`]'s check.
pub fn checked_strides(context: &str, shape: &[usize]) -> Result<Vec<usize>> {
    checked_numel(context, shape)?;
    Ok(contiguous_strides(shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(contiguous_strides(&[]), Vec::<usize>::new());
    }

    #[test]
    fn numel_and_its_bound() {
        assert_eq!(checked_numel("t", &[]).unwrap(), 1);
        assert_eq!(checked_numel("t", &[3, 0, 5]).unwrap(), 0);
        let max = isize::MAX as usize;
        assert_eq!(checked_numel("t", &[max]).unwrap(), max);
        assert_eq!(checked_numel("t", &[max, 1, 0]).unwrap(), 0);
        assert!(matches!(checked_numel("t", &[max, 2]), Err(Error::ShapeOverflow { .. })));
        // Would wrap to 0 in release with a plain product.
        assert!(checked_numel("t", &[1 << 32, 1 << 32]).is_err());
        assert!(checked_numel("t", &[usize::MAX]).is_err());
    }

    #[test]
    fn bytes_and_strides() {
        assert_eq!(checked_bytes::<f32>("t", &[3, 5]).unwrap(), 60);
        assert!(checked_bytes::<f32>("t", &[1 << 62]).is_err());
        assert_eq!(checked_strides("t", &[2, 3, 4]).unwrap(), vec![12, 4, 1]);
        assert_eq!(checked_strides("t", &[]).unwrap(), Vec::<usize>::new());
        let e = checked_strides("from_local", &[0, 1 << 40, 1 << 40]).unwrap_err();
        assert_eq!(e, Error::ShapeOverflow { context: "from_local".into(), shape: vec![0, 1 << 40, 1 << 40] });
    }
}
