//! Fallible allocation of tensor buffers: a buffer too large for the allocator is an
//! [`Error::OutOfMemory`], as PyTorch raises, instead of aborting the process.

use crate::error::{Error, Result};

fn out_of_memory<T>(context: &str, len: usize) -> Error {
    Error::OutOfMemory { context: context.to_string(), bytes: len.saturating_mul(std::mem::size_of::<T>()) }
}

/// A zero-filled buffer of `len` elements (zeroed by the allocator: pages not yet touched
/// cost nothing).
pub fn try_zeroed<T: bytemuck::Zeroable>(context: &str, len: usize) -> Result<Vec<T>> {
    bytemuck::allocation::try_zeroed_vec(len).map_err(|()| out_of_memory::<T>(context, len))
}

/// An empty buffer with room for `len` elements.
pub fn try_with_capacity<T>(context: &str, len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| out_of_memory::<T>(context, len))?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_buffers_are_errors_not_aborts() {
        // 2^60 f64: far past any machine's memory (and past isize for the byte count).
        let e = try_zeroed::<f64>("t", 1 << 60).unwrap_err();
        assert_eq!(e, Error::OutOfMemory { context: "t".into(), bytes: 1 << 63 });
        assert!(matches!(try_with_capacity::<f32>("t", usize::MAX / 2), Err(Error::OutOfMemory { .. })));
        assert_eq!(try_zeroed::<f32>("t", 3).unwrap(), vec![0.0; 3]);
        assert!(try_with_capacity::<f32>("t", 3).unwrap().capacity() >= 3);
    }
}
