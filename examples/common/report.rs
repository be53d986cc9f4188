//! Argument parsers, the collective report and the exit status shared by the training examples.

use dtensor::{CollectiveKind, CommDebugMode, Error, Launch, Result};
use std::process::ExitCode;

/// `--backend`: `threads`, `mpi`, `nccl` or `cuda-threads`.
pub fn parse_backend(s: &str) -> std::result::Result<Launch, String> {
    s.parse::<Launch>().map_err(|e| e.to_string())
}

/// `--mesh DPxTP`, e.g. `2x2`.
pub fn parse_mesh(s: &str) -> std::result::Result<(usize, usize), String> {
    let (dp, tp) = s.split_once(['x', 'X', '×']).ok_or_else(|| format!("`{s}` is not DPxTP (e.g. 2x2)"))?;
    let num = |v: &str| v.trim().parse::<usize>().ok().filter(|&n| n > 0);
    match (num(dp), num(tp)) {
        (Some(dp), Some(tp)) => Ok((dp, tp)),
        _ => Err(format!("`{s}`: dp and tp must be positive integers")),
    }
}

/// `--lr`: a positive, finite learning rate, else a typed error naming the example.
pub fn check_lr(example: &str, lr: f64) -> Result<()> {
    if lr.is_finite() && lr > 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            context: example.into(),
            reason: format!("--lr must be a positive number, got {lr}"),
        })
    }
}

/// The exit status of a checked run: 0 on PASS, 1 on FAIL, 2 on a bad argument or runtime
/// error (printed on stderr after the example's name), so scripts can tell a wrong result
/// from a run that could not start.
///
/// A backend this build or machine cannot run ([`Error::Unavailable`]: feature off, no GPU,
/// no NCCL; [`Error::TooFewDevices`]) is not a failure of the program: it prints
/// `SKIP: <reason>` on stdout and exits 0, so a check script tells it from PASS by the line.
pub fn exit_code(example: &str, outcome: Result<bool>) -> ExitCode {
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e @ (Error::Unavailable { .. } | Error::TooFewDevices { .. })) => {
            println!("{example}: SKIP: {e}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{example}: {e}");
            ExitCode::from(2)
        }
    }
}

/// `all_reduce@tp 4× 64.0 KiB, all_reduce@dp 4× 1.0 MiB` for one step on this rank.
pub fn comm_line(comm: &CommDebugMode) -> String {
    let parts: Vec<String> = comm
        .by_kind()
        .into_iter()
        .filter(|((kind, _), _)| *kind != CollectiveKind::Barrier)
        .map(|((kind, dim), (count, bytes))| format!("{kind}@{dim} {count}× {}", human_bytes(bytes)))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

fn human_bytes(b: usize) -> String {
    match b {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / (1 << 10) as f64),
        b => format!("{b} B"),
    }
}
