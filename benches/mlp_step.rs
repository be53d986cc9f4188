//! Training-step time of the `mlp_tp` example's model (2 Megatron MLP blocks, SGD), per
//! sample, on the thread backend: the 2×2 `dp × tp` mesh against 1 rank doing the same
//! global work.
//!
//! ```text
//! cargo bench --bench mlp_step
//! DTENSOR_BENCH_MESHES=1x1,2x2,1x2 cargo bench --bench mlp_step
//! DTENSOR_BENCH_MLP_SIZES=64x128x512,256x512x2048 cargo bench --bench mlp_step   # batch x dim x hidden
//! ```
//!
//! A step = forward (one tp all-reduce per block), MSE, backward (tp all-reduces for the input
//! gradients, one dp all-reduce per weight), SGD update, on one fixed batch (the data do not
//! change the work). Under `cargo test --benches` only the smallest size runs, once.

mod common;
#[path = "../examples/mlp_tp/model.rs"]
mod model;

use common::{measuring, Recorder};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput};
use dtensor::Along;
use model::{MlpConfig, Trainer};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

static RECORDER: LazyLock<Recorder> = LazyLock::new(Recorder::default);

/// (batch, dim, hidden).
const SIZES: [(usize, usize, usize); 4] = [(32, 64, 256), (64, 128, 512), (128, 256, 1024), (256, 512, 2048)];

/// `DTENSOR_BENCH_MLP_SIZES` (a list like `64x128x512,256x512x2048`), else [`SIZES`].
fn sizes() -> Vec<(usize, usize, usize)> {
    let Ok(spec) = std::env::var("DTENSOR_BENCH_MLP_SIZES") else { return SIZES.to_vec() };
    let parsed: Option<Vec<(usize, usize, usize)>> = spec
        .split(',')
        .map(|m| {
            let v: Vec<usize> =
                m.trim().split('x').map(|x| x.parse().ok().filter(|&v| v > 0)).collect::<Option<_>>()?;
            match v[..] {
                [b, d, h] => Some((b, d, h)),
                _ => None,
            }
        })
        .collect();
    parsed.unwrap_or_else(|| {
        eprintln!("DTENSOR_BENCH_MLP_SIZES={spec:?} is not a list like 64x128x512; using {SIZES:?}");
        SIZES.to_vec()
    })
}

fn meshes() -> Vec<(usize, usize)> {
    let spec = std::env::var("DTENSOR_BENCH_MESHES").unwrap_or_else(|_| "1x1,2x2".into());
    let parsed: Option<Vec<(usize, usize)>> = spec
        .split(',')
        .map(|m| {
            let (a, b) = m.trim().split_once('x')?;
            Some((a.parse().ok().filter(|&v| v > 0)?, b.parse().ok().filter(|&v| v > 0)?))
        })
        .collect();
    parsed.unwrap_or_else(|| {
        eprintln!("DTENSOR_BENCH_MESHES={spec:?} is not a list like 1x1,2x2; using 1x1,2x2");
        vec![(1, 1), (2, 2)]
    })
}

/// `iters` steps on a fresh `dp × tp` world (after one untimed step); the slowest rank's time.
fn run_steps(cfg: MlpConfig, (dp, tp): (usize, usize), iters: u64) -> Duration {
    run_steps_with(cfg, (dp, tp), iters, None)
}

/// [`run_steps`] whose backward overlaps the dp gradient all-reduces in buckets of `bucket`
/// bytes (`None`: plain backward).
fn run_steps_with(cfg: MlpConfig, (dp, tp): (usize, usize), iters: u64, bucket: Option<usize>) -> Duration {
    let times = dtensor::run(dp * tp, |ctx| {
        let mesh = ctx.init_device_mesh(&[dp, tp], &["dp", "tp"])?;
        let mut trainer = Trainer::new(&mesh, cfg)?.overlap_grad_reduce(bucket);
        let (x, y) = trainer.batch()?;
        trainer.train_step(&x, &y)?;
        mesh.barrier(Along::All)?;
        let t0 = Instant::now();
        for _ in 0..iters {
            trainer.train_step(&x, &y)?;
        }
        mesh.barrier(Along::All)?;
        Ok(t0.elapsed())
    });
    match times {
        Ok(t) => t.into_iter().max().unwrap_or_default(),
        Err(e) => panic!("mlp step on {dp}x{tp} with {cfg:?} failed: {e}"),
    }
}

fn key(size: (usize, usize, usize), mesh: (usize, usize)) -> String {
    format!("b{}_d{}_h{}/{}x{}", size.0, size.1, size.2, mesh.0, mesh.1)
}

fn bench_mlp_step(c: &mut Criterion) {
    let all = sizes();
    let sizes = if measuring() { &all[..] } else { &all[..1] };
    let meshes = meshes();
    let mut group = c.benchmark_group("mlp_step");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    group.sampling_mode(SamplingMode::Flat);
    for &size in sizes {
        let (batch, dim, hidden) = size;
        let cfg = MlpConfig { batch, dim, hidden, layers: 2, lr: 0.1, seed: 0 };
        group.throughput(Throughput::Elements(batch as u64));
        for &mesh in &meshes {
            let id = BenchmarkId::new(format!("{}x{}", mesh.0, mesh.1), format!("b{batch}_d{dim}_h{hidden}"));
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    let t = run_steps(cfg, mesh, iters);
                    RECORDER.add(&key(size, mesh), iters, t);
                    t
                })
            });
        }
    }
    group.finish();
    println!();
    println!("mlp_tp training step (2 blocks, SGD), thread backend; speedup = t(1x1) / t(mesh)");
    if !measuring() {
        println!("(test mode: one iteration each, timings are not measurements; run `cargo bench --bench mlp_step`)");
    }
    println!(
        "{:<7} {:>5} {:>6} {:>6} {:>12} {:>14} {:>8}",
        "mesh", "batch", "dim", "hidden", "ms/step", "µs/sample", "speedup"
    );
    for &size in sizes {
        for &mesh in &meshes {
            if let Some(t) = RECORDER.median_ns(&key(size, mesh)) {
                // Machine-readable, for scripts/compare_torch.sh.
                println!("mlp-result {} {} {} {}x{} {:.4}", size.0, size.1, size.2, mesh.0, mesh.1, t / 1e6);
            }
        }
    }
    for &size in sizes {
        let base = RECORDER.median_ns(&key(size, (1, 1)));
        for &mesh in &meshes {
            let Some(t) = RECORDER.median_ns(&key(size, mesh)) else { continue };
            let speedup = base.map(|b| format!("{:.2}", b / t)).unwrap_or_else(|| "-".into());
            println!(
                "{:<7} {:>5} {:>6} {:>6} {:>12.3} {:>14.2} {:>8}",
                format!("{}x{}", mesh.0, mesh.1),
                size.0,
                size.1,
                size.2,
                t / 1e6,
                t / 1e3 / size.0 as f64,
                speedup
            );
        }
    }
    if std::env::var_os("DTENSOR_BENCH_NO_OVERLAP").is_none() {
        paired_overlap(sizes, &meshes);
    }
}

/// `DTENSOR_BENCH_BUCKETS` (bucket sizes in bytes, e.g. `0,1048576`), else 0 (one all-reduce
/// per gradient), 1 MiB and DDP's default 25 MiB.
fn buckets() -> Vec<usize> {
    const DEFAULT: [usize; 3] = [0, 1 << 20, 25 << 20];
    let Ok(spec) = std::env::var("DTENSOR_BENCH_BUCKETS") else { return DEFAULT.to_vec() };
    spec.split(',').map(|b| b.trim().parse().ok()).collect::<Option<Vec<usize>>>().unwrap_or_else(|| {
        eprintln!("DTENSOR_BENCH_BUCKETS={spec:?} is not a list of byte counts; using {DEFAULT:?}");
        DEFAULT.to_vec()
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The dp gradient overlap against plain backward, in paired rounds (plain, then each bucket
/// size, back to back, so that both see the same machine state); per bucket size the median
/// ms/step of both and the median per-round ratio t(plain) / t(overlap).
fn paired_overlap(sizes: &[(usize, usize, usize)], meshes: &[(usize, usize)]) {
    let rounds = if measuring() { 9 } else { 1 };
    let buckets = buckets();
    println!();
    println!("dp gradient overlap (BackwardOptions::overlap_grad_reduce) in {rounds} paired round(s);");
    println!("ratio = t(plain backward) / t(overlap), per round, median (min..max); > 1: overlap is faster");
    println!(
        "{:<7} {:>5} {:>6} {:>6} {:>10} {:>13} {:>13} {:>20}",
        "mesh", "batch", "dim", "hidden", "bucket", "plain ms", "overlap ms", "ratio"
    );
    for &size in sizes {
        let (batch, dim, hidden) = size;
        let cfg = MlpConfig { batch, dim, hidden, layers: 2, lr: 0.1, seed: 0 };
        for &mesh in meshes.iter().filter(|m| m.0 > 1) {
            // About 0.3 s per timed run, from the criterion median.
            let per_step = RECORDER.median_ns(&key(size, mesh)).unwrap_or(1e6);
            let iters = if measuring() { (3e8 / per_step).clamp(3.0, 200.0) as u64 } else { 1 };
            let mut plain = Vec::new();
            let mut runs: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); buckets.len()];
            for _ in 0..rounds {
                let p = run_steps_with(cfg, mesh, iters, None).as_secs_f64() / iters as f64;
                plain.push(p);
                for (&b, (times, ratios)) in buckets.iter().zip(runs.iter_mut()) {
                    let t = run_steps_with(cfg, mesh, iters, Some(b)).as_secs_f64() / iters as f64;
                    times.push(t);
                    ratios.push(p / t);
                }
            }
            let p = median(&mut plain);
            for (&b, (times, ratios)) in buckets.iter().zip(runs.iter_mut()) {
                let (lo, hi) = ratios.iter().fold((f64::MAX, 0.0f64), |(l, h), &r| (l.min(r), h.max(r)));
                let r = median(ratios);
                println!(
                    "{:<7} {:>5} {:>6} {:>6} {:>10} {:>13.3} {:>13.3} {:>20}",
                    format!("{}x{}", mesh.0, mesh.1),
                    batch,
                    dim,
                    hidden,
                    b,
                    p * 1e3,
                    median(times) * 1e3,
                    format!("{r:.3} ({lo:.2}..{hi:.2})")
                );
                println!("overlap-result {batch} {dim} {hidden} {}x{} {b} {r:.4} {lo:.4} {hi:.4}", mesh.0, mesh.1);
            }
        }
    }
}

criterion_group!(benches, bench_mlp_step);
criterion_main!(benches);
