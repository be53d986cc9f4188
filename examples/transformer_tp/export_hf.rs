//! `--export-hf DIR`: the trained model as a Hugging Face GPT-2 checkpoint that `transformers`
//! loads with `GPT2LMHeadModel.from_pretrained(DIR)`, and this run's logits on one batch for
//! `scripts/check_hf_export.py` to compare with transformers' on the exported weights.
//!
//! The model is GPT-2 without biases or learned positions, with an untied LM head, so the
//! mapping is: q, k, v fused into `attn.c_attn.weight` `[width, 3·width]` (GPT-2's `Conv1D`
//! keeps `[in, out]`, as this model does) in that order, every bias and `wpe` zero,
//! `lm_head.weight` the transposed head (`nn.Linear` keeps `[out, in]`), `tie_word_embeddings`
//! false, and the tanh GELU (`gelu_new`, GPT-2's own, which `gelu()` here computes).

use super::model::{Gpt, GptConfig};
use dtensor::checkpoint::hf;
use dtensor::distribute_tensor;
use dtensor::prelude::*;
use ndarray::{concatenate, ArrayD, Axis};
use std::path::Path;

/// Writes the GPT-2 checkpoint (in files of at most a third of the model, so the export is
/// sharded with an index), `config.json`, and `dtensor_logits.json` with `ids` and `logits`.
/// Collective: every rank calls it.
pub fn export(
    model: &Gpt,
    cfg: &GptConfig,
    mesh: &DeviceMesh,
    dir: &Path,
    ids: &ArrayD<i64>,
    logits: &ArrayD<f64>,
) -> Result<()> {
    let full: std::collections::BTreeMap<String, ArrayD<f64>> =
        model.named_parameters().into_iter().map(|(n, p)| Ok((n, p.full_tensor()?))).collect::<Result<_>>()?;
    let w = cfg.width;
    let zeros = |n: usize| ArrayD::<f64>::zeros(vec![n]);
    let mut out: Vec<(String, ArrayD<f64>)> = vec![
        ("transformer.wte.weight".into(), full["wte"].clone()),
        ("transformer.wpe.weight".into(), ArrayD::zeros(vec![cfg.seq, w])),
    ];
    for l in 0..cfg.layers {
        let (b, h) = (format!("blocks.{l}"), format!("transformer.h.{l}"));
        let qkv = concatenate(
            Axis(1),
            &[full[&format!("{b}.wq")].view(), full[&format!("{b}.wk")].view(), full[&format!("{b}.wv")].view()],
        )
        .map_err(|e| Error::InvalidArgument { context: "export_hf".into(), reason: e.to_string() })?;
        out.extend([
            (format!("{h}.ln_1.weight"), full[&format!("{b}.ln1_w")].clone()),
            (format!("{h}.ln_1.bias"), full[&format!("{b}.ln1_b")].clone()),
            (format!("{h}.attn.c_attn.weight"), qkv),
            (format!("{h}.attn.c_attn.bias"), zeros(3 * w)),
            (format!("{h}.attn.c_proj.weight"), full[&format!("{b}.wo")].clone()),
            (format!("{h}.attn.c_proj.bias"), zeros(w)),
            (format!("{h}.ln_2.weight"), full[&format!("{b}.ln2_w")].clone()),
            (format!("{h}.ln_2.bias"), full[&format!("{b}.ln2_b")].clone()),
            (format!("{h}.mlp.c_fc.weight"), full[&format!("{b}.w1")].clone()),
            (format!("{h}.mlp.c_fc.bias"), zeros(4 * w)),
            (format!("{h}.mlp.c_proj.weight"), full[&format!("{b}.w2")].clone()),
            (format!("{h}.mlp.c_proj.bias"), zeros(w)),
        ]);
    }
    out.extend([
        ("transformer.ln_f.weight".into(), full["lnf_w"].clone()),
        ("transformer.ln_f.bias".into(), full["lnf_b"].clone()),
        ("lm_head.weight".into(), full["head"].t().as_standard_layout().into_owned()),
    ]);
    let total: usize = out.iter().map(|(_, a)| a.len() * 8).sum();
    let state: Vec<(String, DTensor<f64>)> = out
        .iter()
        .map(|(n, a)| Ok((n.clone(), distribute_tensor(a, mesh, &vec![Replicate; mesh.ndim()], None)?)))
        .collect::<Result<_>>()?;
    hf::save_sharded(dir, &state, (total / 3) as u64)?;
    if mesh.rank() == mesh.ranks()[0] {
        let config = serde_json::json!({
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "bos_token_id": null,
            "eos_token_id": null,
            "vocab_size": cfg.vocab,
            "n_embd": w,
            "n_layer": cfg.layers,
            "n_head": cfg.heads,
            "n_inner": 4 * w,
            "n_positions": cfg.seq,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "scale_attn_weights": true,
            "tie_word_embeddings": false,
            "torch_dtype": "float64",
        });
        let reference = serde_json::json!({
            "ids": { "shape": ids.shape(), "data": ids.iter().collect::<Vec<_>>() },
            "logits": { "shape": logits.shape(), "data": logits.iter().collect::<Vec<_>>() },
        });
        let io = |e: std::io::Error| Error::Checkpoint { path: dir.display().to_string(), reason: e.to_string() };
        std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config).expect("plain JSON")).map_err(io)?;
        std::fs::write(dir.join("dtensor_logits.json"), serde_json::to_vec(&reference).expect("plain JSON"))
            .map_err(io)?;
    }
    mesh.barrier(dtensor::Along::All)
}
