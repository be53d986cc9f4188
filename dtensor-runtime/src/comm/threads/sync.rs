//! The synchronisation primitives of the thread backend: `std`'s, or `loom`'s when the crate
//! is built with `--cfg loom` so that the rendezvous can be model-checked.

#[cfg(loom)]
pub(super) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(loom)]
pub(super) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(super) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub(super) use std::sync::{Condvar, Mutex, MutexGuard};

/// One step of a busy wait: a CPU hint normally, a scheduling point under loom.
pub(super) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// Gives the core to another runnable thread.
pub(super) fn yield_now() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}
