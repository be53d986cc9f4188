//! Helpers shared by the bench binaries (each binary uses a subset, hence the allow).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// `true` under `cargo bench` (criterion gets `--bench`), `false` under `cargo test --benches`,
/// where criterion runs every routine once: benches then shrink their sizes so CI stays fast.
pub fn measuring() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test")
}

/// Comma-separated numbers from environment variable `var`, or `default`.
pub fn env_list(var: &str, default: &[usize]) -> Vec<usize> {
    match std::env::var(var) {
        Ok(v) => {
            let parsed: Result<Vec<usize>, _> = v.split(',').map(|s| s.trim().parse::<usize>()).collect();
            match parsed {
                Ok(list) if !list.is_empty() => list,
                _ => {
                    eprintln!("{var}={v:?} is not a comma-separated list of numbers; using {default:?}");
                    default.to_vec()
                }
            }
        }
        Err(_) => default.to_vec(),
    }
}

/// A number from environment variable `var`, or `default`.
pub fn env_f64(var: &str, default: f64) -> f64 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Nanoseconds per iteration of every call criterion made, by benchmark name, so that a
/// bench can print ratios between routines measured in the same run.
#[derive(Default)]
pub struct Recorder {
    samples: Mutex<BTreeMap<String, Vec<f64>>>,
}

impl Recorder {
    /// Records one criterion call of `iters` iterations that took `elapsed`.
    pub fn add(&self, name: &str, iters: u64, elapsed: Duration) {
        let per_iter = elapsed.as_nanos() as f64 / iters.max(1) as f64;
        self.samples.lock().unwrap_or_else(|e| e.into_inner()).entry(name.to_string()).or_default().push(per_iter);
    }

    /// Records one sample of a dimensionless value (a ratio measured within one call).
    pub fn add_value(&self, name: &str, value: f64) {
        self.samples.lock().unwrap_or_else(|e| e.into_inner()).entry(name.to_string()).or_default().push(value);
    }

    /// Median nanoseconds per iteration of `name` (or median value, see
    /// [`Recorder::add_value`]), if it ran.
    pub fn median_ns(&self, name: &str) -> Option<f64> {
        let map = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let mut v = map.get(name)?.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }
}
