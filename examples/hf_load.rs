//! Load a Hugging Face checkpoint onto a 2×2 mesh: `cargo run --example hf_load`.
//!
//! Generates a small Llama-shaped checkpoint (embedding, per layer q/k/v/o, gate/up/down and
//! two RMS norms, final norm, lm_head) as sharded `model-0000N-of-0000M.safetensors` files
//! with `model.safetensors.index.json`, in a temporary directory; loads it on one rank and on
//! a `dp × tp` = 2×2 mesh with a tensor-parallel plan (PyTorch's Llama plan: q/k/v, gate/up,
//! lm_head Colwise; o, down Rowwise; embedding Rowwise); runs a Llama forward (rotary
//! embeddings, causal attention, SwiGLU) on both and prints PASS when the logits match. Prints, per rank, the bytes read and the peak heap growth while loading.
//!
//! Then trains `--steps` AdamW steps (next-token cross-entropy, the batch sharded over dp) on
//! both and prints PASS when losses and weights match too.
//!
//! `--fsdp` shards the 2-D weights over `dp` as well (each rank then reads about a quarter) and
//! trains fully sharded (`fsdp::fully_shard`, adopting the weights as they were loaded):
//! parameters, gradients and AdamW moments stay sharded over dp, all-gathered for the forward
//! and reduce-scattered in the backward.
use clap::Parser;
use dtensor::checkpoint::hf::{self, HfCheckpoint, LoadPlan};
use dtensor::fsdp::{fully_shard, FullyShardOptions};
use dtensor::module::{ColwiseParallel, LayerKind, Module, RowwiseParallel};
use dtensor::optim::AdamW;
use dtensor::prelude::*;
use dtensor::{CollectiveKind, CommDebugMode};
use std::collections::HashMap;

#[path = "hf_load/heap.rs"]
mod heap;
#[path = "common/maybe_sharded.rs"]
mod maybe_sharded;
use maybe_sharded::MaybeSharded;

#[global_allocator]
static ALLOC: heap::Counting = heap::Counting;

#[derive(Parser, Debug, Clone)]
struct Args {
    #[arg(long, default_value_t = 64)]
    vocab: usize,
    #[arg(long, default_value_t = 32)]
    hidden: usize,
    #[arg(long, default_value_t = 88)]
    intermediate: usize,
    #[arg(long, default_value_t = 2)]
    layers: usize,
    #[arg(long, default_value_t = 4)]
    heads: usize,
    #[arg(long, default_value_t = 2)]
    batch: usize,
    #[arg(long, default_value_t = 7)]
    seq: usize,
    /// Largest checkpoint file, in bytes of tensor data (default: about a third of the model).
    #[arg(long)]
    max_file_bytes: Option<u64>,
    /// Shard the 2-D weights over `dp` too, and train fully sharded.
    #[arg(long)]
    fsdp: bool,
    /// Training steps after the logits check.
    #[arg(long, default_value_t = 3)]
    steps: usize,
}

/// The loaded weights as a module (by checkpoint name), so that optimizers and `fully_shard`
/// can take them.
#[derive(Clone)]
struct Weights(Vec<(String, DTensor<f32>)>);

impl Module<f32> for Weights {
    fn named_parameters(&self) -> Vec<(String, &DTensor<f32>)> {
        self.0.iter().map(|(n, t)| (n.clone(), t)).collect()
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<f32>)> {
        self.0.iter_mut().map(|(n, t)| (n.clone(), t)).collect()
    }
}

impl Weights {
    fn map(&self) -> HashMap<String, DTensor<f32>> {
        self.0.iter().cloned().collect()
    }
}

/// The checkpoint's tensors: HF Llama names and shapes.
fn llama_shapes(a: &Args) -> Vec<(String, Vec<usize>)> {
    let (h, i) = (a.hidden, a.intermediate);
    let mut v = vec![("model.embed_tokens.weight".to_string(), vec![a.vocab, h])];
    for l in 0..a.layers {
        let p = format!("model.layers.{l}");
        v.push((format!("{p}.input_layernorm.weight"), vec![h]));
        for m in ["q", "k", "v", "o"] {
            v.push((format!("{p}.self_attn.{m}_proj.weight"), vec![h, h]));
        }
        v.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        v.push((format!("{p}.mlp.gate_proj.weight"), vec![i, h]));
        v.push((format!("{p}.mlp.up_proj.weight"), vec![i, h]));
        v.push((format!("{p}.mlp.down_proj.weight"), vec![h, i]));
    }
    v.push(("model.norm.weight".to_string(), vec![h]));
    v.push(("lm_head.weight".to_string(), vec![a.vocab, h]));
    v
}

/// Deterministic weights: small values around 0 (`1 ± 0.1` for norms), scaled by fan-in.
fn weight(shape: &[usize], seed: usize) -> ndarray::ArrayD<f32> {
    let fan_in = *shape.last().unwrap() as f32;
    let mut k = seed.wrapping_mul(7919);
    ndarray::ArrayD::from_shape_fn(shape.to_vec(), |_| {
        k = k.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let u = ((k >> 33) % 2001) as f32 / 1000.0 - 1.0; // in [-1, 1]
        if shape.len() == 1 {
            1.0 + 0.1 * u
        } else {
            u * 1.7 / fan_in.sqrt()
        }
    })
}

fn plan(fsdp: bool) -> LoadPlan {
    let (col, row) = ("model.layers.*.self_attn", "model.layers.*.mlp");
    if !fsdp {
        return LoadPlan::new()
            .layer("model.embed_tokens", LayerKind::Embedding, RowwiseParallel::new())
            .style(&format!("{col}.q_proj"), ColwiseParallel::new())
            .style(&format!("{col}.k_proj"), ColwiseParallel::new())
            .style(&format!("{col}.v_proj"), ColwiseParallel::new())
            .style(&format!("{col}.o_proj"), RowwiseParallel::new())
            .style(&format!("{row}.gate_proj"), ColwiseParallel::new())
            .style(&format!("{row}.up_proj"), ColwiseParallel::new())
            .style(&format!("{row}.down_proj"), RowwiseParallel::new())
            .style("lm_head", ColwiseParallel::new());
    }
    // The tp placements above, with the other weight dim sharded over dp.
    let colwise = [Shard(1), Shard(0)];
    let rowwise = [Shard(0), Shard(1)];
    LoadPlan::new()
        .placements("model.embed_tokens", &colwise)
        .placements(&format!("{col}.q_proj"), &colwise)
        .placements(&format!("{col}.k_proj"), &colwise)
        .placements(&format!("{col}.v_proj"), &colwise)
        .placements(&format!("{col}.o_proj"), &rowwise)
        .placements(&format!("{row}.gate_proj"), &colwise)
        .placements(&format!("{row}.up_proj"), &colwise)
        .placements(&format!("{row}.down_proj"), &rowwise)
        .placements("lm_head", &colwise)
}

fn rms_norm(x: &DTensor<f32>, w: &DTensor<f32>) -> Result<DTensor<f32>> {
    let ms = x.mul(x)?.mean_dim(-1, true)?;
    x.div(&ms.add_scalar(1e-6)?.sqrt()?)?.mul(w)
}

fn silu(x: &DTensor<f32>) -> Result<DTensor<f32>> {
    x.div(&x.neg()?.exp()?.add_scalar(1.0)?)
}

/// `x Wᵀ` for an HF Linear weight `[out, in]`.
fn linear(x: &DTensor<f32>, w: &DTensor<f32>) -> Result<DTensor<f32>> {
    x.linear(w, None)
}

/// Token `i` of sequence `b` of the data (the targets are the next tokens).
fn token(a: &Args, b: usize, i: usize) -> i64 {
    ((b * 31 + i * 7 + (i * i) % 5) % a.vocab) as i64
}

/// The ids `[batch, seq]`, the batch sharded over dp.
fn ids(a: &Args, mesh: &DeviceMesh, shift: usize) -> Result<DTensor<i64>> {
    let ids = ndarray::ArrayD::from_shape_fn(vec![a.batch, a.seq], |ix| token(a, ix[0], ix[1] + shift));
    distribute_tensor(&ids, mesh, &[Shard(0), Replicate], None)
}

/// Llama forward on the loaded weights; returns the logits.
fn forward(a: &Args, w: &HashMap<String, DTensor<f32>>, mesh: &DeviceMesh) -> Result<DTensor<f32>> {
    let (b, s, h, nh) = (a.batch, a.seq, a.hidden, a.heads);
    let hd = h / nh;
    let ids = ids(a, mesh, 0)?;
    let mask = ndarray::ArrayD::from_shape_fn(vec![s, s], |ix| if ix[1] > ix[0] { -1e9f32 } else { 0.0 });
    let mask = distribute_tensor(&mask, mesh, &vec![Replicate; mesh.ndim()], None)?;
    let heads = |t: DTensor<f32>| t.reshape(&[b as isize, s as isize, nh as isize, hd as isize])?.transpose(1, 2);
    let (cos, sin) = dtensor::rotary_tables::<f32>(s, hd, 10000.0, &TensorOptions::new().mesh(mesh))?;
    let mut x = w["model.embed_tokens.weight"].embedding(&ids)?;
    for l in 0..a.layers {
        let p = |n: &str| &w[&format!("model.layers.{l}.{n}.weight")];
        let hn = rms_norm(&x, p("input_layernorm"))?;
        let q = heads(linear(&hn, p("self_attn.q_proj"))?)?.apply_rotary(&cos, &sin)?;
        let k = heads(linear(&hn, p("self_attn.k_proj"))?)?.apply_rotary(&cos, &sin)?;
        let v = heads(linear(&hn, p("self_attn.v_proj"))?)?;
        let scores = q.matmul(&k.transpose(2, 3)?)?.div_scalar((hd as f32).sqrt())?.add(&mask)?;
        let ctx = scores.softmax(-1)?.matmul(&v)?.transpose(1, 2)?.reshape(&[b as isize, s as isize, h as isize])?;
        x = x.add(&linear(&ctx, p("self_attn.o_proj"))?)?;
        let hn = rms_norm(&x, p("post_attention_layernorm"))?;
        let act = silu(&linear(&hn, p("mlp.gate_proj"))?)?.mul(&linear(&hn, p("mlp.up_proj"))?)?;
        x = x.add(&linear(&act, p("mlp.down_proj"))?)?;
    }
    linear(&rms_norm(&x, &w["model.norm.weight"])?, &w["lm_head.weight"])
}

/// What one rank saw: logits, payload and header bytes read, peak heap growth during the load,
/// then the training: each step's loss, the final weights, the first step's collectives.
struct RankLoad {
    logits: ndarray::ArrayD<f32>,
    payload: u64,
    headers: u64,
    peak: isize,
    losses: Vec<f32>,
    weights: Vec<(String, ndarray::ArrayD<f32>)>,
    comm: String,
}

fn load_and_run(a: &Args, dir: &std::path::Path, mesh_shape: &[usize]) -> Result<Vec<RankLoad>> {
    let n = mesh_shape.iter().product();
    dtensor::run(n, |ctx| {
        let mesh = ctx.init_device_mesh(mesh_shape, &["dp", "tp"])?;
        let (loaded, peak) = heap::peak_growth(|| {
            let mut ck = HfCheckpoint::open(dir)?;
            let weights: HashMap<String, DTensor<f32>> = ck.load(&mesh, &plan(a.fsdp))?.into_iter().collect();
            Ok::<_, Error>((ck, weights))
        });
        let (ck, weights) = loaded?;
        let logits = forward(a, &weights, &mesh)?.full_tensor()?;
        let mut names: Vec<String> = weights.keys().cloned().collect();
        names.sort();
        let module =
            Weights(names.into_iter().map(|n| (n.clone(), weights[&n].clone().requires_grad_(true))).collect());
        drop(weights);
        let mut model = if a.fsdp {
            let opts = FullyShardOptions::on("dp").accept_resting(true);
            MaybeSharded::Sharded(fully_shard(module, &mesh, &opts)?)
        } else {
            MaybeSharded::Plain(module)
        };
        let (mut losses, mut comm) = (vec![], String::new());
        let mut opt = AdamW::new(1e-2);
        let targets = ids(a, &mesh, 1)?.reshape(&[(a.batch * a.seq) as isize])?;
        for step in 0..a.steps {
            let record = CommDebugMode::new();
            let loss = record.scope(|| -> Result<DTensor<f32>> {
                model.module().zero_grad();
                let logits = model.run(|m| forward(a, &m.map(), &mesh))?;
                let loss = logits.reshape(&[(a.batch * a.seq) as isize, a.vocab as isize])?.cross_entropy(&targets)?;
                loss.backward()?;
                Ok(loss)
            })?;
            opt.step(model.module_mut())?;
            losses.push(loss.full_tensor()?.iter().copied().next().unwrap_or(f32::NAN));
            if step == 0 {
                comm = record
                    .by_kind()
                    .into_iter()
                    .filter(|((k, _), _)| *k != CollectiveKind::Barrier)
                    .map(|((k, d), (n, _))| format!("{k}@{d} {n}×"))
                    .collect::<Vec<_>>()
                    .join(", ");
            }
        }
        let weights = model
            .module()
            .named_parameters()
            .into_iter()
            .map(|(n, p)| Ok((n, p.full_tensor()?)))
            .collect::<Result<_>>()?;
        Ok(RankLoad {
            logits,
            payload: ck.payload_bytes_read(),
            headers: ck.header_bytes_read(),
            peak,
            losses,
            weights,
            comm,
        })
    })
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.hidden % a.heads != 0 {
        return Err(Error::InvalidArgument { context: "hf_load".into(), reason: "hidden % heads != 0".into() });
    }
    let dir = tempfile::tempdir().map_err(|e| Error::Checkpoint { path: "tempdir".into(), reason: e.to_string() })?;
    let shapes = llama_shapes(&a);
    let total: usize = shapes.iter().map(|(_, s)| s.iter().product::<usize>() * 4).sum();
    let max_file = a.max_file_bytes.unwrap_or(total as u64 / 3 + 1);
    dtensor::run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let sd = shapes
            .iter()
            .enumerate()
            .map(|(i, (n, s))| Ok((n.clone(), distribute_tensor(weight(s, i), &mesh, &[Replicate], None)?)))
            .collect::<Result<Vec<_>>>()?;
        hf::save_sharded(dir.path(), &sd, max_file)
    })?;
    let files = std::fs::read_dir(dir.path()).map(|d| d.count()).unwrap_or(0);
    println!(
        "checkpoint: {} tensors, {total} bytes of f32 weights in {} files + index (max {max_file} B per file)",
        shapes.len(),
        files - 1
    );

    let one = load_and_run(&a, dir.path(), &[1, 1])?;
    let four = load_and_run(&a, dir.path(), &[2, 2])?;
    println!(
        "plan: {}",
        if a.fsdp { "tp on `tp` + weights sharded on `dp` (fsdp)" } else { "tp on `tp`, replicated on `dp`" }
    );
    println!("{:<10} {:>4} {:>16} {:>14} {:>22}", "mesh", "rank", "payload read B", "headers B", "peak heap growth B");
    for (mesh, loads) in [("1 rank", &one), ("2x2", &four)] {
        for (r, l) in loads.iter().enumerate() {
            println!("{mesh:<10} {r:>4} {:>16} {:>14} {:>22}", l.payload, l.headers, l.peak);
        }
    }
    let reference = &one[0].logits;
    let scale = reference.iter().fold(1f32, |m, v| m.max(v.abs()));
    let err = four.iter().flat_map(|l| l.logits.iter().zip(reference).map(|(x, y)| (x - y).abs())).fold(0f32, f32::max);
    println!("logits {:?}: max |2x2 - 1 rank| = {err:.3e} (scale {scale:.3})", reference.shape());
    // Training: losses and final weights against the 1-rank run (f32: relative 1e-4).
    let rel = |x: f32, y: f32, s: f32| (x - y).abs() / s.max(f32::MIN_POSITIVE);
    let mut train_err = 0f32;
    println!("step  loss (2x2{})  loss (1 rank)", if a.fsdp { ", fsdp" } else { "" });
    for (i, (x, y)) in four[0].losses.iter().zip(&one[0].losses).enumerate() {
        println!("{:>4}  {x:<16.7} {y:<16.7}", i + 1);
        train_err = train_err.max(rel(*x, *y, y.abs()));
    }
    for ((n, x), (m, y)) in four[0].weights.iter().zip(&one[0].weights) {
        assert_eq!(n, m, "the same parameters in the same order");
        let s = y.iter().fold(0f32, |m, v| m.max(v.abs()));
        train_err = train_err.max(x.iter().zip(y).map(|(p, q)| rel(*p, *q, s)).fold(0f32, f32::max));
    }
    let learned = one[0].losses.len() < 2 || one[0].losses.last() < one[0].losses.first();
    println!("collectives of a training step on 2x2 (rank 0): {}", four[0].comm);
    println!(
        "training: max relative difference to the 1-rank run (losses and weights) {train_err:.3e} (tolerance 1e-4){}",
        if learned { "" } else { "; the loss did not go down" }
    );
    if err <= 1e-4 * scale && train_err <= 1e-4 && learned {
        println!("PASS");
        Ok(())
    } else {
        println!("FAIL");
        std::process::exit(1);
    }
}
