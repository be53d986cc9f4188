//! The environment variables the runtime reads, in one place.
//!
//! | variable | values | what it does |
//! |---|---|---|
//! | `DTENSOR_TIMEOUT_MS` | a positive whole number of milliseconds | collective timeout ([`comm::timeout`](crate::comm::timeout)) |
//! | `DTENSOR_DEBUG` | `off`, `info` (as `off`), `detail` | the collective fingerprint check ([`comm::fingerprint`](crate::comm::fingerprint)) |
//! | `DTENSOR_HUGE_PAGES` | `1`/`on`/`true`, `0`/`off`/`false` | huge-page advice for large buffers ([`alloc`](crate::alloc)) |
//! | `DTENSOR_CUDA_THREADS_STAGE` | `device`, `host` | the path of `cuda-threads` device collectives ([`comm::cuda_threads`](crate::comm::cuda_threads)) |
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
    crate::comm::timeout::from_env()?;
    crate::comm::fingerprint::from_env()?;
    huge_pages()?;
    crate::comm::cuda_threads::stage_from_env()?;
    Ok(())
}
