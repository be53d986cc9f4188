//! Deadlines of the one collective timeout of every backend (`DTENSOR_TIMEOUT_MS`, parsed by
//! [`env::timeout`](crate::env::timeout)).
//!
//! The thread backend gives up a collective after it (`CollectiveTimeout`), the MPI watchdog
//! aborts the job, NCCL aborts its communicators; the TCP bootstrap of NCCL retries until it.
//!
//! Any positive timeout is valid, [`Duration::MAX`] included: a timeout too long to be added
//! to the current time means "no limit" ([`deadline`] is then `None`), never a panic.

use std::time::{Duration, Instant};

/// When a wait of `timeout` that starts now ends; `None` when that lies beyond what an
/// [`Instant`] can hold (a huge timeout such as [`Duration::MAX`] means no limit).
pub fn deadline(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// Whether `deadline` (from [`deadline`]) has passed; never for `None`.
pub fn passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_timeouts_mean_no_limit() {
        assert_eq!(deadline(Duration::MAX), None);
        assert!(!passed(deadline(Duration::MAX)));
        assert!(passed(deadline(Duration::ZERO)));
    }
}
