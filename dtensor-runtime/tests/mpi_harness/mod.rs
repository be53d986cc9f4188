//! A tiny SPMD test harness for the MPI suites (`harness = false` test targets).
//!
//! `libtest` runs tests on worker threads in an order of its choosing and cannot finalise MPI;
//! here every process runs the same tests in the same order inside one
//! [`launch`](dtensor_runtime::launch), the ranks agree on each outcome with an all-reduce,
//! and rank 0 prints one line per test. Start it with
//! `mpirun --allow-run-as-root --oversubscribe -np 4 target/debug/deps/mpi_collectives-*`;
//! started directly it runs as a 1-rank MPI world (tests needing more ranks report `skipped`).
//! A positional argument filters tests by substring.
#![allow(dead_code)]

use dtensor_runtime::{launch, DType, Launch, RankCtx, ReduceOp};
use std::time::Instant;

/// What a test reports when it did not fail.
pub enum Outcome {
    /// Every assertion held.
    Pass,
    /// The test does not apply to this world (reason).
    Skip(String),
}

/// A test body: runs on every rank; `Err` carries the failure message of this rank.
pub type TestFn = fn(&RankCtx) -> Result<Outcome, String>;

/// Turns any displayable error into the harness' failure message.
pub fn fail<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Runs `tests` on every rank and exits non-zero when any failed on any rank.
pub fn main(suite: &str, tests: &[(&str, TestFn)]) {
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let selected: Vec<&(&str, TestFn)> =
        tests.iter().filter(|(n, _)| filter.as_ref().is_none_or(|f| n.contains(f.as_str()))).collect();
    let res = launch(Launch::Mpi, 0, |ctx| {
        let (me, n) = (ctx.rank(), ctx.world_size());
        let world: Vec<usize> = (0..n).collect();
        if me == 0 {
            println!("\nrunning {} tests of {suite} on {n} MPI ranks", selected.len());
        }
        let (mut passed, mut failed, mut skipped) = (0, 0, 0);
        for (name, t) in &selected {
            let start = Instant::now();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t(&ctx))).unwrap_or_else(|p| {
                Err(p
                    .downcast_ref::<String>()
                    .cloned()
                    .or(p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default())
            });
            // 0 = pass, 1 = skip, 2 = fail: the worst outcome over all ranks wins.
            let code: f64 = match &r {
                Ok(Outcome::Pass) => 0.0,
                Ok(Outcome::Skip(_)) => 1.0,
                Err(_) => 2.0,
            };
            if let Err(msg) = &r {
                eprintln!("rank {me}: {name} FAILED: {msg}");
            }
            let mut agreed = code.to_ne_bytes();
            ctx.comm().all_reduce(&world, (&mut agreed).into(), DType::F64, ReduceOp::Max)?;
            let ms = start.elapsed().as_millis();
            let verdict = match f64::from_ne_bytes(agreed) as u8 {
                0 => {
                    passed += 1;
                    "ok".to_string()
                }
                1 => {
                    skipped += 1;
                    match r {
                        Ok(Outcome::Skip(why)) => format!("skipped ({why})"),
                        _ => "skipped".into(),
                    }
                }
                _ => {
                    failed += 1;
                    "FAILED".into()
                }
            };
            if me == 0 {
                println!("test {name} ... {verdict} ({ms} ms)");
            }
        }
        if me == 0 {
            let status = if failed == 0 { "ok" } else { "FAILED" };
            println!(
                "\ntest result: {status}. {passed} passed; {failed} failed; {skipped} skipped ({suite}, {n} ranks)"
            );
        }
        Ok(failed)
    });
    match res {
        Ok(f) if f.iter().all(|&x| x == 0) => {}
        Ok(_) => std::process::exit(1),
        Err(e) => {
            eprintln!("{suite}: {e}");
            std::process::exit(1)
        }
    }
}
