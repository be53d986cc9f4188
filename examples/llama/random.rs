//! A random Llama checkpoint (`save_pretrained` layout: `config.json` and sharded
//! safetensors), for runs without a model: `llama --generate-mb` and `llama_bench`.

use dtensor::checkpoint::hf::LlamaConfig;
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::prelude::*;
use dtensor::{distribute_tensor, Replicate};
use std::path::Path;

/// The sizes of a Llama.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub hidden: usize,
    pub intermediate: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub layers: usize,
}

impl Shape {
    /// Llama-3.2-1B-like widths (hidden 1024, 16 heads over 8 key/value heads), as many layers
    /// as make about `mb` MB of f32.
    pub fn for_mb(mb: usize) -> Shape {
        let mut s =
            Shape { hidden: 1024, intermediate: 2816, heads: 16, kv_heads: 8, head_dim: 64, vocab: 32000, layers: 1 };
        let fixed = 4 * (s.params() - s.per_layer());
        s.layers = (mb * 1_000_000).saturating_sub(fixed).div_ceil(4 * s.per_layer()).max(1);
        s
    }

    /// Parameters of one decoder layer.
    pub fn per_layer(&self) -> usize {
        let (h, hd) = (self.hidden, self.head_dim);
        2 * h * self.heads * hd + 2 * h * self.kv_heads * hd + 3 * h * self.intermediate + 2 * h
    }

    /// Every parameter (untied head).
    pub fn params(&self) -> usize {
        2 * self.vocab * self.hidden + self.hidden + self.layers * self.per_layer()
    }
}

/// Writes a random Llama of `shape` (f32; norms ones, the rest uniform in ±0.05) to `dir`.
pub fn write(dir: &Path, s: &Shape) -> Result<()> {
    let cfg = serde_json::json!({
        "model_type": "llama", "vocab_size": s.vocab, "hidden_size": s.hidden, "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers, "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false
    });
    std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(dir.join("config.json"), cfg.to_string()))
        .map_err(|e| Error::InvalidArgument { context: format!("writing {}", dir.display()), reason: e.to_string() })?;
    let cfg = LlamaConfig::read(dir)?;
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut draw = |shape: &[usize], scale: f32| {
        ArrayD::from_shape_fn(IxDyn(shape), |_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        })
    };
    let tensors: Vec<(String, ArrayD<f32>)> = cfg
        .tensor_shapes()
        .into_iter()
        .map(|(n, shape)| {
            let a = if n.ends_with("norm.weight") { ArrayD::ones(IxDyn(&shape)) } else { draw(&shape, 0.1) };
            (n, a)
        })
        .collect();
    println!(
        "writing a random Llama checkpoint: {} layers, {:.0} MB, to {}",
        s.layers,
        (4 * s.params()) as f64 / 1e6,
        dir.display()
    );
    dtensor::run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let state: Vec<(String, DTensor<f32>)> = tensors
            .iter()
            .map(|(n, a)| Ok((n.clone(), distribute_tensor(a, &mesh, &[Replicate], None)?)))
            .collect::<Result<_>>()?;
        dtensor::checkpoint::hf::save_sharded(dir, &state, 500_000_000)
    })?;
    Ok(())
}
