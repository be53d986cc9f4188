//! Fallible allocation of tensor buffers: a buffer too large for the allocator is an
//! [`Error::OutOfMemory`], as PyTorch raises, instead of aborting the process.
//!
//! Large buffers ([`HUGE_PAGE_MIN_BYTES`] and up) are fresh memory maps on every allocation
//! (glibc maps them and unmaps them on free), so their first touch page-faults once per 4 KiB
//! page. On Linux they are advised to use transparent huge pages, which takes 512 times fewer
//! faults: a fresh 512 MiB copy took 310 ms against 155 ms advised (a warm copy: 45 ms) on
//! the 2-core machine of the README's tables. `DTENSOR_HUGE_PAGES=0` turns the advice off
//! (see [`env`](crate::env) for the values it accepts).

use crate::error::{Error, Result};

fn out_of_memory<T>(context: &str, len: usize) -> Error {
    Error::OutOfMemory { context: context.to_string(), bytes: len.saturating_mul(std::mem::size_of::<T>()) }
}

/// A zero-filled buffer of `len` elements (zeroed by the allocator: pages not yet touched
/// cost nothing).
pub fn try_zeroed<T: bytemuck::Zeroable>(context: &str, len: usize) -> Result<Vec<T>> {
    let v = bytemuck::allocation::try_zeroed_vec(len).map_err(|()| out_of_memory::<T>(context, len))?;
    advise_huge_pages(&v);
    Ok(v)
}

/// An empty buffer with room for `len` elements.
pub fn try_with_capacity<T>(context: &str, len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| out_of_memory::<T>(context, len))?;
    advise_huge_pages(&v);
    Ok(v)
}

/// Buffers from this size up are advised to use transparent huge pages (the largest size glibc
/// serves from its heaps is 32 MiB; above it every allocation is a fresh map).
pub const HUGE_PAGE_MIN_BYTES: usize = 32 << 20;

/// Advises the whole 2 MiB pages inside `v`'s allocation to be transparent huge pages, before
/// anything touches them (only the advice: without THP support it changes nothing).
fn advise_huge_pages<T>(v: &Vec<T>) {
    let bytes = v.capacity().saturating_mul(std::mem::size_of::<T>());
    if bytes < HUGE_PAGE_MIN_BYTES || !huge_pages_enabled() {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_ptr() as usize;
        let (lo, hi) = (start.next_multiple_of(HUGE), (start + bytes) / HUGE * HUGE);
        if hi > lo {
            // SAFETY: `[lo, hi)` lies inside this vector's live allocation; MADV_HUGEPAGE only
            // changes how the kernel backs those pages, never their contents. A failure (no THP
            // in this kernel) leaves the pages as they were, which is fine.
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
        }
    }
}

fn huge_pages_enabled() -> bool {
    // Read deep inside an allocation, which cannot fail for it: a bad value is reported once
    // and the default kept (launchers reject it first, through `env::check`).
    static ON: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
        crate::env::huge_pages().unwrap_or_else(|e| {
            crate::env::warn_once(crate::env::HUGE_PAGES, &e);
            true
        })
    });
    *ON
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
