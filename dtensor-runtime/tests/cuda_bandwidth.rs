//! Device redistribution bandwidth on `cuda-threads` against a device-to-device memcpy of the
//! same bytes, measured in the same run: f32 tensors of 256 MiB and 1 GiB on 2, 4 and 8 thread
//! ranks, for S(0)→R (all-gather), P→R (all-reduce), R→S(0) (local chunk), P→S(0)
//! (reduce-scatter) and S(0)→S(1) (all-to-all). One warm-up, then the best of 3 (of 1 when the
//! warm-up took over 1.5 s); the device is synchronised and the ranks meet at a barrier before
//! the clock is read. GB/s counts the logical tensor's bytes. Every result is checked on the
//! device against `rand` placed directly in the target layout; the ratio to memcpy is
//! reported, not asserted. Prints `BANDWIDTH` table lines and one `GPUCHECK` row per rank
//! count; without a GPU it prints a SKIP row and returns.

mod cuda_device;

use cuda_device::device;
use dtensor_runtime::cuda::CudaDevice;
use dtensor_runtime::op::{BinaryOp, Reduction, UnaryOp};
use dtensor_runtime::storage::Storage;
use dtensor_runtime::{
    from_local, launch, manual_seed, rand, Along, DTensor, DeviceMesh, FromLocal, Launch, Partial, Placement, RankCtx,
    ReduceOp, Replicate, Result, Shard, TensorOptions,
};
use std::sync::Arc;
use std::time::Instant;

const TEST: &str = "cuda_bandwidth";
const SEED: u64 = 12;
const RANKS: [usize; 3] = [2, 4, 8];
/// (label, side of the square f32 tensor): 256 MiB and 1 GiB.
const SIZES: [(&str, usize); 2] = [("256 MiB", 8192), ("1 GiB", 16384)];
/// No new (ranks, size) run once the test would pass this many seconds.
const BUDGET_S: f64 = 55.0;
/// A warm-up slower than this leaves one timed run instead of three.
const SLOW_WARMUP_MS: f64 = 1500.0;

/// (label, from, to) of the measured redistributions.
fn transitions() -> [(&'static str, Placement, Placement); 5] {
    let p = Partial(ReduceOp::Sum);
    [
        ("S(0)->R all-gather", Shard(0), Replicate),
        ("P->R all-reduce", p, Replicate),
        ("R->S(0) local chunk", Replicate, Shard(0)),
        ("P->S(0) reduce-scatter", p, Shard(0)),
        ("S(0)->S(1) all-to-all", Shard(0), Shard(1)),
    ]
}

/// Waits for all work on the device (every rank's stream of the shared context).
fn sync(dev: &CudaDevice) {
    dev.context().synchronize().expect("device synchronize");
}

/// Best of 3 memcpy_dtod of `bytes` after one warm-up, in ms.
fn memcpy_ms(dev: &Arc<CudaDevice>, bytes: usize) -> f64 {
    let s = dev.stream();
    let src = s.alloc_zeros::<u8>(bytes).expect("memcpy source");
    let mut dst = s.alloc_zeros::<u8>(bytes).expect("memcpy destination");
    let mut best = f64::INFINITY;
    for i in 0..4 {
        sync(dev);
        let t0 = Instant::now();
        s.memcpy_dtod(&src, &mut dst).expect("memcpy_dtod");
        sync(dev);
        if i > 0 {
            best = best.min(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    best
}

/// The same random tensor (fixed seed, placement-invariant) in `placement`, times `factor`.
fn reference(mesh: &DeviceMesh, placement: Placement, side: usize, factor: f64) -> Result<DTensor<f32>> {
    manual_seed(SEED);
    let t = rand::<f32>(&[side, side], &TensorOptions::new().mesh(mesh).placements(&[placement]))?;
    if factor == 1.0 {
        return Ok(t);
    }
    from_local(t.local().unary(UnaryOp::MulScalar(factor))?, mesh, &[placement], FromLocal::with_shape(&[side, side]))
}

/// The input in `placement`: a Partial holds the random tensor times (rank + 1) on each rank.
fn input(mesh: &DeviceMesh, placement: Placement, side: usize, rank: usize) -> Result<DTensor<f32>> {
    if !placement.is_partial() {
        return reference(mesh, placement, side, 1.0);
    }
    let local = reference(mesh, Replicate, side, (rank + 1) as f64)?.into_local();
    from_local(local, mesh, &[placement], FromLocal::default())
}

/// max |a - b| over all elements, computed on the device.
fn max_abs_diff(a: &Storage<f32>, b: &Storage<f32>) -> Result<f64> {
    let d = a.binary(BinaryOp::Sub, b)?;
    if d.is_empty() {
        return Ok(0.0);
    }
    let dims: Vec<usize> = (0..d.shape().len()).collect();
    let hi = d.reduce(Reduction::Max, &dims, false)?.into_host()?;
    let lo = d.reduce(Reduction::Min, &dims, false)?.into_host()?;
    Ok(hi.iter().chain(lo.iter()).fold(0.0f64, |m, x| m.max((*x as f64).abs())))
}

/// One rank's measurement of one transition.
struct Measured {
    /// ms of each timed run (the warm-up excluded).
    times: Vec<f64>,
    /// max |result - reference| on this rank.
    err: f64,
    /// Tolerance of `err` (reductions round; copies must be exact).
    tol: f64,
}

/// Times `f` between two device synchronisations and barriers; returns (ms, result).
fn timed(mesh: &DeviceMesh, dev: &CudaDevice, f: impl Fn() -> Result<DTensor<f32>>) -> Result<(f64, DTensor<f32>)> {
    sync(dev);
    mesh.barrier(Along::All)?;
    let t0 = Instant::now();
    let r = f()?;
    sync(dev);
    mesh.barrier(Along::All)?;
    Ok((t0.elapsed().as_secs_f64() * 1e3, r))
}

/// Every transition on this rank for a `side`² tensor.
fn rank_body(ctx: &RankCtx, side: usize) -> Result<Vec<Measured>> {
    let world = ctx.world_size();
    let mesh = ctx.init_device_mesh(&[world], &["x"])?;
    let dev = mesh.comm().cuda_device().expect("cuda-threads ranks have a device");
    let w = world as f64;
    let mut out = Vec::new();
    for (_, from, to) in transitions() {
        let factor = if from.is_partial() { w * (w + 1.0) / 2.0 } else { 1.0 };
        let src = input(&mesh, from, side, ctx.rank())?;
        let (warm, r) = timed(&mesh, &dev, || src.redistribute(&[to]))?;
        drop(r);
        // Every rank must take the same number of runs (each is a collective).
        let mut slow = [warm];
        mesh.all_reduce(Along::All, &mut slow, ReduceOp::Max)?;
        let runs = if slow[0] > SLOW_WARMUP_MS { 1 } else { 3 };
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..runs {
            drop(last.take()); // free the previous result first: 1 GiB per rank
            let (ms, r) = timed(&mesh, &dev, || src.redistribute(&[to]))?;
            times.push(ms);
            last = Some(r);
        }
        drop(src);
        let got = last.expect("at least one run");
        assert_eq!(got.placements(), &[to]);
        let want = reference(&mesh, to, side, factor)?;
        let err = max_abs_diff(got.local(), want.local())?;
        let tol = if from.is_partial() { 4.0 * w * f32::EPSILON as f64 * factor } else { 0.0 };
        out.push(Measured { times, err, tol });
    }
    Ok(out)
}

/// A ratio to memcpy: three decimals, or two significant digits below 0.01 (the host-staged
/// collectives run at a thousandth of memcpy).
fn ratio(x: f64) -> String {
    if x >= 0.01 {
        format!("{x:.3}")
    } else {
        format!("{x:.1e}")
    }
}

/// What one (ranks, size) run gives the rank count's row.
struct Run {
    size: &'static str,
    /// (transition, ms, x memcpy) per transition.
    ratios: Vec<(&'static str, f64, f64)>,
    single: bool,
}

/// Runs and prints one (ranks, size) case; `Err` says what failed.
fn measure(ranks: usize, size: &'static str, side: usize, copy_ms: f64) -> std::result::Result<Run, String> {
    let bytes = (side * side * 4) as f64;
    let per_rank = launch(Launch::CudaThreads, ranks, |ctx| rank_body(&ctx, side)).map_err(|e| e.to_string())?;
    let mut run = Run { size, ratios: Vec::new(), single: false };
    for (i, (name, _, _)) in transitions().into_iter().enumerate() {
        let ms_of = |k: usize| per_rank.iter().map(|m| m[i].times[k]).fold(0.0, f64::max);
        let runs = per_rank[0][i].times.len();
        let ms = (0..runs).map(ms_of).fold(f64::INFINITY, f64::min);
        for (rank, m) in per_rank.iter().enumerate() {
            if m[i].err > m[i].tol {
                return Err(format!("{name} {size}: rank {rank} max err {:.2e} > {:.2e}", m[i].err, m[i].tol));
            }
        }
        let x = copy_ms / ms;
        println!("BANDWIDTH {name} | {ranks} | {size} | {ms:.2} | {:.1} | {}", bytes / ms / 1e6, ratio(x));
        run.single |= runs == 1;
        run.ratios.push((name, ms, x));
    }
    Ok(run)
}

#[test]
fn redistribution_bandwidth_vs_memcpy() {
    let Some(dev) = device(TEST) else { return };
    let start = Instant::now();
    println!("BANDWIDTH transition | ranks | size | ms | GB/s | x memcpy");
    let copy: Vec<f64> = SIZES.iter().map(|&(_, side)| memcpy_ms(&dev, side * side * 4)).collect();
    for (&(size, side), ms) in SIZES.iter().zip(&copy) {
        let gbps = (side * side * 4) as f64 / ms / 1e6;
        println!("BANDWIDTH memcpy d2d (baseline) | 1 | {size} | {ms:.2} | {gbps:.1} | 1.000");
    }
    let mut failed = false;
    for ranks in RANKS {
        let mut runs = Vec::new();
        let mut notes = Vec::new();
        let mut error = None;
        let mut last_s = 0.0;
        for (k, &(size, side)) in SIZES.iter().enumerate() {
            // The next size is 4x the bytes: skip it when it would overrun the budget.
            let elapsed = start.elapsed().as_secs_f64();
            let guess = if k == 0 { 0.0 } else { 4.0 * last_s };
            if elapsed + guess > BUDGET_S {
                notes.push(format!("{size} skipped: ~{guess:.0} s more would pass the {BUDGET_S} s budget"));
                continue;
            }
            let t0 = Instant::now();
            match measure(ranks, size, side, copy[k]) {
                Ok(r) => runs.push(r),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
            last_s = t0.elapsed().as_secs_f64();
        }
        let row = format!("{TEST}_{ranks}_ranks");
        if let Some(e) = error {
            failed = true;
            println!("GPUCHECK {row} | FAIL | {e}");
            continue;
        }
        let sizes: Vec<&str> = runs.iter().map(|r| r.size).collect();
        let all: Vec<(&str, &str, f64)> =
            runs.iter().flat_map(|r| r.ratios.iter().map(move |&(n, _, x)| (n, r.size, x))).collect();
        let best = all.iter().copied().fold(None, |b: Option<(&str, &str, f64)>, c| match b {
            Some(b) if b.2 >= c.2 => Some(b),
            _ => Some(c),
        });
        let worst = all.iter().copied().fold(None, |b: Option<(&str, &str, f64)>, c| match b {
            Some(b) if b.2 <= c.2 => Some(b),
            _ => Some(c),
        });
        if runs.iter().any(|r| r.single) {
            notes.push(format!("best of 1 where the warm-up took > {SLOW_WARMUP_MS} ms"));
        }
        let span = match (best, worst) {
            (Some(b), Some(w)) => {
                format!("x memcpy {} ({} {}) to {} ({} {})", ratio(w.2), w.0, w.1, ratio(b.2), b.0, b.1)
            }
            _ => "nothing measured".into(),
        };
        let result = if runs.is_empty() { "FAIL" } else { "PASS" };
        failed |= runs.is_empty();
        let notes = if notes.is_empty() { String::new() } else { format!("; {}", notes.join("; ")) };
        println!(
            "GPUCHECK {row} | {result} | {} x {} transitions checked on the device; {span}{notes}",
            sizes.join("+"),
            transitions().len()
        );
    }
    println!("{TEST}: {:.1} s", start.elapsed().as_secs_f64());
    assert!(!failed, "{TEST}: see the FAIL rows above");
}
