//! An FSDP training step of the `transformer_tp` GPT (f64, AdamW), fully sharded over dp
//! thread ranks: the step time (median, the slowest rank) and each rank's peak heap growth
//! (a counting allocator per thread: model, gradients, optimizer state, gathered parameters
//! and activations), at dp = 1, 2, 4. `scripts/compare_fsdp.sh` runs PyTorch FSDP2 on the
//! same model and sizes beside it.
//!
//! ```text
//! cargo bench --bench fsdp_step
//! DTENSOR_BENCH_FSDP_CONFIGS=compute DTENSOR_BENCH_FSDP_DPS=4 DTENSOR_BENCH_FSDP_STEPS=10 cargo bench --bench fsdp_step
//! ```
//!
//! Configurations (`name: vocab/width/heads/seq/batch/layers`): `compute` 512/256/8/64/8/4
//! (activations matter), `params` 512/512/8/8/4/4 (parameters, gradients and moments dominate
//! memory). Prints one `fsdp-result <config> <dp> <ms/step> <peak bytes>` line per run. Under
//! `cargo test --benches` a tiny model runs 2 steps on 2 ranks.

mod common;

#[path = "../examples/hf_load/heap.rs"]
mod heap;
#[allow(dead_code)]
#[path = "../examples/transformer_tp/model.rs"]
mod model;

use dtensor::fsdp::{fully_shard, FullyShardOptions};
use dtensor::module::Module;
use dtensor::optim::AdamW;
use dtensor::prelude::*;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dt;
use dtensor::{manual_seed, Along};
use model::{Gpt, GptConfig};
use std::time::Instant;

#[global_allocator]
static ALLOC: heap::Counting = heap::Counting;

type Tokens = Dt<i64, (dp, tp), (Shard<0>, Replicate), 2>;

fn config(name: &str) -> Option<GptConfig> {
    let (vocab, width, heads, seq, batch, layers) = match name {
        "compute" => (512, 256, 8, 64, 8, 4),
        "params" => (512, 512, 8, 8, 4, 4),
        "tiny" => (32, 16, 4, 8, 4, 2),
        _ => return None,
    };
    Some(GptConfig { vocab, width, heads, seq, batch, layers, lr: 1e-3, seed: 0 })
}

/// (median ms per step of the slowest rank, largest per-rank peak heap growth in bytes).
fn measure(cfg: &GptConfig, dpn: usize, steps: usize) -> Result<(f64, isize)> {
    let out = dtensor::run(dpn, |ctx| {
        let mesh = ctx.init_device_mesh(&[dpn, 1], &["dp", "tp"])?;
        let (r, peak) = heap::peak_growth(|| -> Result<Vec<f64>> {
            manual_seed(cfg.seed);
            let mut model = fully_shard(Gpt::new(cfg, &mesh)?, &mesh, &FullyShardOptions::on("dp"))?;
            let mut opt = AdamW::new(cfg.lr);
            let (ids, targets) = model::batch_data(cfg)?;
            let (ids, targets): (Tokens, Tokens) = (Dt::distribute(&ids, &mesh)?, Dt::distribute(&targets, &mesh)?);
            let mut times = Vec::new();
            // One step more than measured: the first allocates AdamW's moments.
            for _ in 0..=steps {
                let start = Instant::now();
                model.zero_grad();
                let loss = model.call(|m| model::loss(m, &ids, &targets, cfg.heads))?;
                loss.backward()?;
                opt.step(&mut model)?;
                let mut t = [start.elapsed().as_secs_f64()];
                mesh.all_reduce(Along::All, &mut t, dtensor::ReduceOp::Max)?;
                times.push(t[0]);
            }
            Ok(times)
        });
        let mut times = r?;
        times.remove(0);
        times.sort_by(f64::total_cmp);
        Ok((times[times.len() / 2] * 1e3, peak))
    })?;
    Ok((out[0].0, out.iter().map(|o| o.1).max().unwrap_or(0)))
}

fn main() {
    let measuring = common::measuring();
    let names = match (measuring, std::env::var("DTENSOR_BENCH_FSDP_CONFIGS")) {
        (false, _) => vec!["tiny".to_string()],
        (true, Ok(v)) => v.split(',').map(|s| s.trim().to_string()).collect(),
        (true, Err(_)) => vec!["compute".into(), "params".into()],
    };
    let dps = if measuring { common::env_list("DTENSOR_BENCH_FSDP_DPS", &[1, 2, 4]) } else { vec![2] };
    let steps = if measuring { common::env_list("DTENSOR_BENCH_FSDP_STEPS", &[5])[0].max(1) } else { 1 };
    for name in names {
        let Some(cfg) = config(&name) else {
            eprintln!("fsdp_step: unknown configuration {name:?} (compute, params, tiny)");
            std::process::exit(2);
        };
        for &dpn in &dps {
            match measure(&cfg, dpn, steps) {
                Ok((ms, peak)) => {
                    println!("fsdp-result {name} {dpn} {ms:.3} {peak}");
                    eprintln!(
                        "fsdp_step {name} dp={dpn}: {ms:.1} ms/step, peak heap growth {:.1} MB per rank",
                        peak as f64 / 1e6
                    );
                }
                Err(e) => {
                    eprintln!("fsdp_step {name} dp={dpn}: {e}");
                    std::process::exit(1);
                }
            }
        }
    }
}
