//! The environment variables the runtime reads, in one place.
//!
//! | variable | values | what it does |
//! |---|---|---|
//! | `DTENSOR_TIMEOUT_MS` | a positive whole number of milliseconds | collective timeout ([`timeout`]) |
//! | `DTENSOR_DEBUG` | `off`, `info` (as `off`), `detail` | the collective fingerprint check ([`debug_detail`]; [`comm::fingerprint`](crate::comm::fingerprint)) |
//! | `DTENSOR_HUGE_PAGES` | `1`/`on`/`true`, `0`/`off`/`false` | huge-page advice for large buffers ([`alloc`](crate::alloc)) |
//! | `DTENSOR_CUDA_THREADS_STAGE` | `device`, `host` | the path of `cuda-threads` device collectives ([`cuda_threads_stage_host`]) |
//! | `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `LOCAL_RANK` (or an MPI launcher's) | as torchrun sets them | NCCL process mode ([`launch::nccl`](crate::launch::nccl)) |
//!
//! An empty value counts as unset. Any other value a variable does not accept (a typo such
//! as `DTENSOR_DEBUG=details`, bytes that are not UTF-8) is an [`Error::InvalidArgument`]
//! naming the variable and the value, never silently ignored: every launcher
//! ([`run`](crate::run), [`launch`](crate::launch())) checks them all with [`check`] before
//! any rank starts, and [`DeviceMesh::new`](crate::DeviceMesh::new) checks `DTENSOR_DEBUG`.
//! Where a value is read deep inside an infallible call (the huge-page advice of an
//! allocation), a bad one is reported once on stderr and the default is used.
//! (`NO_COLOR` and `TERM`, read by [`visualize`](crate::visualize), follow their own
//! conventions, under which every value means something.)

use crate::error::{Error, Result};
use std::sync::OnceLock;
use std::time::Duration;

/// The value of `name`: `None` when it is unset or empty; an error naming the variable when
/// it is not UTF-8.
pub fn var(name: &str) -> Result<Option<String>> {
    match std::env::var_os(name) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => v.into_string().map(Some).map_err(|v| invalid(name, &format!("{v:?}"), "UTF-8 text")),
    }
}

/// The error of a value `name` does not accept (`value` as the user wrote it, `expected` what
/// it accepts).
pub fn invalid(name: &str, value: &str, expected: &str) -> Error {
    Error::InvalidArgument {
        context: format!("environment variable {name}"),
        reason: format!("{value} is not a valid value (expected {expected})"),
    }
}

/// The huge-page switch.
pub const HUGE_PAGES: &str = "DTENSOR_HUGE_PAGES";

/// An on/off variable: `1`, `on`, `true`, `yes` or `0`, `off`, `false`, `no` (any case);
/// `default` when unset.
pub fn flag(name: &str, default: bool) -> Result<bool> {
    let Some(v) = var(name)? else { return Ok(default) };
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        _ => Err(invalid(name, &format!("{v:?}"), "1/on/true or 0/off/false")),
    }
}

/// `DTENSOR_HUGE_PAGES` (default on).
pub fn huge_pages() -> Result<bool> {
    flag(HUGE_PAGES, true)
}

/// Reports `err` (a bad variable read where no error can be returned) on stderr, once per
/// variable per process.
pub(crate) fn warn_once(name: &'static str, err: &Error) {
    static SEEN: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.contains(&name) {
        seen.push(name);
        eprintln!("dtensor: {err}; using the default");
    }
}

/// Checks every variable of the table above that is set (the launcher's rank variables are
/// checked when a launch reads them): the first bad one is the error.
pub fn check() -> Result<()> {
    timeout()?;
    debug_detail()?;
    huge_pages()?;
    cuda_threads_stage_host()?;
    Ok(())
}

// `DTENSOR_TIMEOUT_MS`

/// Default collective timeout (when `DTENSOR_TIMEOUT_MS` is unset).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The environment variable holding the timeout in milliseconds.
pub const TIMEOUT_ENV: &str = "DTENSOR_TIMEOUT_MS";

/// The timeout from `DTENSOR_TIMEOUT_MS`, or [`DEFAULT_TIMEOUT`] when it is unset.
///
/// Errors: [`Error::InvalidArgument`] naming the variable and its value when the value is not
/// a whole number of milliseconds (not UTF-8 included) or is 0 (every collective would fail
/// at once).
pub fn timeout() -> Result<Duration> {
    parse_timeout(var(TIMEOUT_ENV)?.as_deref())
}

/// [`timeout`] on a given value (`None`: unset).
pub fn parse_timeout(value: Option<&str>) -> Result<Duration> {
    let Some(v) = value else { return Ok(DEFAULT_TIMEOUT) };
    let ms = v.trim().parse::<u64>().map_err(|e| Error::InvalidArgument {
        context: TIMEOUT_ENV.into(),
        reason: format!("{v:?} is not a whole number of milliseconds ({e})"),
    })?;
    check_timeout(Duration::from_millis(ms))
}

/// A timeout given through the API: rejects zero like the environment variable does.
pub fn check_timeout(timeout: Duration) -> Result<Duration> {
    if timeout.is_zero() {
        return Err(Error::InvalidArgument {
            context: "collective timeout".into(),
            reason: format!("the timeout must be positive (0 would fail every collective; {TIMEOUT_ENV} is in ms)"),
        });
    }
    Ok(timeout)
}

// `DTENSOR_DEBUG`

/// The environment variable that switches the check on for new meshes (value `detail`).
pub const DEBUG_ENV: &str = "DTENSOR_DEBUG";

/// Whether `DTENSOR_DEBUG` switches the check on (read once per process): `detail` does;
/// unset, empty, `off` and `info` (PyTorch's level that adds no check) do not.
///
/// Errors: [`Error::InvalidArgument`] naming the variable and its value for any other value
/// (a typo must not silently leave the check off), not UTF-8 included.
pub fn debug_detail() -> Result<bool> {
    static ON: OnceLock<Result<bool>> = OnceLock::new();
    ON.get_or_init(|| parse_debug(var(DEBUG_ENV)?.as_deref())).clone()
}

/// [`debug_detail`] on a given value (`None`: unset).
pub fn parse_debug(value: Option<&str>) -> Result<bool> {
    let Some(v) = value else { return Ok(false) };
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "off" | "info" => Ok(false),
        "detail" => Ok(true),
        _ => Err(invalid(DEBUG_ENV, &format!("{v:?}"), "off, info or detail")),
    }
}

/// Whether `DTENSOR_DEBUG=detail` is set (read once per process); `false` for a value
/// [`debug_detail`] rejects (meshes are not created then: [`DeviceMesh::new`](crate::DeviceMesh::new)
/// returns that error).
pub fn debug_detail_or_off() -> bool {
    debug_detail().unwrap_or(false)
}

// `DTENSOR_CUDA_THREADS_STAGE`

/// The environment variable that picks the path of collectives on device buffers: `host`
/// stages them through the host; `device`, or unset, moves them device to device.
pub const STAGE_ENV: &str = "DTENSOR_CUDA_THREADS_STAGE";

/// Whether [`STAGE_ENV`] asks for the host-staged path.
///
/// Errors: [`Error::InvalidArgument`] naming the variable and
/// its value for anything but `host` or `device` (any case), checked by the launch before
/// any rank starts.
pub fn cuda_threads_stage_host() -> Result<bool> {
    let Some(v) = var(STAGE_ENV)? else { return Ok(false) };
    match v.trim().to_ascii_lowercase().as_str() {
        "host" => Ok(true),
        "device" => Ok(false),
        _ => Err(invalid(STAGE_ENV, &format!("{v:?}"), "host or device")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_unset_default_number_zero_and_garbage() {
        assert_eq!(parse_timeout(None).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(parse_timeout(Some(" 250 ")).unwrap(), Duration::from_millis(250));
        assert!(matches!(parse_timeout(Some("0")), Err(Error::InvalidArgument { .. })));
        assert!(matches!(parse_timeout(Some("-5")), Err(Error::InvalidArgument { .. })));
        assert!(matches!(parse_timeout(Some("1s")), Err(Error::InvalidArgument { .. })));
        assert!(matches!(check_timeout(Duration::ZERO), Err(Error::InvalidArgument { .. })));
        // The largest values are valid: no limit rather than an overflow.
        assert_eq!(parse_timeout(Some(&u64::MAX.to_string())).unwrap(), Duration::from_millis(u64::MAX));
        assert_eq!(check_timeout(Duration::MAX).unwrap(), Duration::MAX);
    }

    #[test]
    fn debug_values() {
        assert_eq!(parse_debug(None), Ok(false));
        assert_eq!(parse_debug(Some("DETAIL ")), Ok(true));
        assert_eq!(parse_debug(Some("off")), Ok(false));
        assert_eq!(parse_debug(Some("info")), Ok(false));
        let e = parse_debug(Some("details")).unwrap_err();
        assert!(e.to_string().contains("DTENSOR_DEBUG") && e.to_string().contains("details"), "{e}");
    }
}
