//! Redistribution bandwidth on the embedded thread backend, as a fraction of a plain memcpy
//! of the same bytes measured in the same run.
//!
//! ```text
//! cargo bench --bench collectives                       # 1, 16, 256 MiB over 2, 4, 8 ranks
//! DTENSOR_BENCH_SIZES_MIB=1,4,16 DTENSOR_BENCH_RANKS=4 cargo bench --bench collectives
//! cargo bench --bench collectives -- all_gather/4r      # criterion filter
//! ```
//!
//! For every collective, tensor size `S` (the global f32 tensor, 1-d mesh of `n` ranks) and
//! rank count it measures four layers, each in a fresh in-process world whose `n` rank
//! threads run the timed loop between two barriers:
//!
//! - `memcpy`: every rank copies the bytes it must receive into a preallocated buffer: the
//!   physical limit of a one-copy shared-memory collective under the same thread count;
//! - `fresh_memcpy`: the same copy into a buffer allocated for it as the runtime allocates
//!   outputs ([`dtensor::alloc`]): what any layer that returns a new tensor pays at least, first
//!   touch of fresh pages included (from 32 MiB up every allocation is a fresh memory map);
//! - `comm`: the backend (`Communicator`) with preallocated buffers: rendezvous + copy/reduce;
//! - `mesh`: the typed `DeviceMesh` collective (allocates its output every call);
//! - `redistribute`: `DTensor::redistribute` (S(0)→R, P→R, P→S(0), S(0)→S(1)), which adds
//!   the planner, padding and permutes. Its ratio is *paired*: every sample times the memcpy
//!   baseline again in the same world right before the redistribution, and the column is the
//!   median of the per-sample ratios. On a shared host the memory bandwidth drifts by up to
//!   3× between criterion's separate runs (seen: 9 to 34 GB/s for the same 16 MiB memcpy
//!   minutes apart); the pairing keeps that drift out of the ratio.
//!
//! "The bytes it must receive" per rank: all-gather `S`, all-reduce `S`, reduce-scatter `S`
//! (it reads `S/n` from each of `n` peers), all-to-all `S/n`. The table printed at the end
//! gives memcpy GB/s and each layer's ratio `t(memcpy) / t(layer)` (target ≥ 0.8).
//!
//! `DTENSOR_BENCH_UNEVEN=1` gives the `redistribute` layer's tensor one row more than
//! `S / 4 KiB`, so that its dim-0 shards are uneven (torch.chunk sizes) and the variable-size
//! collectives run (unpadded); the other layers and the memcpy baseline keep `S`.
//!
//! Under `cargo test --benches` criterion runs every routine once; sizes shrink to 1 MiB.
//! `DTENSOR_BENCH_MAX_GIB` (default 8) skips layers whose buffers would exceed it, and
//! `DTENSOR_BENCH_MAX_WORLD_MIB` (default 1024) configurations whose ranks hold more than that
//! of tensor in all (8 ranks × 256 MiB takes minutes per configuration on a 2-core machine).

mod common;

use common::{env_f64, env_list, measuring, Recorder};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput};
use dtensor::prelude::*;
use dtensor::{Along, DType};
use std::hint::black_box;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
/// Row length of the benchmark tensors (4 KiB of f32); rows = S / ROW_BYTES.
const COLS: usize = 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    AllGather,
    AllReduce,
    ReduceScatter,
    AllToAll,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::AllGather, Kind::AllReduce, Kind::ReduceScatter, Kind::AllToAll];

    fn name(self) -> &'static str {
        match self {
            Kind::AllGather => "all_gather",
            Kind::AllReduce => "all_reduce",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::AllToAll => "all_to_all",
        }
    }

    /// The redistribution that runs this collective.
    fn redistribution(self) -> (Placement, Placement) {
        match self {
            Kind::AllGather => (Shard(0), Replicate),
            Kind::AllReduce => (Partial(ReduceOp::Sum), Replicate),
            Kind::ReduceScatter => (Partial(ReduceOp::Sum), Shard(0)),
            Kind::AllToAll => (Shard(0), Shard(1)),
        }
    }

    /// Bytes each rank receives (or reads from its peers) for a global tensor of `s` bytes.
    fn moved_bytes(self, s: usize, n: usize) -> usize {
        match self {
            Kind::AllToAll => s / n,
            _ => s,
        }
    }

    /// Rough peak bytes per rank of `layer` (to skip what does not fit in memory).
    fn peak_bytes(self, layer: Layer, s: usize, n: usize) -> usize {
        match (layer, self) {
            (Layer::Memcpy | Layer::FreshMemcpy, _) => 2 * self.moved_bytes(s, n),
            // The paired memcpy's buffers (2 × moved bytes) are freed before the redistribution.
            (Layer::Redistribute, Kind::AllToAll) => 6 * s / n,
            (Layer::Redistribute, Kind::AllGather) => 3 * s,
            (Layer::Redistribute, _) => 4 * s,
            (_, Kind::AllToAll) => 2 * s / n,
            (_, Kind::AllReduce) => s,
            (_, _) => 2 * s,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Layer {
    Memcpy,
    FreshMemcpy,
    Comm,
    Mesh,
    Redistribute,
}

impl Layer {
    const ALL: [Layer; 5] = [Layer::Memcpy, Layer::FreshMemcpy, Layer::Comm, Layer::Mesh, Layer::Redistribute];

    fn name(self) -> &'static str {
        match self {
            Layer::Memcpy => "memcpy",
            Layer::FreshMemcpy => "fresh_memcpy",
            Layer::Comm => "comm",
            Layer::Mesh => "mesh",
            Layer::Redistribute => "redistribute",
        }
    }
}

static RECORDER: LazyLock<Recorder> = LazyLock::new(Recorder::default);

/// A vector of `len` copies of `v` whose pages are all written (not lazily zero-mapped), so
/// that no layer pays first-touch page faults for its inputs inside the timed loop.
fn touched(len: usize, v: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(len);
    out.resize(len, v);
    out
}

/// One world of `n` ranks running `iters` iterations of `layer`; returns the slowest rank's
/// time between the two barriers around the loop, and for `redistribute` also the slowest
/// rank's time of `iters` memcpys of the same bytes run just before it in the same world
/// (zero for the other layers).
fn run_once(kind: Kind, layer: Layer, s: usize, n: usize, iters: u64) -> (Duration, Duration) {
    let elems = s / 4;
    let times = dtensor::run(n, |ctx| {
        let mesh = ctx.init_device_mesh(&[n], &["x"])?;
        let group = mesh.group(0).to_vec();
        let comm = mesh.comm().clone();
        // Zeros keep in-place sums finite however many iterations run.
        let timed = |body: &mut dyn FnMut() -> Result<()>| -> Result<Duration> {
            mesh.barrier(Along::All)?;
            let t0 = Instant::now();
            for _ in 0..iters {
                body()?;
            }
            mesh.barrier(Along::All)?;
            Ok(t0.elapsed())
        };
        let memcpy = || -> Result<Duration> {
            let b = kind.moved_bytes(s, n) / 4;
            let src = touched(b, 1.0);
            let mut dst = touched(b, 0.0);
            timed(&mut || {
                dst.copy_from_slice(black_box(&src));
                black_box(&mut dst);
                Ok(())
            })
        };
        let solo = |t: Result<Duration>| t.map(|t| (t, Duration::ZERO));
        match layer {
            Layer::Memcpy => solo(memcpy()),
            Layer::FreshMemcpy => {
                let b = kind.moved_bytes(s, n) / 4;
                let src = touched(b, 1.0);
                solo(timed(&mut || {
                    let mut dst = dtensor::alloc::try_with_capacity::<f32>("fresh_memcpy", b)?;
                    dst.extend_from_slice(black_box(&src));
                    black_box(&mut dst);
                    Ok(())
                }))
            }
            Layer::Comm => {
                let (send_len, recv_len) = match kind {
                    Kind::AllGather => (elems / n, elems),
                    Kind::AllReduce => (elems, 0),
                    Kind::ReduceScatter => (elems, elems / n),
                    Kind::AllToAll => (elems / n, elems / n),
                };
                let mut send = touched(send_len, 0.0);
                let mut recv = touched(recv_len, 0.0);
                solo(timed(&mut || {
                    let (sb, rb): (&[u8], &mut [u8]) =
                        (bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut recv));
                    match kind {
                        Kind::AllGather => comm.all_gather(&group, sb.into(), rb.into()),
                        Kind::AllReduce => {
                            let buf: &mut [u8] = bytemuck::cast_slice_mut(&mut send);
                            comm.all_reduce(&group, buf.into(), DType::F32, ReduceOp::Sum)
                        }
                        Kind::ReduceScatter => {
                            comm.reduce_scatter(&group, sb.into(), rb.into(), DType::F32, ReduceOp::Sum)
                        }
                        Kind::AllToAll => comm.all_to_all(&group, sb.into(), rb.into()),
                    }
                }))
            }
            Layer::Mesh => {
                let along = Along::Dim(0);
                let mut send =
                    touched(if matches!(kind, Kind::AllGather | Kind::AllToAll) { elems / n } else { elems }, 0.0);
                solo(timed(&mut || {
                    match kind {
                        Kind::AllGather => drop(black_box(mesh.all_gather(along, &send)?)),
                        Kind::AllReduce => mesh.all_reduce(along, &mut send, ReduceOp::Sum)?,
                        Kind::ReduceScatter => drop(black_box(mesh.reduce_scatter(along, &send, ReduceOp::Sum)?)),
                        Kind::AllToAll => drop(black_box(mesh.all_to_all(along, &send)?)),
                    }
                    Ok(())
                }))
            }
            Layer::Redistribute => {
                let (from, to) = kind.redistribution();
                // Uneven: one row more than S / 4 KiB, so shards of dim 0 differ by a row (and
                // the last ones may differ more, as torch.chunk splits).
                let rows = s / (COLS * 4) + usize::from(uneven());
                let chunk = rows.div_ceil(n);
                let mine = chunk.min(rows.saturating_sub(mesh.coordinate()[0] * chunk));
                let local_rows = if from.is_shard() { mine } else { rows };
                let local = ndarray::ArrayD::from_shape_vec(vec![local_rows, COLS], touched(local_rows * COLS, 0.0))
                    .expect("rows * COLS elements");
                let dt = dtensor::from_local(local, &mesh, &[from], FromLocal::with_shape(&[rows, COLS]))?;
                let base = memcpy()?;
                let t = timed(&mut || {
                    black_box(dt.redistribute(&[to])?);
                    Ok(())
                })?;
                Ok((t, base))
            }
        }
    });
    match times {
        Ok(t) => {
            let slowest = |f: fn(&(Duration, Duration)) -> Duration| t.iter().map(f).max().unwrap_or_default();
            (slowest(|p| p.0), slowest(|p| p.1))
        }
        Err(e) => panic!("{} {} {} MiB over {n} ranks failed: {e}", kind.name(), layer.name(), s / MIB),
    }
}

fn key(kind: Kind, layer: Layer, s: usize, n: usize) -> String {
    format!("{}/{}r/{}MiB/{}", kind.name(), n, s / MIB, layer.name())
}

/// `DTENSOR_BENCH_UNEVEN=1`: the `redistribute` layer's tensor gets one extra row (see the
/// module docs).
fn uneven() -> bool {
    std::env::var("DTENSOR_BENCH_UNEVEN").is_ok_and(|v| v == "1")
}

/// Recorder key of the paired redistribute ratio (see the module docs).
fn paired(kind: Kind, s: usize, n: usize) -> String {
    format!("{}/paired", key(kind, Layer::Redistribute, s, n))
}

fn bench_collectives(c: &mut Criterion) {
    let full = measuring();
    let sizes = env_list("DTENSOR_BENCH_SIZES_MIB", if full { &[1, 16, 256] } else { &[1] });
    let ranks = env_list("DTENSOR_BENCH_RANKS", &[2, 4, 8]);
    let budget = (env_f64("DTENSOR_BENCH_MAX_GIB", 8.0) * (1u64 << 30) as f64) as usize;
    let world_budget = (env_f64("DTENSOR_BENCH_MAX_WORLD_MIB", 1024.0) * MIB as f64) as usize;
    let mut skipped = Vec::new();
    for kind in Kind::ALL {
        let mut group = c.benchmark_group(kind.name());
        group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
        group.sampling_mode(SamplingMode::Flat);
        for &n in &ranks {
            for &mib in &sizes {
                let s = mib * MIB;
                // Every shard must be whole rows (and all-to-all blocks whole columns).
                if n == 0 || !(s / (COLS * 4)).is_multiple_of(n) || !COLS.is_multiple_of(n) {
                    skipped.push(format!("{} {n} ranks {mib} MiB: rows or columns not divisible", kind.name()));
                    continue;
                }
                if n * s > world_budget {
                    skipped.push(format!("{} {n} ranks {mib} MiB: over DTENSOR_BENCH_MAX_WORLD_MIB", kind.name()));
                    continue;
                }
                group.throughput(Throughput::Bytes(kind.moved_bytes(s, n) as u64));
                for layer in Layer::ALL {
                    if n * kind.peak_bytes(layer, s, n) > budget {
                        skipped.push(format!("{}: over DTENSOR_BENCH_MAX_GIB", key(kind, layer, s, n)));
                        continue;
                    }
                    let id = BenchmarkId::new(format!("{n}r/{}", layer.name()), format!("{mib}MiB"));
                    group.bench_function(id, |b| {
                        b.iter_custom(|iters| {
                            let (t, base) = run_once(kind, layer, s, n, iters);
                            RECORDER.add(&key(kind, layer, s, n), iters, t);
                            if layer == Layer::Redistribute && !t.is_zero() {
                                RECORDER.add_value(&paired(kind, s, n), base.as_secs_f64() / t.as_secs_f64());
                            }
                            t
                        })
                    });
                }
            }
        }
        group.finish();
    }
    bench_latency(c, &ranks);
    print_table(&sizes, &ranks, full);
    for s in skipped {
        println!("skipped {s}");
    }
}

/// Fixed cost of one rendezvous: an empty barrier and an all-reduce of one f32.
fn bench_latency(c: &mut Criterion, ranks: &[usize]) {
    let mut group = c.benchmark_group("latency");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    for &n in ranks {
        for op in ["barrier", "all_reduce_4B"] {
            group.bench_function(BenchmarkId::new(op, format!("{n}r")), |b| {
                b.iter_custom(|iters| {
                    let times = dtensor::run(n, |ctx| {
                        let mesh = ctx.init_device_mesh(&[n], &["x"])?;
                        let mut one = [0f32];
                        mesh.barrier(Along::All)?;
                        let t0 = Instant::now();
                        for _ in 0..iters {
                            match op {
                                "barrier" => mesh.barrier(Along::All)?,
                                _ => mesh.all_reduce(Along::All, &mut one, ReduceOp::Sum)?,
                            }
                        }
                        Ok(t0.elapsed())
                    });
                    let t = times.map(|t| t.into_iter().max().unwrap_or_default());
                    let t = t.unwrap_or_else(|e| panic!("{op} over {n} ranks failed: {e}"));
                    RECORDER.add(&format!("latency/{op}/{n}r"), iters, t);
                    t
                })
            });
        }
    }
    group.finish();
}

fn print_table(sizes: &[usize], ranks: &[usize], full: bool) {
    println!();
    println!(
        "Thread-backend collectives vs memcpy of the same bytes per rank (ratio = t(memcpy) / t(layer); target >= 0.8)"
    );
    if !full {
        println!(
            "(test mode: one iteration each, timings are not measurements; run `cargo bench --bench collectives`)"
        );
    }
    println!(
        "{:<15} {:>5} {:>7} {:>12} {:>7} {:>8} {:>8} {:>13} {:>14}",
        "collective", "ranks", "MiB", "memcpy GB/s", "fresh", "comm", "mesh", "redistribute", "redist. GB/s"
    );
    for &n in ranks {
        let us = |op: &str| match RECORDER.median_ns(&format!("latency/{op}/{n}r")) {
            Some(t) => format!("{:.1} µs", t / 1e3),
            None => "-".into(),
        };
        println!("rendezvous latency, {n} ranks: barrier {}, all_reduce of 4 B {}", us("barrier"), us("all_reduce_4B"));
        if let Some(t) = RECORDER.median_ns(&format!("latency/all_reduce_4B/{n}r")) {
            println!("latency-result {n} {:.2}", t / 1e3);
        }
    }
    for kind in Kind::ALL {
        for &n in ranks {
            for &mib in sizes {
                let s = mib * MIB;
                let Some(base) = RECORDER.median_ns(&key(kind, Layer::Memcpy, s, n)) else { continue };
                let bytes = kind.moved_bytes(s, n) as f64;
                let ratio = |layer| match RECORDER.median_ns(&key(kind, layer, s, n)) {
                    Some(t) => format!("{:.2}", base / t),
                    None => "-".into(),
                };
                let paired_ratio = RECORDER.median_ns(&paired(kind, s, n));
                let redist_gbs = match RECORDER.median_ns(&key(kind, Layer::Redistribute, s, n)) {
                    Some(t) => format!("{:.2}", bytes / t),
                    None => "-".into(),
                };
                if let (Some(t), Some(p)) = (RECORDER.median_ns(&key(kind, Layer::Redistribute, s, n)), paired_ratio) {
                    // Machine-readable, for scripts/compare_torch.sh.
                    let fresh = RECORDER.median_ns(&key(kind, Layer::FreshMemcpy, s, n)).map_or(f64::NAN, |f| base / f);
                    println!(
                        "redist-result {} {n} {mib} {:.3} {:.3} {:.3} {fresh:.3}",
                        kind.name(),
                        bytes / base,
                        p,
                        bytes / t
                    );
                }
                println!(
                    "{:<15} {:>5} {:>7} {:>12.2} {:>7} {:>8} {:>8} {:>13} {:>14}",
                    kind.name(),
                    n,
                    mib,
                    bytes / base,
                    ratio(Layer::FreshMemcpy),
                    ratio(Layer::Comm),
                    ratio(Layer::Mesh),
                    paired_ratio.map_or("-".into(), |p| format!("{p:.2}")),
                    redist_gbs
                );
            }
        }
    }
}

criterion_group!(benches, bench_collectives);
criterion_main!(benches);
