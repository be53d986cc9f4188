//! Dispatch overhead: a typed (`Dt`) and a dynamic (`DTensor`) op vs the same op on the local
//! ndarray, 8×8 f32.
//!
//! ```text
//! cargo bench --bench dispatch
//! ```
//!
//! Two layouts, neither of which needs communication, so the difference is pure dispatch
//! (placement checks, sharding rule, output metadata, no autograd tape):
//! - `1rank`: a 1×1 mesh, `(Replicate, Replicate)`: the local tensor is the whole 8×8;
//! - `2x2`: rank 0 of a 2×2 mesh, `x: (Shard(0), Replicate)` (local 4×8); matmul takes
//!   `w: (Replicate, Shard(1))` (local 8×4), the column-parallel layout.
//!
//! The baseline runs the same kernel on the same local arrays with ndarray. The typed op is
//! the same tensors as `Dt<f32, (dp, tp), Layout, 2>`: its layout rule runs in the type
//! system, then it calls the dynamic op and checks the placements it promised. The `user`
//! variant is the same op defined outside the library as a [`CustomOp`] (the kernel is the
//! ndarray baseline's, the rules are the built-in op's), run by `apply_op`: the price of
//! extending the library (target ≤ 1.2× the built-in op). The table at the end gives the
//! times, the overhead in ns per op (target ≤ 1000 ns) and the ratios.

mod common;

use common::{measuring, Recorder};
use criterion::{criterion_group, criterion_main, Criterion};
use dtensor::prelude::*;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dt;
use dtensor::{apply_op, CustomOp, DimRule};
use ndarray::{ArrayD, Ix2};
use std::hint::black_box;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

const N: usize = 8;
const GELU_C: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)
const GELU_A: f64 = 0.044_715;
const OPS: [&str; 4] = ["add", "mul", "gelu", "matmul"];
const LAYOUTS: [&str; 2] = ["1rank", "2x2"];
const VARIANTS: [&str; 4] = ["ndarray", "dtensor", "typed", "user"];

static RECORDER: LazyLock<Recorder> = LazyLock::new(Recorder::default);

/// The tensors of one layout, built on rank 0 of an in-process world and returned from it
/// (the ops measured here never communicate, so they run on the bench thread).
struct Inputs {
    x: DTensor<f32>,
    y: DTensor<f32>,
    w: DTensor<f32>,
}

fn inputs(mesh_shape: [usize; 2], row: [Placement; 2], col: [Placement; 2]) -> Inputs {
    let out = dtensor::run(mesh_shape[0] * mesh_shape[1], |ctx| {
        let mesh = ctx.init_device_mesh(&mesh_shape, &["dp", "tp"])?;
        let global = |k: f32| ArrayD::from_shape_fn(vec![N, N], |ix| (ix[0] * N + ix[1]) as f32 * 0.01 + k);
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

/// One op of one variant, ready to run (captures its inputs).
type Op<'a> = Box<dyn Fn() -> ArrayD<f32> + 'a>;

fn local_ops(i: &Inputs) -> Vec<Op<'_>> {
    let host = "the bench runs on the host";
    let (x, y, w) = (i.x.local_cpu().expect(host), i.y.local_cpu().expect(host), i.w.local_cpu().expect(host));
    vec![Box::new(move || x + y), Box::new(move || x * y), Box::new(move || x.mapv(gelu)), Box::new(move || dot(x, w))]
}

/// The result's local tensor is moved out (no copy) so that every variant returns the same.
fn dyn_ops(i: &Inputs) -> Vec<Op<'_>> {
    let run = |r: Result<DTensor<f32>>| r.expect("dynamic op").into_local().into_host().expect("host data");
    vec![
        Box::new(move || run(i.x.add(&i.y))),
        Box::new(move || run(i.x.mul(&i.y))),
        Box::new(move || run(i.x.gelu())),
        Box::new(move || run(i.x.matmul(&i.w))),
    ]
}

/// A user's op as a bench needs it: the kernel and rules as plain functions.
#[derive(Clone, Copy)]
struct UserOp {
    name: &'static str,
    kernel: fn(&[&ArrayD<f32>]) -> ArrayD<f32>,
    rules: fn(usize) -> Vec<DimRule>,
}

impl CustomOp<f32> for UserOp {
    fn name(&self) -> &'static str {
        self.name
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        Ok(match inputs {
            [a, b] if self.name == "user_matmul" => vec![a[0], b[1]],
            _ => inputs[0].to_vec(),
        })
    }
    fn rules(&self, inputs: &[&[usize]]) -> Vec<DimRule> {
        (self.rules)(inputs.len())
    }
    fn forward(&self, inputs: &[&ArrayD<f32>]) -> Result<ArrayD<f32>> {
        Ok((self.kernel)(inputs))
    }
}

/// The element-wise rules of `n` inputs of rank 2 (the built-in ones, Partials aside).
fn elementwise(n: usize) -> Vec<DimRule> {
    [Replicate, Shard(0), Shard(1)].into_iter().map(|p| DimRule::new(&vec![p; n], p)).collect()
}

/// The built-in matmul's rules of two matrices.
fn matmul_rules(_: usize) -> Vec<DimRule> {
    vec![
        DimRule::new(&[Replicate, Replicate], Replicate),
        DimRule::new(&[Shard(0), Replicate], Shard(0)),
        DimRule::new(&[Replicate, Shard(1)], Shard(1)),
        DimRule::new(&[Shard(1), Shard(0)], Placement::Partial(ReduceOp::Sum)),
    ]
}

fn user_ops(i: &Inputs) -> Vec<Op<'_>> {
    let user = [
        UserOp { name: "user_add", kernel: |l| l[0] + l[1], rules: elementwise },
        UserOp { name: "user_mul", kernel: |l| l[0] * l[1], rules: elementwise },
        UserOp { name: "user_gelu", kernel: |l| l[0].mapv(gelu), rules: elementwise },
        UserOp { name: "user_matmul", kernel: |l| dot(l[0], l[1]), rules: matmul_rules },
    ];
    let run = |r: Result<DTensor<f32>>| r.expect("user op").into_local().into_host().expect("host data");
    let [add, mul, gelu, matmul] = user;
    vec![
        Box::new(move || run(apply_op(&add, &[&i.x, &i.y]))),
        Box::new(move || run(apply_op(&mul, &[&i.x, &i.y]))),
        Box::new(move || run(apply_op(&gelu, &[&i.x]))),
        Box::new(move || run(apply_op(&matmul, &[&i.x, &i.w]))),
    ]
}

/// The typed ops for layouts `Lx` (x, y) and `Lw` (w); one expansion per layout pair, since
/// each pair is a different type.
macro_rules! typed_ops {
    ($i:expr, $Lx:ty, $Lw:ty) => {{
        let x = Dt::<f32, (dp, tp), $Lx, 2>::from_dtensor($i.x.clone()).expect("x has the typed layout");
        let y = Dt::<f32, (dp, tp), $Lx, 2>::from_dtensor($i.y.clone()).expect("y has the typed layout");
        let w = Dt::<f32, (dp, tp), $Lw, 2>::from_dtensor($i.w.clone()).expect("w has the typed layout");
        let (x, y, w) = (std::rc::Rc::new(x), std::rc::Rc::new(y), std::rc::Rc::new(w));
        let (x2, y2, x3, x4) = (x.clone(), y.clone(), x.clone(), x.clone());
        let ops: Vec<Op<'static>> = vec![
            Box::new(move || x.add(&y).expect("typed add").into_dtensor().into_local().into_host().expect("host")),
            Box::new(move || x2.mul(&y2).expect("typed mul").into_dtensor().into_local().into_host().expect("host")),
            Box::new(move || {
                x3.gelu::<$Lx>().expect("typed gelu").into_dtensor().into_local().into_host().expect("host")
            }),
            Box::new(move || {
                x4.matmul(&w).expect("typed matmul").into_dtensor().into_local().into_host().expect("host")
            }),
        ];
        ops
    }};
}

/// Times `iters` calls of `f` and records them under `key`.
fn timed(key: &str, iters: u64, f: &dyn Fn() -> ArrayD<f32>) -> Duration {
    let t0 = Instant::now();
    for _ in 0..iters {
        drop(black_box(f()));
    }
    let t = t0.elapsed();
    RECORDER.add(key, iters, t);
    t
}

fn bench_dispatch(c: &mut Criterion) {
    use dtensor::typed::{Replicate as R, Shard as S};
    let mut group = c.benchmark_group("dispatch");
    group.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    for layout in LAYOUTS {
        let (inp, typed) = if layout == "1rank" {
            let inp = inputs([1, 1], [Replicate, Replicate], [Replicate, Replicate]);
            let typed = typed_ops!(inp, (R, R), (R, R));
            (inp, typed)
        } else {
            let inp = inputs([2, 2], [Shard(0), Replicate], [Replicate, Shard(1)]);
            let typed = typed_ops!(inp, (S<0>, R), (R, S<1>));
            (inp, typed)
        };
        let variants = [local_ops(&inp), dyn_ops(&inp), typed, user_ops(&inp)];
        for (k, name) in OPS.iter().enumerate() {
            // Every variant must compute the same thing, or the comparison means nothing.
            let want = variants[0][k]();
            for (v, ops) in VARIANTS.iter().zip(&variants) {
                let got = ops[k]();
                if *name == "gelu" {
                    // The CPU kernel's vectorised `exp` is within a few ulp of libm's `tanh` form
                    // (the tolerance `storage/vmath.rs` documents), not bit-identical.
                    let close = got.shape() == want.shape()
                        && got.iter().zip(want.iter()).all(|(a, b)| (a - b).abs() <= 1e-6 * (1.0 + b.abs()));
                    assert!(close, "{name} on {layout}: {v} differs from ndarray beyond 1e-6·(1+|y|)");
                } else {
                    assert_eq!(got, want, "{name} on {layout}: {v} differs from ndarray");
                }
                let key = format!("{name}/{layout}/{v}");
                group.bench_function(&key, |b| b.iter_custom(|iters| timed(&key, iters, &*ops[k])));
            }
        }
    }
    group.finish();
    println!();
    println!("Dispatch overhead of DTensor ops on 8x8 f32 vs ndarray on the local shard (target: <= 1000 ns/op)");
    if !measuring() {
        println!("(test mode: one iteration each, timings are not measurements; run `cargo bench --bench dispatch`)");
    }
    println!(
        "{:<8} {:<7} {:>11} {:>12} {:>13} {:>7} {:>10} {:>13} {:>7} {:>9} {:>13} {:>9}",
        "op",
        "layout",
        "ndarray ns",
        "dynamic ns",
        "overhead ns",
        "ratio",
        "typed ns",
        "overhead ns",
        "ratio",
        "user ns",
        "overhead ns",
        "user/dyn"
    );
    for layout in LAYOUTS {
        for name in OPS {
            let t: Vec<Option<f64>> =
                VARIANTS.iter().map(|v| RECORDER.median_ns(&format!("{name}/{layout}/{v}"))).collect();
            let (Some(l), Some(d), Some(ty), Some(u)) = (t[0], t[1], t[2], t[3]) else { continue };
            println!(
                "{name:<8} {layout:<7} {l:>11.0} {d:>12.0} {:>13.0} {:>7.2} {ty:>10.0} {:>13.0} {:>7.2} {u:>9.0} {:>13.0} {:>9.2}",
                d - l,
                d / l,
                ty - l,
                ty / l,
                u - l,
                u / d
            );
        }
    }
}

criterion_group!(benches, bench_dispatch);
criterion_main!(benches);
