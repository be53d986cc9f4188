//! Megatron-style tensor-parallel MLP trained on a 2-D mesh `dp × tp`, checked against a
//! 1-rank run of the same seed.
//!
//! ```text
//! cargo run --example mlp_tp                                  # 2×2 mesh, thread backend
//! cargo run --example mlp_tp -- --mesh 1x4 --hidden 512 --steps 50
//! cargo run --example mlp_tp -- --steps 5                     # what CI runs
//! cargo build --example mlp_tp --features mpi
//! mpirun -np 4 target/debug/examples/mlp_tp --backend mpi      # one process per rank
//! cargo build --release --example mlp_tp --features cuda       # GPUs:
//! target/release/examples/mlp_tp --backend cuda-threads --mesh 2x2   # 4 thread ranks on the GPU(s)
//! target/release/examples/mlp_tp --backend nccl --mesh 1x2     # 2 threads, one per GPU, NCCL
//! torchrun --nproc-per-node 4 --no-python target/release/examples/mlp_tp --backend nccl
//! ```
//!
//! Each block is `x + gelu(x @ w1) @ w2`, declared with `#[distribute(mesh = "dp,tp")]` (see
//! `model.rs`): `w1: [dim, hidden]` column-parallel `(Replicate, Shard(1))`, `w2: [hidden,
//! dim]` row-parallel `(Replicate, Shard(0))`, the batch `(Shard(0), Replicate)`. The hidden
//! activation never leaves its rank, so a training step needs one all-reduce over `tp` per
//! block in the forward (the Partial output of `@ w2`), one over `tp` per block in the
//! backward (the input gradient; not for the first block, whose input needs none), and one
//! all-reduce over `dp` per weight gradient. The data are synthetic: inputs from the
//! placement-invariant `randn`, targets from a fixed random teacher network of the same shape,
//! so the loss really goes down. At the end the loss curve and every weight are compared with
//! a 1-rank run of the same seed.
//!
//! Exit status: 0 on PASS, 1 on FAIL, 2 on a bad argument or runtime error; a backend this
//! build or machine cannot run (no `cuda` feature, no GPU, too few GPUs) prints
//! `SKIP: <reason>` and exits 0.

#[path = "mlp_tp/model.rs"]
mod model;
#[path = "common/report.rs"]
mod report;

use clap::Parser;
use dtensor::prelude::*;
use dtensor::{visualize_sharding, CollectiveKind, CommDebugMode, Launch, RankCtx};
use indicatif::{ProgressBar, ProgressStyle};
use model::{Mlp, MlpConfig, Trainer};
use report::{check_lr, comm_line, exit_code, parse_backend, parse_mesh};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser, Debug, Clone)]
#[command(about = "Tensor-parallel MLP on a dp×tp mesh, checked against a 1-rank run")]
struct Args {
    /// Mesh shape `DPxTP` (dp: data parallel, tp: tensor parallel).
    #[arg(long, default_value = "2x2", value_parser = parse_mesh)]
    mesh: (usize, usize),
    /// Samples per step (global batch, sharded over dp).
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Model width (input and output features of each block).
    #[arg(long, default_value_t = 64)]
    dim: usize,
    /// Hidden width of each MLP block (sharded over tp).
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Number of MLP blocks.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Training steps.
    #[arg(long, default_value_t = 40)]
    steps: usize,
    /// SGD learning rate.
    #[arg(long, default_value_t = 1.0)]
    lr: f64,
    /// Seed of the student's initialisation and of the data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Launch mode: `threads` (in-process ranks), `mpi` (build with `--features mpi`, start
    /// with `mpirun -np DP*TP`), `nccl` (build with `--features cuda`; one GPU per rank, under
    /// torchrun / mpirun or as threads) or `cuda-threads` (thread ranks sharing the GPUs).
    #[arg(long, default_value = "threads", value_parser = parse_backend)]
    backend: Launch,
    /// Largest relative difference to the 1-rank run that still passes.
    #[arg(long, default_value_t = 1e-4)]
    tol: f64,
    /// Show a progress bar instead of one line per step.
    #[arg(long)]
    progress: bool,
    /// Overlap the dp gradient all-reduces with the backward (`BackwardOptions::
    /// overlap_grad_reduce`), in buckets of this many bytes (0: one all-reduce per gradient).
    #[arg(long, value_name = "BYTES")]
    overlap_bucket: Option<usize>,
}

/// What one rank's training run returns.
struct Outcome {
    losses: Vec<f64>,
    /// Every parameter as a full (global) tensor, in `named_parameters` order.
    weights: Vec<(String, ndarray::ArrayD<f32>)>,
    seconds: f64,
    /// The first step whose collectives differ from the Megatron count, described.
    unexpected_comm: Option<String>,
    /// The collectives a step should make on this rank.
    expected_comm: BTreeMap<(CollectiveKind, String), usize>,
}

/// Collectives of one training step of `layers` blocks: (kind, mesh dim) → count. Forward:
/// one tp all-reduce per block; backward: one per block but the first; one dp all-reduce per
/// weight gradient (two weights per block), or per bucket with `--overlap-bucket`. A
/// redistribution over a mesh dim of size 1 is local (no collective, as in PyTorch); the
/// buckets of `--overlap-bucket` are reduced over dp whatever its size.
fn expected_comm(layers: usize, tp: usize, dp_all_reduces: usize) -> BTreeMap<(CollectiveKind, String), usize> {
    [
        ((CollectiveKind::AllReduce, "tp".to_string()), if tp > 1 { 2 * layers - 1 } else { 0 }),
        ((CollectiveKind::AllReduce, "dp".to_string()), dp_all_reduces),
    ]
    .into_iter()
    .filter(|&(_, n)| n > 0)
    .collect()
}

/// Buckets of `bucket` bytes that `grads` gradients of `bytes` (nominal) bytes each fill, in
/// order: a bucket is started once it holds at least `bucket` bytes, or before an append would
/// take it past 1 GiB, the last one when the pass ends.
fn buckets(grads: usize, bytes: usize, bucket: usize) -> usize {
    let per_bucket = bucket.div_ceil(bytes).min((1 << 30) / bytes).max(1);
    grads.div_ceil(per_bucket)
}

/// Trains on this rank's part of a `dp × tp` mesh. `log`: this rank prints.
fn train(ctx: &RankCtx, args: &Args, (dp, tp): (usize, usize), log: Log) -> Result<Outcome> {
    let mesh = ctx.init_device_mesh(&[dp, tp], &["dp", "tp"])?;
    let cfg = MlpConfig {
        batch: args.batch,
        dim: args.dim,
        hidden: args.hidden,
        layers: args.layers,
        lr: args.lr as f32,
        seed: args.seed,
    };
    let mut trainer = Trainer::new(&mesh, cfg)?.overlap_grad_reduce(args.overlap_bucket);
    // Buckets count the padded shard size of each weight gradient (w1's and w2's are equal:
    // `dim × ⌈hidden / tp⌉` f32), the same on every rank even when hidden is uneven over tp.
    let grad_bytes = (args.dim * args.hidden.div_ceil(tp) * 4).max(1);
    let dp_all_reduces = match args.overlap_bucket {
        None if dp == 1 => 0,
        None => 2 * args.layers,
        Some(b) => buckets(2 * args.layers, grad_bytes, b),
    };
    let expected = expected_comm(args.layers, tp, dp_all_reduces);
    if log.layouts {
        print_layouts(&trainer.student, &mesh)?;
    }
    let bar = log.bar.then(|| {
        let bar = ProgressBar::new(args.steps as u64);
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(log.label);
        bar
    });
    let mut losses = Vec::with_capacity(args.steps);
    let mut unexpected_comm = None;
    let start = Instant::now();
    for step in 0..args.steps {
        // The teacher's forward is data generation: its collectives are not counted.
        let (x, y) = trainer.batch()?;
        let comm = CommDebugMode::new();
        let loss = comm.scope(|| trainer.train_step(&x, &y))?;
        let l = loss.full_tensor()?.iter().next().copied().unwrap_or(f32::NAN) as f64;
        losses.push(l);
        let counts: BTreeMap<_, usize> = comm.by_kind().into_iter().map(|(k, (n, _))| (k, n)).collect();
        if unexpected_comm.is_none() && counts != expected {
            unexpected_comm = Some(format!("step {}: {}", step + 1, comm_line(&comm)));
        }
        if let Some(bar) = &bar {
            bar.set_message(format!("loss {l:.6}"));
            bar.inc(1);
        } else if log.steps {
            println!("step {:>4}/{}  loss {l:.6}  collectives: {}", step + 1, args.steps, comm_line(&comm));
        }
    }
    if let Some(bar) = bar {
        bar.finish();
    }
    let seconds = start.elapsed().as_secs_f64();
    let weights = trainer
        .student
        .named_parameters()
        .into_iter()
        .map(|(name, p)| Ok((name, p.full_tensor()?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(Outcome { losses, weights, seconds, unexpected_comm, expected_comm: expected })
}

/// What a rank prints while training.
#[derive(Clone, Copy)]
struct Log {
    label: &'static str,
    layouts: bool,
    steps: bool,
    bar: bool,
}

const QUIET: Log = Log { label: "", layouts: false, steps: false, bar: false };

/// Which rank holds which block of every parameter (computed from the layout, no comm).
fn print_layouts(model: &Mlp<f32>, mesh: &DeviceMesh) -> Result<()> {
    println!("parameter layouts on {mesh}:");
    for (name, p) in model.named_parameters() {
        println!("{name}:");
        print!("{}", visualize_sharding(p)?);
    }
    Ok(())
}

/// Largest relative difference: per tensor `max|a-b| / max|b|`, per loss `|a-b| / |b|`.
fn compare(run: &Outcome, reference: &Outcome) -> (f64, String) {
    let mut worst = (0.0f64, String::from("-"));
    let mut note = |d: f64, what: String| {
        // NaN counts as the worst difference.
        if d.is_nan() || d > worst.0 {
            worst = (d, what);
        }
    };
    if run.losses.len() != reference.losses.len() {
        note(f64::INFINITY, "number of steps".into());
    }
    for (i, (a, b)) in run.losses.iter().zip(&reference.losses).enumerate() {
        note((a - b).abs() / b.abs().max(f64::MIN_POSITIVE), format!("loss at step {}", i + 1));
    }
    if run.weights.len() != reference.weights.len() {
        note(f64::INFINITY, "number of parameters".into());
    }
    for ((name, a), (_, b)) in run.weights.iter().zip(&reference.weights) {
        if a.shape() != b.shape() {
            note(f64::INFINITY, format!("shape of {name}"));
            continue;
        }
        let scale = b.iter().fold(0.0f64, |m, v| m.max((*v as f64).abs())).max(f64::MIN_POSITIVE);
        let diff = a.iter().zip(b.iter()).fold(0.0f64, |m, (x, y)| m.max((*x as f64 - *y as f64).abs()));
        note(diff / scale, name.clone());
    }
    worst
}

fn check_args(args: &Args) -> Result<()> {
    let bad = |reason: String| Err(Error::InvalidArgument { context: "mlp_tp".into(), reason });
    if args.batch == 0 || args.dim == 0 || args.hidden == 0 || args.layers == 0 || args.steps == 0 {
        return bad("--batch, --dim, --hidden, --layers and --steps must be positive".into());
    }
    check_lr("mlp_tp", args.lr)
}

fn main() -> ExitCode {
    let args = Args::parse();
    exit_code("mlp_tp", real_main(&args))
}

fn real_main(args: &Args) -> Result<bool> {
    check_args(args)?;
    let (dp, tp) = args.mesh;
    let log = Log { label: "mesh", layouts: true, steps: !args.progress, bar: args.progress };
    // Threads: every rank's result comes back. MPI: each process gets its own rank's; the
    // process of rank 0 checks and reports, the others only train.
    let outs = dtensor::launch(args.backend, dp * tp, |ctx| {
        let mine = if ctx.rank() == 0 {
            println!(
                "mlp_tp: mesh dp={dp} × tp={tp} ({} backend), {} block(s) {}→{}→{}, batch {}, {} steps, lr {}, seed {}{}",
                args.backend,
                args.layers,
                args.dim,
                args.hidden,
                args.dim,
                args.batch,
                args.steps,
                args.lr,
                args.seed,
                args.overlap_bucket.map_or(String::new(), |b| format!(", dp gradients overlapped in {b}-byte buckets"))
            );
            log
        } else {
            QUIET
        };
        Ok((ctx.rank(), train(&ctx, args, (dp, tp), mine)?))
    })?;
    let Some((_, run)) = outs.into_iter().find(|(rank, _)| *rank == 0) else { return Ok(true) };
    // The reference: the same program on one rank (no communication at all).
    println!("reference: the same seed on 1 rank");
    let reference =
        dtensor::run(1, |ctx| train(&ctx, args, (1, 1), Log { label: "1 rank", bar: args.progress, ..QUIET }))?;
    let Some(reference) = reference.into_iter().next() else { return Ok(false) };
    let (first, last) = (run.losses[0], run.losses[run.losses.len() - 1]);
    let (diff, at) = compare(&run, &reference);
    println!(
        "loss {first:.6} -> {last:.6} ({:.1}x lower) in {:.2} s on the mesh, {:.2} s on 1 rank",
        first / last,
        run.seconds,
        reference.seconds
    );
    // One step cannot show learning; from two on the loss must go down.
    let learned = run.losses.len() < 2 || last < first;
    let expected: Vec<String> = run.expected_comm.iter().map(|((k, d), n)| format!("{k}@{d} {n}×")).collect();
    let which = if args.overlap_bucket.is_some() { "Megatron, dp gradients bucketed" } else { "Megatron" };
    match &run.unexpected_comm {
        None => println!("collectives per step as in {which}: {}", expected.join(", ")),
        Some(got) => println!("collectives differ from {which}'s {} at {got}", expected.join(", ")),
    }
    let pass = diff <= args.tol && learned && run.unexpected_comm.is_none();
    println!(
        "max relative difference to the 1-rank run: {diff:.3e} (at {at}; tolerance {:.0e}){}",
        args.tol,
        if learned { "" } else { "; the loss did not go down" }
    );
    println!("{}", if pass { "PASS" } else { "FAIL" });
    Ok(pass)
}
