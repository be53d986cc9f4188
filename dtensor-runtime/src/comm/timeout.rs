//! The one collective timeout setting of every backend: `DTENSOR_TIMEOUT_MS`, parsed here.
//!
//! The thread backend gives up a collective after it (`CollectiveTimeout`), the MPI watchdog
//! aborts the job, NCCL aborts its communicators; the TCP bootstrap of NCCL retries until it.
//!
//! Any positive timeout is valid, [`Duration::MAX`] included: a timeout too long to be added
//! to the current time means "no limit" ([`deadline`] is then `None`), never a panic.

use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// Default collective timeout (when `DTENSOR_TIMEOUT_MS` is unset).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The environment variable holding the timeout in milliseconds.
pub const TIMEOUT_ENV: &str = "DTENSOR_TIMEOUT_MS";

/// The timeout from `DTENSOR_TIMEOUT_MS`, or [`DEFAULT_TIMEOUT`] when it is unset.
///
/// Errors: [`Error::InvalidArgument`] naming the variable and its value when the value is not
/// a whole number of milliseconds (not UTF-8 included) or is 0 (every collective would fail
/// at once).
pub fn from_env() -> Result<Duration> {
    parse(crate::env::var(TIMEOUT_ENV)?.as_deref())
}

/// When a wait of `timeout` that starts now ends; `None` when that lies beyond what an
/// [`Instant`] can hold (a huge timeout such as [`Duration::MAX`] means no limit).
pub fn deadline(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// Whether `deadline` (from [`deadline`]) has passed; never for `None`.
pub fn passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// [`from_env`] on a given value (`None`: unset).
pub fn parse(value: Option<&str>) -> Result<Duration> {
    let Some(v) = value else { return Ok(DEFAULT_TIMEOUT) };
    let ms = v.trim().parse::<u64>().map_err(|e| Error::InvalidArgument {
        context: TIMEOUT_ENV.into(),
        reason: format!("{v:?} is not a whole number of milliseconds ({e})"),
    })?;
    check(Duration::from_millis(ms))
}

/// A timeout given through the API: rejects zero like the environment variable does.
pub fn check(timeout: Duration) -> Result<Duration> {
    if timeout.is_zero() {
        return Err(Error::InvalidArgument {
            context: "collective timeout".into(),
            reason: format!("the timeout must be positive (0 would fail every collective; {TIMEOUT_ENV} is in ms)"),
        });
    }
    Ok(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_default_number_zero_and_garbage() {
        assert_eq!(parse(None).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(parse(Some(" 250 ")).unwrap(), Duration::from_millis(250));
        assert!(matches!(parse(Some("0")), Err(Error::InvalidArgument { .. })));
        assert!(matches!(parse(Some("-5")), Err(Error::InvalidArgument { .. })));
        assert!(matches!(parse(Some("1s")), Err(Error::InvalidArgument { .. })));
        assert!(matches!(check(Duration::ZERO), Err(Error::InvalidArgument { .. })));
        // The largest values are valid: no limit rather than an overflow.
        assert_eq!(parse(Some(&u64::MAX.to_string())).unwrap(), Duration::from_millis(u64::MAX));
        assert_eq!(check(Duration::MAX).unwrap(), Duration::MAX);
        assert_eq!(deadline(Duration::MAX), None);
        assert!(!passed(deadline(Duration::MAX)));
        assert!(passed(deadline(Duration::ZERO)));
    }
}
