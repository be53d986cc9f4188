//! Heap accounting per thread, to measure each in-process rank's memory (every rank is a
//! thread): a global allocator forwarding to the system one and counting, per thread, the
//! bytes live and their peak. Shared by `examples/hf_load.rs` and the runtime's
//! `tests/hf_memory.rs`.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The counting allocator; install with `#[global_allocator]`.
pub struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    // `try_with`: an allocation during thread teardown is not counted rather than a panic.
    let _ = LIVE.try_with(|live| {
        let v = live.get() + delta;
        live.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

// SAFETY: forwards to the system allocator; the accounting allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            track(l.size() as isize);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            track(l.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        track(-(l.size() as isize));
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            track(new as isize - l.size() as isize);
        }
        q
    }
}

/// Runs `f` on this thread; returns its result and the peak growth of the thread's live heap
/// bytes while it ran.
pub fn peak_growth<R>(f: impl FnOnce() -> R) -> (R, isize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    (r, PEAK.with(Cell::get) - base)
}

/// This thread's live heap bytes now.
pub fn live() -> isize {
    LIVE.with(Cell::get)
}
