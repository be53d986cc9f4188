//! Dispatch overhead: a dynamic DTensor op vs the same op on the local ndarray, 8×8 f32.
//!
//! ```text
//! cargo bench --bench dispatch
//! ```
//!
//! Two layouts, neither of which needs communication, so the difference is pure dispatch
//! (placement checks, sharding rule, output metadata, no autograd tape):
//! - `1rank`: a 1-rank mesh, Replicate: the DTensor's local tensor is the whole 8×8;
//! - `2x2`: rank 0 of a 2×2 mesh, `x: (Shard(0), Replicate)` (local 4×8); matmul takes
//!   `w: (Replicate, Shard(1))` (local 8×4), the column-parallel layout.
//!
//! The baseline runs the same kernel on the same local arrays with ndarray. The table at the
//! end gives both times, the overhead in ns per op (target ≤ 1000 ns) and the ratio.

mod common;

use common::{measuring, Recorder};
use criterion::{criterion_group, criterion_main, Criterion};
use dtensor::prelude::*;
use ndarray::{ArrayD, Ix2};
use std::hint::black_box;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

const N: usize = 8;
const GELU_C: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)
const GELU_A: f64 = 0.044_715;

static RECORDER: LazyLock<Recorder> = LazyLock::new(Recorder::default);

/// The tensors of one layout, built on rank 0 of an in-process world and returned from it
/// (the ops measured here never communicate, so they run on the bench thread).
struct Inputs {
    x: DTensor<f32>,
    y: DTensor<f32>,
    w: DTensor<f32>,
}

fn inputs(mesh_shape: &'static [usize]) -> Inputs {
    let world: usize = mesh_shape.iter().product();
    let out = dtensor::run(world, |ctx| {
        let names: Vec<&str> = ["dp", "tp"][..mesh_shape.len()].to_vec();
        let mesh = ctx.init_device_mesh(mesh_shape, &names)?;
        let global = |k: f32| ArrayD::from_shape_fn(vec![N, N], |ix| (ix[0] * N + ix[1]) as f32 * 0.01 + k);
        let (row, col) = if mesh_shape.len() == 2 {
            (vec![Shard(0), Replicate], vec![Replicate, Shard(1)])
        } else {
            (vec![Replicate], vec![Replicate])
        };
        let x = distribute_tensor(global(0.0), &mesh, &row, None)?;
        let y = distribute_tensor(global(1.0), &mesh, &row, None)?;
        let w = distribute_tensor(global(-0.5), &mesh, &col, None)?;
        Ok(Inputs { x, y, w })
    });
    match out {
        Ok(mut v) => v.swap_remove(0),
        Err(e) => panic!("building the inputs on mesh {mesh_shape:?} failed: {e}"),
    }
}

fn gelu(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + (GELU_C * (x + GELU_A * x * x * x)).tanh())) as f32
}

fn dot(a: &ArrayD<f32>, b: &ArrayD<f32>) -> ArrayD<f32> {
    let a = a.view().into_dimensionality::<Ix2>().expect("2-d");
    let b = b.view().into_dimensionality::<Ix2>().expect("2-d");
    a.dot(&b).into_dyn()
}

type DynOp = fn(&Inputs) -> Result<DTensor<f32>>;
type LocalOp = fn(&ArrayD<f32>, &ArrayD<f32>, &ArrayD<f32>) -> ArrayD<f32>;

/// (name, DTensor op, the same kernel on the local arrays x, y, w).
const OPS: [(&str, DynOp, LocalOp); 4] = [
    ("add", |i| i.x.add(&i.y), |x, y, _| x + y),
    ("mul", |i| i.x.mul(&i.y), |x, y, _| x * y),
    ("gelu", |i| i.x.gelu(), |x, _, _| x.mapv(gelu)),
    ("matmul", |i| i.x.matmul(&i.w), |x, _, w| dot(x, w)),
];

/// Times `iters` calls of `f` and records them under `key`.
fn timed(key: &str, iters: u64, mut f: impl FnMut()) -> Duration {
    let t0 = Instant::now();
    for _ in 0..iters {
        f();
    }
    let t = t0.elapsed();
    RECORDER.add(key, iters, t);
    t
}

fn bench_dispatch(c: &mut Criterion) {
    let layouts: [(&str, &'static [usize]); 2] = [("1rank", &[1]), ("2x2", &[2, 2])];
    let mut group = c.benchmark_group("dispatch");
    group.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    for (layout, shape) in layouts {
        let inp = inputs(shape);
        // The DTensor op must agree with its baseline, or the comparison means nothing.
        for (name, dyn_op, local_op) in OPS {
            let got = dyn_op(&inp).unwrap_or_else(|e| panic!("{name} on {layout}: {e}"));
            let want = local_op(inp.x.local(), inp.y.local(), inp.w.local());
            assert_eq!(got.local(), &want, "{name} on {layout}: DTensor result differs from ndarray");
            let (kd, kl) = (format!("{name}/{layout}/dtensor"), format!("{name}/{layout}/ndarray"));
            group.bench_function(&kd, |b| {
                b.iter_custom(|iters| timed(&kd, iters, || drop(black_box(dyn_op(black_box(&inp))))))
            });
            group.bench_function(&kl, |b| {
                b.iter_custom(|iters| {
                    timed(&kl, iters, || drop(black_box(local_op(inp.x.local(), inp.y.local(), inp.w.local()))))
                })
            });
        }
    }
    group.finish();
    println!();
    println!("Dispatch overhead of dynamic DTensor ops on 8x8 f32 (target: overhead <= 1000 ns/op)");
    if !measuring() {
        println!("(test mode: one iteration each, timings are not measurements; run `cargo bench --bench dispatch`)");
    }
    println!(
        "{:<8} {:<7} {:>12} {:>12} {:>14} {:>7}",
        "op", "layout", "ndarray ns", "DTensor ns", "overhead ns", "ratio"
    );
    for (layout, _) in layouts {
        for (name, _, _) in OPS {
            let (Some(d), Some(l)) = (
                RECORDER.median_ns(&format!("{name}/{layout}/dtensor")),
                RECORDER.median_ns(&format!("{name}/{layout}/ndarray")),
            ) else {
                continue;
            };
            println!("{name:<8} {layout:<7} {l:>12.0} {d:>12.0} {:>14.0} {:>7.2}", d - l, d / l);
        }
    }
}

criterion_group!(benches, bench_dispatch);
criterion_main!(benches);
