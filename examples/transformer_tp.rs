//! A GPT-style decoder written with `#[distribute]` and typed ops only, trained on a 2-D mesh
//! `dp × tp` and checked against a 1-rank run of the same seed and data.
//!
//! ```text
//! cargo run --example transformer_tp                        # 2×2 mesh, thread backend
//! cargo run --example transformer_tp -- --mesh 1x4 --steps 10
//! cargo run --example transformer_tp -- --export-hf /tmp/gpt2   # + a GPT-2 checkpoint for transformers
//! python3 scripts/check_hf_export.py /tmp/gpt2                 # transformers' logits against ours
//! cargo run --example transformer_tp -- --steps 3 --save-state /tmp/ck       # train 3 steps on 2×2, save
//! cargo run --example transformer_tp -- --steps 3 --resume /tmp/ck --mesh 1x4   # 3 more on 1×4: vs 6 on 1 rank
//! cargo run --example transformer_tp -- --fsdp                 # FSDP over dp × TP over tp
//! cargo run --example transformer_tp -- --fsdp --mesh 4x1      # FSDP only
//! ```
//!
//! The model (`transformer_tp/model.rs`): vocab-parallel token embedding → blocks of
//! [layer_norm → causal self-attention with the heads sharded on tp → residual → layer_norm
//! → MLP → residual] → layer_norm → column-parallel LM head → loss-parallel
//! `cross_entropy`, the batch sharded on dp. The data are next-token prediction on sequences
//! of a fixed rule (`t[i+1] = (5·t[i] + 3) mod vocab`) from random starts, so the loss goes
//! down. Everything is f64, so the mesh and the 1-rank run agree to rounding.
//!
//! Escapes to the dynamic layer: none in the model or the training step. At the edges only:
//! `Dt::distribute` of the host token ids (the input), `full_tensor` of the loss (the
//! printout) and of the parameters (the comparison with 1 rank). To count the escapes (0):
//! `cat examples/transformer_tp.rs examples/transformer_tp/model.rs | grep -vE '^\s*//' |
//! grep -cE 'as_dtensor|try_from|from_dtensor|into_dtensor|implicit'`.
//!
//! Exit status: 0 on PASS, 1 on FAIL, 2 on a bad argument or runtime error; a backend this
//! build or machine cannot run (no `cuda` feature, no GPU, too few GPUs) prints
//! `SKIP: <reason>` and exits 0.

#[path = "transformer_tp/export_hf.rs"]
mod export_hf;
#[path = "common/maybe_sharded.rs"]
mod maybe_sharded;
#[path = "transformer_tp/model.rs"]
mod model;
#[path = "common/report.rs"]
mod report;

use clap::Parser;
use dtensor::checkpoint::{self, Checkpointer, Restore, TrainState};
use dtensor::fsdp::{fully_shard, FullyShardOptions};
use dtensor::optim::{AdamW, OptimizerState, Sgd};
use dtensor::prelude::*;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dt;
use dtensor::{manual_seed, CollectiveKind, CommDebugMode, Launch, RankCtx};
use maybe_sharded::MaybeSharded;
use model::{Gpt, GptConfig};
use ndarray::ArrayD;
use report::{check_lr, comm_line, exit_code, parse_backend, parse_mesh};
use std::collections::BTreeMap;
use std::process::ExitCode;

#[derive(Parser, Debug, Clone)]
#[command(about = "GPT-style transformer on a dp×tp mesh with the #[distribute] DSL, checked against 1 rank")]
struct Args {
    /// Mesh shape `DPxTP` (dp: data parallel, tp: tensor parallel).
    #[arg(long, default_value = "2x2", value_parser = parse_mesh)]
    mesh: (usize, usize),
    /// Vocabulary size (sharded over tp).
    #[arg(long, default_value_t = 32)]
    vocab: usize,
    /// Model width.
    #[arg(long, default_value_t = 16)]
    width: usize,
    /// Attention heads (sharded over tp).
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 8)]
    seq: usize,
    /// Sequences per step (sharded over dp).
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Training steps.
    #[arg(long, default_value_t = 6)]
    steps: usize,
    /// Optimizer: `adamw` (PyTorch's defaults: betas 0.9/0.999, eps 1e-8, weight decay 0.01) or
    /// `sgd` (plain).
    #[arg(long, value_enum, default_value_t = OptimKind::Adamw)]
    optim: OptimKind,
    /// Learning rate [default: 0.01 for AdamW, 0.5 for SGD].
    #[arg(long)]
    lr: Option<f64>,
    /// Seed of the initialisation and of the data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Launch mode: `threads` (in-process ranks), `mpi` (build with `--features mpi`, start
    /// with `mpirun -np DP*TP`), `nccl` (build with `--features cuda`; one GPU per rank, under
    /// torchrun / mpirun or as threads) or `cuda-threads` (thread ranks sharing the GPUs).
    #[arg(long, default_value = "threads", value_parser = parse_backend)]
    backend: Launch,
    /// Largest relative difference to the 1-rank run that still passes (f64 throughout).
    #[arg(long, default_value_t = 1e-9)]
    tol: f64,
    /// After training, write the model as a Hugging Face GPT-2 checkpoint in DIR (with
    /// `config.json` and this run's logits on one batch; `scripts/check_hf_export.py DIR`
    /// compares them with transformers').
    #[arg(long, value_name = "DIR")]
    export_hf: Option<std::path::PathBuf>,
    /// After training, save the whole training state (model, optimizer, generator) into the
    /// checkpoint root DIR.
    #[arg(long, value_name = "DIR")]
    save_state: Option<std::path::PathBuf>,
    /// Resume from the committed training state in the checkpoint root DIR (saved on any mesh)
    /// and train `--steps` more; the 1-rank reference trains all the steps from scratch.
    #[arg(long, value_name = "DIR")]
    resume: Option<std::path::PathBuf>,
    /// Fully shard the model over dp (FSDP2, `dtensor::fsdp::fully_shard`): parameters,
    /// gradients and optimizer states rest sharded over dp, are all-gathered for the forward
    /// and reduce-scattered in the backward; tp stays tensor parallel.
    #[arg(long)]
    fsdp: bool,
}

/// Where a run's training state comes from and goes to.
#[derive(Clone, Copy, Default)]
struct StateDirs<'a> {
    resume: Option<&'a std::path::Path>,
    save: Option<&'a std::path::Path>,
    export_hf: Option<&'a std::path::Path>,
}

/// The optimizer `--optim` names.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum OptimKind {
    Adamw,
    Sgd,
}

impl OptimKind {
    fn name(self) -> &'static str {
        match self {
            OptimKind::Adamw => "adamw",
            OptimKind::Sgd => "sgd",
        }
    }
    fn default_lr(self) -> f64 {
        match self {
            OptimKind::Adamw => 0.01,
            OptimKind::Sgd => 0.5,
        }
    }
}

/// One optimizer of either kind: both update every parameter locally (no collective), so the
/// expected collective counts do not depend on the choice.
enum Optimizer {
    AdamW(AdamW<f64>),
    Sgd(Sgd<f64>),
}

impl Optimizer {
    fn new(kind: OptimKind, lr: f64) -> Self {
        match kind {
            OptimKind::Adamw => Optimizer::AdamW(AdamW::new(lr)),
            OptimKind::Sgd => Optimizer::Sgd(Sgd::new(lr)),
        }
    }
    /// The state a checkpoint saves.
    fn state(&self) -> &dyn OptimizerState<f64> {
        match self {
            Optimizer::AdamW(o) => o,
            Optimizer::Sgd(o) => o,
        }
    }
    fn state_mut(&mut self) -> &mut dyn OptimizerState<f64> {
        match self {
            Optimizer::AdamW(o) => o,
            Optimizer::Sgd(o) => o,
        }
    }
    fn step(&mut self, model: &mut dyn Module<f64>) -> Result<()> {
        match self {
            Optimizer::AdamW(o) => o.step(model),
            Optimizer::Sgd(o) => o.step(model),
        }
    }
}

type Model = MaybeSharded<f64, Gpt>;

fn new_model(cfg: &GptConfig, mesh: &DeviceMesh, fsdp: bool) -> Result<Model> {
    let gpt = Gpt::new(cfg, mesh)?;
    Ok(if fsdp { Model::Sharded(fully_shard(gpt, mesh, &FullyShardOptions::on("dp"))?) } else { Model::Plain(gpt) })
}

/// Seed offset of the data, so that data and weights differ.
const DATA_SEED: u64 = 0xda7a;

/// What one rank's training run returns.
struct Outcome {
    losses: Vec<f64>,
    /// Every parameter as a full (global) tensor, in `named_parameters` order.
    weights: Vec<(String, ArrayD<f64>)>,
    /// Each step's collectives on this rank: (kind, mesh dim) → count.
    comm: Vec<BTreeMap<(CollectiveKind, String), usize>>,
    /// The first step's collectives, as a line.
    comm_line: String,
}

/// Collectives of one training step (forward, backward, optimizer update) of `layers` blocks, as
/// Megatron-LM does them.
///
/// Forward, over tp: 1 for the vocab-parallel embedding (its Partial output), 2 per block
/// (the row-parallel attention out-projection and MLP output), 2 for the loss-parallel
/// `log_softmax` over the vocab-sharded logits (the row max and the row sum of exps).
///
/// Backward, over tp: the input gradient of every column-parallel layer arrives Partial and
/// is all-reduced once, where it reaches the `layer_norm` before it (q, k and v summed
/// first): 2 per block and 1 for the LM head. Plus 1 in `log_softmax`'s backward (the row sum
/// of the incoming gradient over the sharded vocabulary; Megatron's fused vocab-parallel
/// loss computes `softmax - onehot` locally instead). The embedding needs none: its table is
/// sharded like its lookup, and the gradient reaching it is already replicated.
///
/// Over dp: one all-reduce per parameter gradient (10 per block, 4 outside the blocks).
///
/// A mesh dim of size 1 communicates nothing (its redistributions are local, as in PyTorch).
///
/// Under `--fsdp` the dp all-reduces become, per parameter, one all-gather over dp in the
/// forward and one reduce-scatter over dp in the backward (every parameter has a tensor dim
/// tp does not shard, so every one is sharded over dp).
fn expected_comm(layers: usize, (dp, tp): (usize, usize), fsdp: bool) -> BTreeMap<(CollectiveKind, String), usize> {
    let tp_forward = 1 + 2 * layers + 2;
    let tp_backward = (2 * layers + 1) + 1;
    let params = 10 * layers + 4;
    let dp_n = |on: bool| if dp > 1 && on { params } else { 0 };
    [
        ((CollectiveKind::AllReduce, "tp".to_string()), if tp > 1 { tp_forward + tp_backward } else { 0 }),
        ((CollectiveKind::AllReduce, "dp".to_string()), dp_n(!fsdp)),
        ((CollectiveKind::AllGather, "dp".to_string()), dp_n(fsdp)),
        ((CollectiveKind::ReduceScatter, "dp".to_string()), dp_n(fsdp)),
    ]
    .into_iter()
    .filter(|&(_, n)| n > 0)
    .collect()
}

type Tokens = Dt<i64, (dp, tp), (Shard<0>, Replicate), 2>;

/// Trains on this rank's part of a `dp × tp` mesh.
fn train(
    ctx: &RankCtx,
    cfg: &GptConfig,
    optim: OptimKind,
    steps: usize,
    (dpn, tpn): (usize, usize),
    fsdp: bool,
    dirs: StateDirs<'_>,
) -> Result<Outcome> {
    let mesh = ctx.init_device_mesh(&[dpn, tpn], &["dp", "tp"])?;
    manual_seed(cfg.seed);
    let mut model = new_model(cfg, &mesh, fsdp)?;
    let mut opt = Optimizer::new(optim, cfg.lr);
    manual_seed(cfg.seed.wrapping_add(DATA_SEED));
    // Resuming restores the weights, AdamW's moments and step, and the generator (the data).
    let done = match dirs.resume {
        None => 0,
        Some(dir) => {
            let r = Checkpointer::new(dir).load(Restore::new(model.module_mut()).optimizer(opt.state_mut()))?;
            r.ok_or_else(|| Error::InvalidArgument {
                context: "--resume".into(),
                reason: format!("{} holds no committed training state", dir.display()),
            })?
            .step
        }
    };
    let mut out = Outcome { losses: Vec::new(), weights: Vec::new(), comm: Vec::new(), comm_line: String::new() };
    for step in 0..steps {
        // Input: host ids scattered over dp (the edge; not a training collective).
        let (ids, targets) = model::batch_data(cfg)?;
        let (ids, targets): (Tokens, Tokens) = (Dt::distribute(&ids, &mesh)?, Dt::distribute(&targets, &mesh)?);
        let comm = CommDebugMode::new();
        let loss = comm.scope(|| -> Result<_> {
            model.module().zero_grad();
            let loss = model.run(|m| model::loss(m, &ids, &targets, cfg.heads))?;
            loss.backward()?;
            opt.step(model.module_mut())?;
            Ok(loss)
        })?;
        out.comm.push(
            comm.by_kind()
                .into_iter()
                .filter(|((k, _), _)| *k != CollectiveKind::Barrier)
                .map(|(k, (n, _))| (k, n))
                .collect(),
        );
        if step == 0 {
            out.comm_line = comm_line(&comm);
        }
        // Output: the loss, summed over the mesh for the printout.
        out.losses.push(loss.full_tensor()?.iter().next().copied().unwrap_or(f64::NAN));
    }
    out.weights = model
        .module()
        .named_parameters()
        .into_iter()
        .map(|(name, p)| Ok((name, p.full_tensor()?)))
        .collect::<Result<_>>()?;
    if let Some(dir) = dirs.save {
        Checkpointer::new(dir).save(TrainState::new(model.module(), done + steps as u64).optimizer(opt.state()))?;
    }
    if let Some(dir) = dirs.export_hf {
        let (ids, _) = model::batch_data(cfg)?;
        let ids_dt: Tokens = Dt::distribute(&ids, &mesh)?;
        model.run(|m| {
            let logits = model::logits(m, &ids_dt, cfg.heads)?.full_tensor()?;
            export_hf::export(m, cfg, &mesh, dir, &ids, &logits)
        })?;
    }
    Ok(out)
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
    if run.losses.len() != reference.losses.len() || run.weights.len() != reference.weights.len() {
        note(f64::INFINITY, "number of steps or parameters".into());
    }
    for (i, (a, b)) in run.losses.iter().zip(&reference.losses).enumerate() {
        note((a - b).abs() / b.abs().max(f64::MIN_POSITIVE), format!("loss at step {}", i + 1));
    }
    for ((name, a), (_, b)) in run.weights.iter().zip(&reference.weights) {
        if a.shape() != b.shape() {
            note(f64::INFINITY, format!("shape of {name}"));
            continue;
        }
        let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
        let diff = a.iter().zip(b.iter()).fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
        note(diff / scale, name.clone());
    }
    worst
}

fn check_args(args: &Args) -> Result<()> {
    let bad = |reason: String| Err(Error::InvalidArgument { context: "transformer_tp".into(), reason });
    let sizes = [args.vocab, args.width, args.heads, args.seq, args.batch, args.layers, args.steps];
    if sizes.contains(&0) {
        return bad("--vocab, --width, --heads, --seq, --batch, --layers and --steps must be positive".into());
    }
    if !args.width.is_multiple_of(args.heads) {
        return bad(format!("--width {} must be a multiple of --heads {}", args.width, args.heads));
    }
    if !args.heads.is_multiple_of(args.mesh.1) {
        // The merged heads stay sharded only when every tp rank holds whole heads.
        return bad(format!("--heads {} must be a multiple of tp = {}", args.heads, args.mesh.1));
    }
    args.lr.map_or(Ok(()), |lr| check_lr("transformer_tp", lr))
}

fn main() -> ExitCode {
    let args = Args::parse();
    exit_code("transformer_tp", real_main(&args))
}

fn real_main(args: &Args) -> Result<bool> {
    check_args(args)?;
    let (dpn, tpn) = args.mesh;
    let cfg = GptConfig {
        vocab: args.vocab,
        width: args.width,
        heads: args.heads,
        seq: args.seq,
        batch: args.batch,
        layers: args.layers,
        lr: args.lr.unwrap_or(args.optim.default_lr()),
        seed: args.seed,
    };
    let header = format!(
        "transformer_tp: mesh dp={dpn} × tp={tpn}{} ({} backend), {} block(s), vocab {}, width {}, {} heads, seq {}, batch {}, {} steps, {} lr {}, seed {}",
        if args.fsdp { " with FSDP over dp" } else { "" },
        args.backend,
        args.layers,
        args.vocab,
        args.width,
        args.heads,
        args.seq,
        args.batch,
        args.steps,
        args.optim.name(),
        cfg.lr,
        args.seed
    );
    let dirs = StateDirs {
        resume: args.resume.as_deref(),
        save: args.save_state.as_deref(),
        export_hf: args.export_hf.as_deref(),
    };
    // Steps already trained by the state resumed from.
    let done = match &args.resume {
        None => 0,
        Some(dir) => checkpoint::latest_version(dir)?.map_or(Ok(0), |v| checkpoint::read_meta(v).map(|m| m.step))?,
    };
    if done > 0 {
        println!(
            "resuming from step {done} ({})",
            args.resume.as_deref().unwrap_or(std::path::Path::new("")).display()
        );
    }
    // Threads: every rank's result comes back. MPI: each process gets its own rank's; the
    // process of rank 0 prints, checks and reports, the others only train.
    let outs = dtensor::launch(args.backend, dpn * tpn, |ctx| {
        if ctx.rank() == 0 {
            println!("{header}");
        }
        Ok((ctx.rank(), train(&ctx, &cfg, args.optim, args.steps, (dpn, tpn), args.fsdp, dirs)?))
    })?;
    let Some((_, run)) = outs.into_iter().find(|(rank, _)| *rank == 0) else { return Ok(true) };
    let steps = done as usize + args.steps;
    let reference = dtensor::run(1, |ctx| train(&ctx, &cfg, args.optim, steps, (1, 1), false, StateDirs::default()))?;
    let Some(mut reference) = reference.into_iter().next() else { return Ok(false) };
    // A resumed run is compared with the reference's last steps.
    reference.losses.drain(..done as usize);
    reference.comm.drain(..done as usize);

    println!("step  loss (mesh)         loss (1 rank)       rel. diff");
    for (i, (a, b)) in run.losses.iter().zip(&reference.losses).enumerate() {
        println!("{:>4}  {a:<18.12}  {b:<18.12}  {:.1e}", i + 1 + done as usize, (a - b).abs() / b.abs());
    }
    let (diff, at) = compare(&run, &reference);
    let (first, last) = (run.losses[0], run.losses[run.losses.len() - 1]);
    // One step cannot show learning; from two on the loss must go down.
    let learned = run.losses.len() < 2 || last < first;

    let expected = expected_comm(args.layers, args.mesh, args.fsdp);
    let show = |m: &BTreeMap<(CollectiveKind, String), usize>| {
        m.iter().map(|((k, d), n)| format!("{k}@{d} {n}×")).collect::<Vec<_>>().join(", ")
    };
    println!("collectives per step (rank 0, step 1): {}", run.comm_line);
    println!(
        "expected ({}, see expected_comm):  {}",
        if args.fsdp { "Megatron over tp, FSDP over dp" } else { "Megatron" },
        show(&expected)
    );
    let comm_ok = run.comm.iter().all(|c| *c == expected);
    if let Some((i, c)) = run.comm.iter().enumerate().find(|(_, c)| **c != expected) {
        println!("step {} differs: {}", i + 1, show(c));
    }
    let pass = diff <= args.tol && learned && comm_ok;
    println!(
        "max relative difference to the 1-rank run (losses and final weights): {diff:.3e} (at {at}; tolerance {:.0e}){}",
        args.tol,
        if learned { "" } else { "; the loss did not go down" }
    );
    println!("{}", if pass { "PASS" } else { "FAIL" });
    Ok(pass)
}
