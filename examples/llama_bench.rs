//! Training-step and generation speed of the Llama of `examples/llama` (a random checkpoint of
//! the given sizes), on any backend — the dtensor-rs half of the GPU benchmark
//! (`scripts/gpu-bench.sh`; PyTorch's half is `scripts/gpu_bench_torch.py`, same model and
//! sizes).
//!
//! ```text
//! cargo run --release --features cuda --example llama_bench -- --backend nccl         # world 1, NCCL
//! cargo run --release --features cuda --example llama_bench -- --backend cuda-threads --mesh 2x2  # 4 ranks, 1 GPU
//! cargo run --release --example llama_bench -- --hidden 64 --layers 2 --vocab 256 --seq 16   # CPU, tiny
//! ```
//!
//! A step is the causal-LM loss, its backward and an AdamW step (bf16: master weights in f32,
//! PyTorch's mixed-precision recipe). It prints one `BENCH` line per measurement:
//! `BENCH llama step | backend | mesh | dtype | ms/step | tokens/s | MFU | device work/step`
//! (median of `--steps` after `--warmup`; MFU against `--peak-tflops` when given, from
//! 6·params + 12·layers·hidden·seq FLOPs per token, PaLM's count) and
//! `BENCH llama generate | ... | tokens/s` (greedy, KV cache). Device work per step is
//! `dtensor::cuda::DeviceCounters` (kernel launches, cuBLAS calls, host↔device copies) over
//! the whole process (every rank of `cuda-threads`). A backend this build or machine cannot run
//! prints `llama_bench: SKIP: <reason>` and exits 0.

#[path = "llama/model.rs"]
mod model;
#[allow(dead_code)] // shared with the llama example
#[path = "llama/random.rs"]
mod random;
#[allow(dead_code)] // shared with other examples
#[path = "common/report.rs"]
mod report;

use clap::Parser;
use dtensor::checkpoint::hf::{HfCheckpoint, LlamaConfig};
use dtensor::cuda::DeviceCounters;
use dtensor::ndarray::Array2;
use dtensor::optim::AdamW;
use dtensor::prelude::*;
use dtensor::typed::Dt;
use dtensor::{Element, Launch};
use model::{Ids, Llama, LlamaForCausalLM};
use report::{exit_code, parse_backend, parse_mesh};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser, Debug, Clone)]
#[command(about = "Llama training-step and generation speed on any backend (the GPU benchmark's dtensor-rs half)")]
struct Args {
    /// threads, mpi, nccl (one process per GPU: world 1 on one GPU), cuda-threads (every rank on one GPU).
    #[arg(long, default_value = "threads", value_parser = parse_backend)]
    backend: Launch,
    /// Mesh `dp×tp`.
    #[arg(long, default_value = "1x1", value_parser = parse_mesh)]
    mesh: (usize, usize),
    /// `f32`, or `bf16` (bf16 weights, f32 master weights in AdamW).
    #[arg(long, default_value = "bf16")]
    dtype: String,
    #[arg(long, default_value_t = 1024)]
    hidden: usize,
    #[arg(long, default_value_t = 2816)]
    intermediate: usize,
    #[arg(long, default_value_t = 16)]
    heads: usize,
    #[arg(long, default_value_t = 8)]
    kv_heads: usize,
    #[arg(long, default_value_t = 8)]
    layers: usize,
    #[arg(long, default_value_t = 32000)]
    vocab: usize,
    /// Sequence length of a training batch.
    #[arg(long, default_value_t = 512)]
    seq: usize,
    /// Sequences per training batch (split over dp).
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Measured steps (after the warm-up).
    #[arg(long, default_value_t = 10)]
    steps: usize,
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// New tokens per row of the generation run (0: no generation).
    #[arg(long, default_value_t = 32)]
    new_tokens: usize,
    /// The device's peak dense TFLOP/s in this dtype, for MFU (e.g. 989 for an H100 SXM in bf16).
    #[arg(long)]
    peak_tflops: Option<f64>,
    /// Where the random checkpoint lives: written there unless a previous run did (its
    /// `config.json` must then have these sizes); default a temporary directory.
    #[arg(long)]
    checkpoint: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    exit_code("llama_bench", real_main(&Args::parse()).map(|()| true))
}

fn real_main(a: &Args) -> Result<()> {
    let bad = |reason: String| Error::InvalidArgument { context: "arguments".into(), reason };
    if a.steps == 0 || a.seq < 2 || a.batch == 0 {
        return Err(bad(format!("--steps, --batch must be positive and --seq at least 2, got {a:?}")));
    }
    let shape = random::Shape {
        hidden: a.hidden,
        intermediate: a.intermediate,
        heads: a.heads,
        kv_heads: a.kv_heads,
        head_dim: a.hidden / a.heads.max(1),
        vocab: a.vocab,
        layers: a.layers,
    };
    if a.heads == 0 || !a.hidden.is_multiple_of(a.heads) {
        return Err(bad(format!("--hidden {} is not a multiple of --heads {}", a.hidden, a.heads)));
    }
    let scratch = tempfile::tempdir().map_err(|e| bad(format!("tempdir: {e}")))?;
    let dir = a.checkpoint.as_deref().unwrap_or(scratch.path());
    if !dir.join("config.json").is_file() {
        random::write(dir, &shape)?;
    }
    let cfg = LlamaConfig::read(dir)?;
    let have = (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.intermediate_size);
    if have != (a.hidden, a.layers, a.vocab, a.intermediate) || cfg.kv_heads() != a.kv_heads {
        return Err(bad(format!(
            "the checkpoint in {} has other sizes (hidden, layers, vocab, intermediate) {have:?}: remove it",
            dir.display()
        )));
    }
    let flops_per_token = 6.0 * shape.params() as f64 + 12.0 * (a.layers * a.hidden * a.seq) as f64;
    println!(
        "llama_bench: {} parameters ({} layers, hidden {}, {} heads / {} kv, vocab {}), batch {} × seq {}, {} on {} mesh {}x{}",
        shape.params(),
        a.layers,
        a.hidden,
        a.heads,
        a.kv_heads,
        a.vocab,
        a.batch,
        a.seq,
        a.dtype,
        a.backend,
        a.mesh.0,
        a.mesh.1
    );
    let r = match a.dtype.as_str() {
        "f32" => bench::<f32>(a, dir, &cfg)?,
        "bf16" => bench::<dtensor::bf16>(a, dir, &cfg)?,
        d => return Err(bad(format!("--dtype `{d}` is not f32 or bf16"))),
    };
    let tokens = (a.batch * a.seq) as f64;
    let tokens_per_s = tokens / (r.step_ms / 1e3);
    let mfu = a.peak_tflops.map(|p| format!("{:.1} %", 100.0 * flops_per_token * tokens_per_s / (p * 1e12)));
    let label = format!("{} | {}x{} | {}", a.backend, a.mesh.0, a.mesh.1, a.dtype);
    let w = &r.work;
    println!(
        "BENCH llama step | {label} | {:.2} ms | {:.0} tokens/s | MFU {} | {} launches + {} cuBLAS calls, {} H2D ({} B), {} D2H, {} D2D per step (all ranks)",
        r.step_ms,
        tokens_per_s,
        mfu.unwrap_or_else(|| "n/a (no --peak-tflops)".into()),
        w.kernel_launches,
        w.blas_calls,
        w.host_to_device,
        w.host_to_device_bytes,
        w.device_to_host,
        w.device_to_device
    );
    if let Some(g) = r.gen_tokens_per_s {
        println!("BENCH llama generate | {label} | {:.1} tokens/s (batch {}, {} new tokens)", g, a.batch, a.new_tokens);
    }
    println!("llama_bench: losses {:?}", r.losses);
    Ok(())
}

struct Run {
    step_ms: f64,
    /// Device work of one measured step (process-wide).
    work: DeviceCounters,
    gen_tokens_per_s: Option<f64>,
    losses: Vec<f32>,
}

fn bench<T: Element>(a: &Args, dir: &std::path::Path, cfg: &LlamaConfig) -> Result<Run> {
    let (dp, tp) = a.mesh;
    let out = dtensor::launch(a.backend, dp * tp, |ctx| {
        let mesh = ctx.init_device_mesh(&[dp, tp], &["dp", "tp"])?;
        let llama = Llama::<T>::new(cfg.clone(), a.seq + a.new_tokens, &mesh)?;
        let mut model = LlamaForCausalLM::<T>::load_hf(&mut HfCheckpoint::open(dir)?, "", &mesh)?;
        let v = a.vocab as i64;
        let ids = Array2::from_shape_fn((a.batch, a.seq), |(i, j)| (i as i64 * 7919 + j as i64 * 104_729 + 3) % v);
        let ids: Ids = Dt::distribute(&ids.into_dyn(), &mesh)?;
        let mut opt = AdamW::new(1e-4).master_weights(T::DTYPE != dtensor::DType::F32);
        let all = dtensor::Along::All;
        let mut step = || -> Result<f32> {
            model.zero_grad();
            let loss = llama.loss(&model, &ids, &ids)?;
            loss.as_dtensor().backward()?;
            opt.step(&mut model)?;
            // reading the loss waits for the device
            Ok(loss.full_tensor()?.sum().as_f64() as f32)
        };
        let (mut times, mut losses) = (Vec::new(), Vec::new());
        for s in 0..a.warmup + a.steps {
            mesh.barrier(all)?;
            let t0 = Instant::now();
            losses.push(step()?);
            if s >= a.warmup {
                times.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        times.sort_by(f64::total_cmp);
        // One more step for the device work (process-wide counts): every rank waits before the
        // first snapshot and after the step, and none goes on before the second snapshot.
        mesh.barrier(all)?;
        let before = DeviceCounters::now();
        mesh.barrier(all)?;
        step()?;
        mesh.barrier(all)?;
        let work = DeviceCounters::now().since(&before);
        mesh.barrier(all)?;
        let gen = match a.new_tokens {
            0 => None,
            n => {
                let prompt =
                    Array2::from_shape_fn((a.batch, 8.min(a.seq)), |(i, j)| (i as i64 * 31 + j as i64 + 1) % v);
                let prompt: Ids = Dt::distribute(&prompt.into_dyn(), &mesh)?;
                llama.generate(&model, &prompt, 2, &[], 0)?; // warm-up, as the PyTorch side does
                mesh.barrier(all)?;
                let t0 = Instant::now();
                llama.generate(&model, &prompt, n, &[], 0)?;
                Some((a.batch * n) as f64 / t0.elapsed().as_secs_f64())
            }
        };
        Ok(Run { step_ms: times[times.len() / 2], work, gen_tokens_per_s: gen, losses })
    })?;
    // the slowest rank's median step and generation (the ranks wait for each other)
    let step_ms = out.iter().map(|r| r.step_ms).fold(0.0, f64::max);
    let gen = out.iter().filter_map(|r| r.gen_tokens_per_s).reduce(f64::min);
    let mut first = out
        .into_iter()
        .next()
        .ok_or_else(|| Error::InvalidArgument { context: "llama_bench".into(), reason: "no rank ran".into() })?;
    first.step_ms = step_ms;
    first.gen_tokens_per_s = gen;
    Ok(first)
}
