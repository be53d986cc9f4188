//! How long a training-state save blocks the training loop: `Checkpointer::save_async`
//! (copy, then write on a background thread) against `Checkpointer::save` (copy, write, sync,
//! commit) of the same state, on 4 thread ranks, in alternating pairs.
//!
//! ```text
//! cargo bench --bench checkpoint_save                          # 512 MB of state, 5 pairs
//! DTENSOR_BENCH_STATE_MB=2048 DTENSOR_BENCH_PAIRS=3 cargo bench --bench checkpoint_save
//! DTENSOR_BENCH_DIR=/fast/disk cargo bench --bench checkpoint_save
//! ```
//!
//! The state: f64 parameters sharded over the 4 ranks (`Shard(0)`) and AdamW's two moments
//! after one step, so parameters are a third of it. Each pair also times one AdamW step taken
//! while the background save writes, against one taken alone. Under `cargo test --benches` a
//! 4 MB state runs once.

mod common;

use dtensor::checkpoint::{Checkpointer, TrainState};
use dtensor::module::Module;
use dtensor::optim::AdamW;
use dtensor::prelude::*;
use dtensor::{randn, Along};
use std::time::{Duration, Instant};

/// Parameters of `rows × 4096` f64 each, sharded by rows over the mesh.
struct Params(Vec<DTensor<f64>>);

impl Module<f64> for Params {
    fn named_parameters(&self) -> Vec<(String, &DTensor<f64>)> {
        self.0.iter().enumerate().map(|(i, p)| (format!("layers.{i}.weight"), p)).collect()
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<f64>)> {
        self.0.iter_mut().enumerate().map(|(i, p)| (format!("layers.{i}.weight"), p)).collect()
    }
}

const COLS: usize = 4096;

/// One pair's times in seconds: synchronous save, save_async's blocking part, a step alone, a
/// step during the background write, the wait after it.
type Pair = (f64, f64, f64, f64, f64);

fn env_usize(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// One AdamW step with every gradient set to the parameter (a fixed, cheap gradient).
fn step(m: &mut Params, opt: &mut AdamW<f64>) -> Result<()> {
    m.zero_grad();
    for p in &m.0 {
        p.mul(p)?.sum()?.backward()?;
    }
    opt.step(m)
}

/// The largest of the ranks' times (the loop waits for the slowest rank).
fn slowest(mesh: &DeviceMesh, d: Duration) -> Result<f64> {
    let mut v = [d.as_secs_f64()];
    mesh.all_reduce(Along::All, &mut v, dtensor::ReduceOp::Max)?;
    Ok(v[0])
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let measuring = common::measuring();
    let state_mb = if measuring { env_usize("DTENSOR_BENCH_STATE_MB", 512) } else { 4 };
    let pairs = if measuring { env_usize("DTENSOR_BENCH_PAIRS", 5) } else { 1 };
    let base =
        std::env::var("DTENSOR_BENCH_DIR").map(std::path::PathBuf::from).unwrap_or_else(|_| std::env::temp_dir());
    let dir = tempfile::tempdir_in(base).expect("a temporary directory");
    // Parameters are a third of the state; 8 tensors of `rows × COLS` f64.
    let rows = (state_mb << 20) / 3 / 8 / (COLS * 8);
    let rows = rows.max(4);
    let out = dtensor::run(4, |ctx| -> Result<Vec<Pair>> {
        let mesh = ctx.init_device_mesh(&[4], &["dp"])?;
        let opts = TensorOptions::new().mesh(&mesh).placements(&[Shard(0)]);
        let mut m = Params(
            (0..8).map(|_| Ok(randn::<f64>(&[rows, COLS], &opts)?.requires_grad_(true))).collect::<Result<_>>()?,
        );
        let mut opt = AdamW::new(1e-3);
        step(&mut m, &mut opt)?;
        let mut ck = Checkpointer::new(dir.path()).keep_last(1);
        let mut rows_out = Vec::new();
        for _ in 0..pairs {
            // Synchronous: the loop waits for the whole save.
            mesh.barrier(Along::All)?;
            let t = Instant::now();
            ck.save(TrainState::new(&m, 1).optimizer(&opt))?;
            let sync = slowest(&mesh, t.elapsed())?;
            // A step alone.
            mesh.barrier(Along::All)?;
            let t = Instant::now();
            step(&mut m, &mut opt)?;
            let step_alone = slowest(&mesh, t.elapsed())?;
            // Background: the loop waits for the copy only, then steps while the files are written.
            mesh.barrier(Along::All)?;
            let t = Instant::now();
            ck.save_async(TrainState::new(&m, 2).optimizer(&opt))?;
            let blocking = slowest(&mesh, t.elapsed())?;
            let t = Instant::now();
            step(&mut m, &mut opt)?;
            let step_during = slowest(&mesh, t.elapsed())?;
            let t = Instant::now();
            ck.wait()?;
            let rest = slowest(&mesh, t.elapsed())?;
            rows_out.push((sync, blocking, step_alone, step_during, rest));
        }
        Ok(rows_out)
    })
    .expect("the benchmark ran");
    let r = &out[0];
    let state_bytes = 3 * 8 * rows * COLS * 8;
    println!(
        "training-state save, 4 thread ranks, {:.0} MB of state ({} MB per rank), {} pair(s), median over pairs:",
        state_bytes as f64 / 1e6,
        state_bytes / 4 / 1_000_000,
        pairs
    );
    let col = |f: fn(&Pair) -> f64| median(r.iter().map(f).collect());
    println!("| save (blocking, ms) | save_async blocking (ms) | blocking / save | AdamW step alone (ms) | step during the write (ms) | wait after the step (ms) |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {:.1} | {:.1} | {:.3} | {:.1} | {:.1} | {:.1} |",
        col(|x| x.0) * 1e3,
        col(|x| x.1) * 1e3,
        col(|x| x.1 / x.0),
        col(|x| x.2) * 1e3,
        col(|x| x.3) * 1e3,
        col(|x| x.4) * 1e3
    );
}
