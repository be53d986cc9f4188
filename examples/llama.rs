//! A Hugging Face Llama with `#[distribute]`: `cargo run --example llama`.
//!
//! Loads a `save_pretrained` directory (`--model DIR`; by default the tiny random Llama in
//! `examples/llama/fixture/`, made by `scripts/gen_llama_fixture.py` with transformers) straight
//! into the typed model (`LlamaForCausalLM::load_hf`: each rank reads only its shards) on each
//! mesh of `--meshes` (`dp×tp`, default `1x1,2x2,1x2`), then:
//!
//! 1. computes the logits, the causal-LM loss (labels with -100, as transformers) and the
//!    gradients, and greedy-generates with a KV cache; on the fixture, checks them against
//!    what transformers computed (`expected.json`): logits, loss and gradients within 1e-4
//!    relative (to each tensor's largest value) in f32, identical generated ids;
//! 2. trains a few AdamW steps and checks that every mesh's losses match the first mesh's.
//!
//! Prints PASS when every check holds (exit code 1 otherwise), with load time, bytes read and
//! peak heap growth while loading per rank, and generation tokens/s per mesh.
//!
//! `--generate-mb N` first writes a random Llama checkpoint of about N MB (hidden 1024, 16
//! query over 8 key/value heads, vocab 32000, as many layers as fit) to a temporary directory
//! and runs on it (checked across meshes only): the load measurement of a large checkpoint.

#[path = "hf_load/heap.rs"]
mod heap;
#[path = "llama/model.rs"]
mod model;
#[path = "llama/random.rs"]
mod random;

#[global_allocator]
static ALLOC: heap::Counting = heap::Counting;

use clap::Parser;
use dtensor::checkpoint::hf::{HfCheckpoint, LlamaConfig};
use dtensor::ndarray::{Array2, ArrayD, IxDyn};
use dtensor::optim::AdamW;
use dtensor::prelude::*;
use dtensor::typed::Dt;
use dtensor::Element;
use model::{Ids, Llama, LlamaForCausalLM};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser, Debug, Clone)]
#[command(about = "A Hugging Face Llama on a dp x tp mesh: parity with transformers, training, greedy generation")]
struct Args {
    /// A `save_pretrained` directory of a Llama-family model [default: the committed fixture].
    #[arg(long)]
    model: Option<PathBuf>,
    /// Meshes `dp×tp`, comma-separated.
    #[arg(long, default_value = "1x1,2x2,1x2")]
    meshes: String,
    /// New tokens to generate per row.
    #[arg(long, default_value_t = 10)]
    new_tokens: usize,
    /// AdamW steps.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Element type of the model: `f32` or `bf16` (weights converted from the checkpoint as
    /// they are read; compared with transformers' f32 within the bf16 bounds below).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Write a random Llama checkpoint of about this many MB and run on it.
    #[arg(long)]
    generate_mb: Option<usize>,
}

/// Writes a random Llama checkpoint of about `mb` MB (f32) with its `config.json` to `dir`.
fn generate(dir: &Path, mb: usize) -> Result<()> {
    random::write(dir, &random::Shape::for_mb(mb))
}

/// bf16 against transformers' f32: logits, loss and training losses (relative to the largest
/// value of each tensor).
const BF16_TOL: f64 = 5e-2;
/// bf16 gradients against transformers' f32.
const BF16_GRAD_TOL: f64 = 8e-2;

/// What transformers computed on the fixture.
struct Expected {
    ids: Array2<i64>,
    labels: Array2<i64>,
    logits: ArrayD<f32>,
    loss: f32,
    grads: Vec<(String, ArrayD<f32>)>,
    prompt_len: usize,
    generated: Array2<i64>,
}

fn array(v: &Value) -> ArrayD<f32> {
    let shape: Vec<usize> = v["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let data: Vec<f32> = v["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    ArrayD::from_shape_vec(IxDyn(&shape), data).expect("fixture shape")
}

fn ids(v: &Value) -> Array2<i64> {
    let rows: Vec<Vec<i64>> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect())
        .collect();
    Array2::from_shape_fn((rows.len(), rows[0].len()), |(i, j)| rows[i][j])
}

fn expected(dir: &Path) -> Result<Expected> {
    let text = std::fs::read_to_string(dir.join("expected.json")).map_err(|e| Error::InvalidArgument {
        context: format!("reading {}/expected.json", dir.display()),
        reason: e.to_string(),
    })?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Error::InvalidArgument { context: "expected.json".into(), reason: e.to_string() })?;
    Ok(Expected {
        ids: ids(&v["input_ids"]),
        labels: ids(&v["labels"]),
        logits: array(&v["logits"]),
        loss: v["loss"].as_f64().unwrap() as f32,
        grads: v["grads"].as_object().unwrap().iter().map(|(k, g)| (k.clone(), array(g))).collect(),
        prompt_len: v["prompt_len"].as_u64().unwrap() as usize,
        generated: ids(&v["generated"]),
    })
}

/// `max |a - b| / max |b|`.
fn rel(a: &ArrayD<f32>, b: &ArrayD<f32>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let scale = b.iter().fold(0f64, |m, &x| m.max((x as f64).abs())).max(f64::MIN_POSITIVE);
    a.iter().zip(b).fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs())) / scale
}

/// `eos_token_id` of `generation_config.json` (what `generate` reads), else of `config.json`:
/// a number or a list (Llama 3 has several).
fn eos(dir: &Path) -> Vec<i64> {
    let read = |file: &str| -> Option<Vec<i64>> {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(file)).ok()?).ok()?;
        let e = &v["eos_token_id"];
        e.as_i64().map(|x| vec![x]).or_else(|| e.as_array().map(|a| a.iter().filter_map(|x| x.as_i64()).collect()))
    };
    read("generation_config.json").or_else(|| read("config.json")).unwrap_or_default()
}

/// One mesh's results (rank 0's).
struct MeshRun {
    logits: ArrayD<f32>,
    loss: f32,
    grads: Vec<(String, ArrayD<f32>)>,
    generated: Array2<i64>,
    losses: Vec<f32>,
    load_s: f64,
    bytes_read: Vec<u64>,
    peak_mb: Vec<f64>,
    gen_tokens_per_s: f64,
}

fn run_mesh<T: Element>(
    a: &Args,
    dir: &Path,
    cfg: &LlamaConfig,
    exp: &Expected,
    dp: usize,
    tp: usize,
) -> Result<MeshRun> {
    let eos = eos(dir);
    let out = dtensor::run(dp * tp, |ctx| {
        let mesh = ctx.init_device_mesh(&[dp, tp], &["dp", "tp"])?;
        // First: it refuses a tp that would cut a head.
        let llama = Llama::<T>::new(cfg.clone(), exp.ids.ncols().max(exp.prompt_len + a.new_tokens), &mesh)?;
        let t0 = Instant::now();
        let (loaded, peak) = heap::peak_growth(|| {
            let mut ck = HfCheckpoint::open(dir)?;
            cfg.check(&mut ck)?;
            let model = LlamaForCausalLM::<T>::load_hf(&mut ck, "", &mesh)?;
            Ok::<_, Error>((ck, model))
        });
        let (ck, mut model) = loaded?;
        let load_s = t0.elapsed().as_secs_f64();
        let b = exp.ids.nrows();
        let ids: Ids = Dt::distribute(&exp.ids.clone().into_dyn(), &mesh)?;
        let labels: Ids = Dt::distribute(&exp.labels.clone().into_dyn(), &mesh)?;

        let f32s = |a: ArrayD<T>| a.mapv(|v| v.as_f64() as f32);
        let logits = f32s(llama.logits(&model, &ids, 0, None)?.full_tensor()?);
        let loss = llama.loss(&model, &ids, &labels)?;
        loss.as_dtensor().backward()?;
        let mut grads = Vec::new();
        for (name, p) in model.named_parameters() {
            if exp.grads.iter().any(|(n, _)| *n == name) {
                grads.push((name, f32s(p.grad().expect("a gradient").full_tensor()?)));
            }
        }
        let loss0 = loss.full_tensor()?.sum().as_f64() as f32;

        let prompt: Ids =
            Dt::distribute(&exp.ids.slice(ndarray::s![.., ..exp.prompt_len]).to_owned().into_dyn(), &mesh)?;
        let t1 = Instant::now();
        let generated = llama.generate(&model, &prompt, a.new_tokens, &eos, 0)?;
        let gen_tokens_per_s = (b * a.new_tokens) as f64 / t1.elapsed().as_secs_f64();

        // A few AdamW steps on the same batch (the gradients above are the first step's).
        let mut opt = AdamW::new(a.lr);
        let mut losses = vec![loss0];
        for step in 0..a.steps {
            if step > 0 {
                model.zero_grad();
                let l = llama.loss(&model, &ids, &labels)?;
                l.as_dtensor().backward()?;
                losses.push(l.full_tensor()?.sum().as_f64() as f32);
            }
            opt.step(&mut model)?;
        }
        Ok(MeshRun {
            logits,
            loss: loss0,
            grads,
            generated,
            losses,
            load_s,
            bytes_read: vec![ck.payload_bytes_read()],
            peak_mb: vec![peak as f64 / 1e6],
            gen_tokens_per_s,
        })
    })?;
    let bytes_read = out.iter().map(|r| r.bytes_read[0]).collect();
    let peak_mb = out.iter().map(|r| r.peak_mb[0]).collect();
    let mut first = out.into_iter().next().expect("rank 0");
    first.bytes_read = bytes_read;
    first.peak_mb = peak_mb;
    Ok(first)
}

fn main() -> Result<()> {
    let a = Args::parse();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/llama/fixture");
    let scratch =
        tempfile::tempdir().map_err(|e| Error::InvalidArgument { context: "tempdir".into(), reason: e.to_string() })?;
    let dir = match (a.generate_mb, &a.model) {
        (Some(mb), _) => {
            generate(scratch.path(), mb)?;
            scratch.path().to_path_buf()
        }
        (None, Some(m)) => m.clone(),
        (None, None) => fixture.clone(),
    };
    let cfg = LlamaConfig::read(&dir)?;
    let on_fixture = dir.join("expected.json").is_file();
    let exp = if on_fixture {
        expected(&dir)?
    } else {
        // Any checkpoint: a deterministic batch, checked across meshes only.
        let v = cfg.vocab_size as i64;
        let ids = Array2::from_shape_fn((2, 8), |(i, j)| (i as i64 * 131 + j as i64 * 17 + 5) % v);
        let mut labels = ids.clone();
        labels[[0, 2]] = -100;
        Expected {
            ids,
            labels,
            logits: ArrayD::zeros(IxDyn(&[0])),
            loss: 0.0,
            grads: vec![],
            prompt_len: 4,
            generated: Array2::zeros((0, 0)),
        }
    };
    println!(
        "Llama from {}: hidden {}, {} layers, {} heads over {} key/value heads, vocab {}",
        dir.display(),
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.kv_heads(),
        cfg.vocab_size
    );
    let mut ok = true;
    let mut reference: Option<Vec<f32>> = None;
    // f32: 1e-4 relative. bf16 (8-bit mantissa, weights rounded as they load): the bounds
    // this example documents (docs/EXAMPLES.md#llama); generated ids may then differ where
    // transformers' top two logits are closer than bf16 resolves.
    let bf16 = a.dtype == "bf16";
    let (tol, tol_grad) = if bf16 { (BF16_TOL, BF16_GRAD_TOL) } else { (1e-4, 1e-4) };
    for m in a.meshes.split(',') {
        let (dp, tp) =
            m.split_once('x').and_then(|(x, y)| Some((x.parse().ok()?, y.parse().ok()?))).ok_or_else(|| {
                Error::InvalidArgument { context: "--meshes".into(), reason: format!("`{m}` is not dp×tp like 2x2") }
            })?;
        let r = match a.dtype.as_str() {
            "f32" => run_mesh::<f32>(&a, &dir, &cfg, &exp, dp, tp)?,
            "bf16" => run_mesh::<dtensor::bf16>(&a, &dir, &cfg, &exp, dp, tp)?,
            d => {
                return Err(Error::InvalidArgument {
                    context: "--dtype".into(),
                    reason: format!("`{d}` is not f32 or bf16"),
                })
            }
        };
        let mut line = format!(
            "mesh {dp}x{tp}: load {:.1} ms, bytes read per rank {:?}, peak heap growth while loading {:?} MB, \
             generation {:.0} tokens/s, losses {:?}",
            r.load_s * 1e3,
            r.bytes_read,
            r.peak_mb.iter().map(|m| (m * 10.0).round() / 10.0).collect::<Vec<_>>(),
            r.gen_tokens_per_s,
            r.losses
        );
        if on_fixture {
            let el = rel(&r.logits, &exp.logits);
            let ls = ((r.loss - exp.loss) / exp.loss).abs() as f64;
            let eg = r
                .grads
                .iter()
                .map(|(n, g)| rel(g, &exp.grads.iter().find(|(m, _)| m == n).unwrap().1))
                .fold(0f64, f64::max);
            let same_ids = r.generated == exp.generated && r.grads.len() == exp.grads.len();
            line += &format!(
                "\n  vs transformers: logits {el:.2e}, loss {ls:.2e}, {} gradients {eg:.2e} (relative), generated ids {}",
                r.grads.len(),
                if same_ids {
                    "identical".to_string()
                } else if r.generated.dim() == exp.generated.dim() {
                    let n = exp.generated.ncols() - exp.prompt_len;
                    let first: Vec<usize> = (0..exp.generated.nrows())
                        .map(|row| (0..n).find(|&j| r.generated[[row, exp.prompt_len + j]] != exp.generated[[row, exp.prompt_len + j]]).unwrap_or(n))
                        .collect();
                    format!("different (the first {first:?} of {n} new tokens per row agree)")
                } else {
                    "DIFFERENT".to_string()
                }
            );
            // `<=` is false for NaN.
            ok &= el <= tol && ls <= tol && eg <= tol_grad && (same_ids || bf16);
            ok &= r.losses.iter().all(|l| l.is_finite());
            if !same_ids && !bf16 {
                line += &format!("\n  ours {:?}\n  transformers {:?}", r.generated, exp.generated);
            }
        }
        match &reference {
            None => reference = Some(r.losses.clone()),
            Some(first) => {
                // NaN counts as infinitely far (`f32::max` would skip it).
                let worst = first.iter().zip(&r.losses).map(|(x, y)| ((x - y) / x).abs()).fold(0f32, |m, d| {
                    if d.is_nan() {
                        f32::INFINITY
                    } else {
                        m.max(d)
                    }
                });
                line += &format!("\n  training losses vs the first mesh: {worst:.2e} relative");
                ok &= (worst as f64) <= tol;
            }
        }
        println!("{line}");
    }
    println!("{}", if ok { "PASS" } else { "FAIL" });
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
