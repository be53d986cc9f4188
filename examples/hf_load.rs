//! Load a Hugging Face checkpoint onto a 2×2 mesh: `cargo run --example hf_load`.
//!
//! Generates a small Llama-shaped checkpoint (embedding, per layer q/k/v/o, gate/up/down and
//! two RMS norms, final norm, lm_head) as sharded `model-0000N-of-0000M.safetensors` files
//! with `model.safetensors.index.json`, in a temporary directory; loads it on one rank and on
//! a `dp × tp` = 2×2 mesh with a tensor-parallel plan (PyTorch's Llama plan: q/k/v, gate/up,
//! lm_head Colwise; o, down Rowwise; embedding Rowwise); runs a Llama forward (rotary
//! embeddings, causal attention, SwiGLU) on both and prints PASS when the logits match. Prints, per rank, the bytes read and the peak heap growth while loading.
//!
//! `--fsdp` shards the 2-D weights over `dp` as well (each rank then reads about a quarter).
use clap::Parser;
use dtensor::checkpoint::hf::{self, HfCheckpoint, LoadPlan};
use dtensor::module::{ColwiseParallel, LayerKind, RowwiseParallel};
use dtensor::prelude::*;
use std::collections::HashMap;

#[path = "hf_load/heap.rs"]
mod heap;

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
    /// Shard the 2-D weights over `dp` too.
    #[arg(long)]
    fsdp: bool,
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

/// Llama forward on the loaded weights; returns the logits.
fn forward(a: &Args, w: &HashMap<String, DTensor<f32>>, mesh: &DeviceMesh) -> Result<DTensor<f32>> {
    let (b, s, h, nh) = (a.batch, a.seq, a.hidden, a.heads);
    let hd = h / nh;
    let ids = ndarray::ArrayD::from_shape_fn(vec![b, s], |ix| ((ix[0] * 31 + ix[1] * 7) % a.vocab) as i64);
    let ids = distribute_tensor(&ids, mesh, &vec![Replicate; mesh.ndim()], None)?;
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

/// What one rank saw: logits, payload and header bytes read, peak heap growth during the load.
struct RankLoad {
    logits: ndarray::ArrayD<f32>,
    payload: u64,
    headers: u64,
    peak: isize,
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
        Ok(RankLoad { logits, payload: ck.payload_bytes_read(), headers: ck.header_bytes_read(), peak })
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
    if err <= 1e-4 * scale {
        println!("PASS");
        Ok(())
    } else {
        println!("FAIL");
        std::process::exit(1);
    }
}
