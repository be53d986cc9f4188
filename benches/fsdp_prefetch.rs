//! FSDP forward prefetch on the thread backend: a step of a sequence of fully sharded layers
//! made with `prefetch` (`Sequential`: unit `i + 1`'s all-gathers start on the rank's
//! background worker before unit `i` computes) against the same layers without it, in one
//! run: the median step time of the slowest rank, and the ratio.
//!
//! ```text
//! cargo bench --bench fsdp_prefetch
//! DTENSOR_BENCH_FSDP_DPS=2,4 DTENSOR_BENCH_FSDP_STEPS=10 cargo bench --bench fsdp_prefetch
//! ```
//!
//! Model: 8 layers `Linear(1024, 1024)` + GELU in f32, batch 64 per rank, SGD. Prints one
//! `fsdp-prefetch <dp> <ms plain> <ms prefetch> <ratio>` line per dp. Under `cargo test
//! --benches` a tiny model runs 1 step on 2 ranks.

mod common;

use dtensor::fsdp::{fully_shard, FullyShard, FullyShardOptions};
use dtensor::module::{Forward, Linear, Module, Sequential};
use dtensor::optim::Sgd;
use dtensor::{distribute_tensor, manual_seed, Along, DTensor, ReduceOp, Result, Shard};
use ndarray::ArrayD;
use std::time::Instant;

/// One layer: `gelu(x Wᵀ + b)`.
#[derive(Clone)]
struct Layer(Linear<f32>);

impl Module<f32> for Layer {
    fn named_parameters(&self) -> Vec<(String, &DTensor<f32>)> {
        self.0.named_parameters()
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<f32>)> {
        self.0.named_parameters_mut()
    }
}

impl Forward<f32> for Layer {
    fn forward(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> {
        self.0.forward(x)?.gelu()
    }
}

/// Median ms per step of the slowest rank, with (`prefetch`) or without forward prefetch.
fn measure(dpn: usize, width: usize, layers: usize, batch: usize, steps: usize, prefetch: bool) -> Result<f64> {
    let out = dtensor::run(dpn, |ctx| {
        let mesh = ctx.init_device_mesh(&[dpn], &["dp"])?;
        manual_seed(0);
        let units = (0..layers)
            .map(|i| {
                let opts = FullyShardOptions::on("dp").named(&format!("{i}")).prefetch(prefetch);
                fully_shard(Layer(Linear::new(width, width, true)?), &mesh, &opts)
            })
            .collect::<Result<Vec<FullyShard<f32, Layer>>>>()?;
        let mut model = Sequential(units);
        let mut opt = Sgd::new(1e-3);
        let x = ArrayD::from_shape_fn(vec![batch * dpn, width], |i| ((i[0] * 7 + i[1]) % 13) as f32 / 13.0);
        let x = distribute_tensor(&x, &mesh, &[Shard(0)], None)?;
        let mut times = Vec::new();
        for _ in 0..=steps {
            let start = Instant::now();
            model.zero_grad();
            let y = model.forward(&x)?;
            y.mul(&y)?.mean()?.backward()?;
            opt.step(&mut model)?;
            let mut t = [start.elapsed().as_secs_f64()];
            mesh.all_reduce(Along::All, &mut t, ReduceOp::Max)?;
            times.push(t[0]);
        }
        times.remove(0); // the first step warms the kernels' scratch
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2] * 1e3)
    })?;
    Ok(out[0])
}

fn main() {
    let measuring = common::measuring();
    let (width, layers, batch) = if measuring { (1024, 8, 64) } else { (16, 2, 2) };
    let dps = if measuring { common::env_list("DTENSOR_BENCH_FSDP_DPS", &[2, 4]) } else { vec![2] };
    let steps = if measuring { common::env_list("DTENSOR_BENCH_FSDP_STEPS", &[7])[0].max(1) } else { 1 };
    for dpn in dps {
        let run = |prefetch| measure(dpn, width, layers, batch, steps, prefetch);
        match run(false).and_then(|plain| Ok((plain, run(true)?))) {
            Ok((plain, ahead)) => {
                println!("fsdp-prefetch {dpn} {plain:.3} {ahead:.3} {:.3}", plain / ahead);
                eprintln!(
                    "fsdp_prefetch dp={dpn}: {plain:.1} ms/step without prefetch, {ahead:.1} with ({:.2}x)",
                    plain / ahead
                );
            }
            Err(e) => {
                eprintln!("fsdp_prefetch dp={dpn}: {e}");
                std::process::exit(1);
            }
        }
    }
}
