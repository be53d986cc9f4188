//! Single-thread host GEMM: the candidate kernels against each other in one run, in GFLOP/s,
//! with the ratio to ndarray's `general_mat_mul` (matrixmultiply) measured in the same run.
//!
//! ```text
//! cargo bench --bench gemm
//! DTENSOR_GEMM_SIZES=256,512,1024,2048 DTENSOR_GEMM_ROUNDS=9 cargo bench --bench gemm
//! ```
//!
//! Rows: square `n × n @ n × n` per size, and a batched `16 × [256 × 256] @ 16 × [256 × 256]`.
//! Candidates: `ndarray` (matrixmultiply, into a preallocated output), `gemm` (the `gemm` crate,
//! no threads, into a preallocated output) and `dtensor` (`Storage::matmul`, the kernel the
//! runtime uses, allocating its output as every op does). Each round times every candidate once,
//! interleaved, so that load from other processes hits them alike; the table shows the median
//! over rounds and the spread (min–max) of the `dtensor` column. Every row also prints a
//! machine-readable `gemm-result` line, which `scripts/compare_torch.sh` reads. Under
//! `cargo test --benches` one small size runs once and the candidates are checked against each
//! other.

mod common;

use common::{env_list, measuring};
use dtensor::ndarray::{linalg::general_mat_mul, Array3, ArrayD, Axis};
use dtensor::storage::Storage;
use dtensor::Element;
use dtensor::Target;
use std::time::Instant;

/// Batch of the batched row.
const BATCH: usize = 16;
/// Matrix side of the batched row.
const BATCH_SIDE: usize = 256;
/// Seconds each candidate runs per round.
const ROUND_SECS: f64 = 0.15;

type Kernel<T> = fn(&Array3<T>, &Array3<T>, &mut Array3<T>);

fn ndarray_kernel<T: Element>(a: &Array3<T>, b: &Array3<T>, c: &mut Array3<T>) {
    for ((a, b), mut c) in a.outer_iter().zip(b.outer_iter()).zip(c.outer_iter_mut()) {
        general_mat_mul(T::one(), &a, &b, T::zero(), &mut c);
    }
}

fn gemm_kernel<T: Element>(a: &Array3<T>, b: &Array3<T>, c: &mut Array3<T>) {
    let (m, k, n) = (a.dim().1, a.dim().2, b.dim().2);
    for ((a, b), mut c) in a.outer_iter().zip(b.outer_iter()).zip(c.outer_iter_mut()) {
        let (sa, sb, sc) = (a.strides().to_vec(), b.strides().to_vec(), c.strides().to_vec());
        // SAFETY: the pointers and strides describe the live views `a`, `b`, `c` of the shapes
        // `m × k`, `k × n`, `m × n` given; `c` is exclusively borrowed.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                sc[1],
                sc[0],
                false,
                a.as_ptr(),
                sa[1],
                sa[0],
                b.as_ptr(),
                sb[1],
                sb[0],
                T::zero(),
                T::one(),
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }
}

fn random<T: Element>(shape: (usize, usize, usize), seed: u64) -> Array3<T> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    Array3::from_shape_fn(shape, |_| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        T::from_f64(((state >> 33) as f64 / (1u64 << 31) as f64) - 0.5).unwrap_or_else(T::zero)
    })
}

/// `(batch, m, k, n)` rows of the table.
fn rows(measure: bool) -> Vec<(usize, usize, usize, usize)> {
    if !measure {
        return vec![(1, 33, 17, 29), (3, 8, 5, 7)];
    }
    let mut rows: Vec<_> =
        env_list("DTENSOR_GEMM_SIZES", &[256, 512, 1024]).into_iter().map(|s| (1, s, s, s)).collect();
    rows.push((BATCH, BATCH_SIDE, BATCH_SIDE, BATCH_SIDE));
    rows
}

/// Seconds per call of `f`, over as many calls as fit in [`ROUND_SECS`] (at least one).
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let t0 = Instant::now();
    let mut calls = 0u32;
    while calls == 0 || t0.elapsed().as_secs_f64() < ROUND_SECS {
        f();
        calls += 1;
    }
    t0.elapsed().as_secs_f64() / f64::from(calls)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn bench_dtype<T: Element>(dtype: &str, measure: bool, rounds: usize) {
    let kernels: [(&str, Kernel<T>); 2] = [("ndarray", ndarray_kernel::<T>), ("gemm", gemm_kernel::<T>)];
    for (batch, m, k, n) in rows(measure) {
        let a = random::<T>((batch, m, k), 1);
        let b = random::<T>((batch, k, n), 2);
        let sa = Storage::from_host(a.clone().into_dyn(), &Target::Cpu).expect("host storage");
        let sb = Storage::from_host(b.clone().into_dyn(), &Target::Cpu).expect("host storage");
        let mut outs: Vec<Array3<T>> = kernels.iter().map(|_| Array3::zeros((batch, m, n))).collect();
        let flop = 2.0 * (batch * m * k * n) as f64;
        let mut gflops = vec![Vec::new(); kernels.len() + 1];
        for _ in 0..rounds {
            for (i, (_, kernel)) in kernels.iter().enumerate() {
                let out = &mut outs[i];
                gflops[i].push(flop / time(|| kernel(&a, &b, out)) / 1e9);
            }
            gflops[kernels.len()].push(flop / time(|| drop(sa.matmul(&sb).expect("matmul"))) / 1e9);
        }
        let ours = sa.matmul(&sb).expect("matmul").into_host().expect("host");
        check(dtype, &outs, ours, k);
        let spread = {
            let d = &gflops[kernels.len()];
            (d.iter().copied().fold(f64::INFINITY, f64::min), d.iter().copied().fold(0.0, f64::max))
        };
        let med: Vec<f64> = gflops.iter_mut().map(|v| median(v)).collect();
        let shape = if batch == 1 { format!("{m}x{k}x{n}") } else { format!("{batch}x[{m}x{k}x{n}]") };
        println!(
            "{dtype:<5} {shape:>17} {:>9.1} {:>9.1} {:>6.2} {:>9.1} {:>6.2}   {:.1}-{:.1}",
            med[0],
            med[1],
            med[1] / med[0],
            med[2],
            med[2] / med[0],
            spread.0,
            spread.1
        );
        for (name, g) in kernels.iter().map(|(n, _)| *n).chain(["dtensor"]).zip(&med) {
            println!("gemm-result {dtype} {batch} {m} {k} {n} {name} {g:.2}");
        }
    }
}

/// Every candidate computed the same product (up to summation order).
fn check<T: Element>(dtype: &str, outs: &[Array3<T>], ours: ArrayD<T>, k: usize) {
    let tol = T::epsilon().to_f64().unwrap_or(1e-6) * 4.0 * k as f64;
    let reference = ours.index_axis(Axis(0), 0).to_owned();
    for out in outs {
        let max_diff = out
            .index_axis(Axis(0), 0)
            .iter()
            .zip(reference.iter())
            .map(|(x, y)| (*x - *y).abs().to_f64().unwrap_or(f64::INFINITY))
            .fold(0.0, f64::max);
        assert!(max_diff <= tol, "{dtype}: candidates disagree by {max_diff} (tolerance {tol})");
    }
}

fn main() {
    let measure = measuring();
    let rounds = if measure { env_list("DTENSOR_GEMM_ROUNDS", &[5])[0].max(1) } else { 1 };
    println!("single-thread GEMM, GFLOP/s, median of {rounds} rounds; ratios to ndarray (matrixmultiply)");
    println!(
        "{:<5} {:>17} {:>9} {:>9} {:>6} {:>9} {:>6}   dtensor min-max",
        "dtype", "m x k x n", "ndarray", "gemm", "ratio", "dtensor", "ratio"
    );
    bench_dtype::<f32>("f32", measure, rounds);
    bench_dtype::<f64>("f64", measure, rounds);
}
