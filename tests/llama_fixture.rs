//! The `examples/llama` model against transformers' fixtures (`scripts/gen_llama_fixture.py`:
//! untied with plain RoPE, and tied with Llama 3's rotary scaling):
//! built by `load_hf` from the committed `save_pretrained` directory on 1×1, 2×2 and 1×2, its
//! logits and loss within 1e-4 relative of transformers' in f32 and its greedy generation
//! with a KV cache identical. (The example also checks gradients and training.)

mod fixture_util;

#[path = "../examples/llama/model.rs"]
#[allow(dead_code)]
mod model;

use dtensor::checkpoint::hf::{HfCheckpoint, LlamaConfig};
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::Dt;
use fixture_util::{data, ids, json};
use model::{Ids, Llama, LlamaForCausalLM};
use std::path::Path;

fn fixture(name: &str) -> (std::path::PathBuf, serde_json::Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/llama").join(name);
    let v = json(&dir, "expected.json");
    (dir, v)
}

/// The untied Llama (plain RoPE) and the Llama 3.2-style one (head tied to the token table,
/// Llama 3's rotary scaling).
#[test]
fn llama_matches_transformers_on_every_mesh() {
    for name in ["fixture", "fixture-tied"] {
        check(name);
    }
}

fn check(name: &str) {
    let (dir, exp) = fixture(name);
    let cfg = LlamaConfig::read(&dir).unwrap();
    let (input, labels, generated) = (ids(&exp["input_ids"]), ids(&exp["labels"]), ids(&exp["generated"]));
    let want = data(&exp["logits"]);
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let (want_loss, prompt_len) = (exp["loss"].as_f64().unwrap() as f32, exp["prompt_len"].as_u64().unwrap() as usize);
    let new = generated.ncols() - prompt_len;
    for (dp, tp) in [(1, 1), (2, 2), (1, 2)] {
        let out = dtensor::run(dp * tp, |ctx| {
            let mesh = ctx.init_device_mesh(&[dp, tp], &["dp", "tp"])?;
            let model = LlamaForCausalLM::<f32>::load_hf(&mut HfCheckpoint::open(&dir)?, "", &mesh)?;
            let llama = Llama::new(cfg.clone(), generated.ncols(), &mesh)?;
            let x: Ids = Dt::distribute(&input.clone().into_dyn(), &mesh)?;
            let y: Ids = Dt::distribute(&labels.clone().into_dyn(), &mesh)?;
            let logits = llama.logits(&model, &x, 0, None)?.full_tensor()?;
            let loss = llama.loss(&model, &x, &y)?.full_tensor()?.sum();
            let prompt: Ids =
                Dt::distribute(&input.slice(dtensor::ndarray::s![.., ..prompt_len]).to_owned().into_dyn(), &mesh)?;
            let gen = llama.generate(&model, &prompt, new, &[], 0)?;
            Ok((logits, loss, gen))
        })
        .unwrap();
        for (logits, loss, gen) in out {
            let want = ArrayD::from_shape_vec(IxDyn(logits.shape()), want.clone()).unwrap();
            let err = logits.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
            assert!(err <= 1e-4, "{name} {dp}x{tp}: logits relative error {err}");
            assert!(((loss - want_loss) / want_loss).abs() <= 1e-4, "{name} {dp}x{tp}: loss {loss} vs {want_loss}");
            assert_eq!(gen, generated, "{name} {dp}x{tp}: greedy generation");
        }
    }
}
