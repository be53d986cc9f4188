//! The Llama family's `config.json` (Llama, Mistral: the same tensors) and the
//! tensor-parallel load plan transformers ships for it (`base_model_tp_plan`, with
//! `lm_head` column-parallel), checked against the heads so that no head is ever split.

use super::{HfCheckpoint, LoadPlan};
use crate::checkpoint::safe_file::{SafeDir, MAX_INDEX_BYTES};
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::module::{ColwiseParallel, LayerKind, RowwiseParallel};
use crate::placement::Placement;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// File name of a Hugging Face model's configuration.
pub const CONFIG_FILE: &str = "config.json";

fn default_eps() -> f64 {
    1e-6
}

fn default_theta() -> f64 {
    10_000.0
}

/// The fields of a Llama-family `config.json` that fix the tensors and the math (other fields
/// are ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// Rows of `embed_tokens` and `lm_head`.
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); absent: as many as query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Width of one head; absent: `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Rotary base.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Whether `lm_head` is `embed_tokens` (then the checkpoint has no `lm_head.weight`).
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// `"llama"`, `"mistral"`, ... when given.
    #[serde(default)]
    pub model_type: Option<String>,
    /// The MLP activation; absent or `"silu"` (SwiGLU) is the only one implemented.
    #[serde(default)]
    pub hidden_act: Option<String>,
    /// Biases on q/k/v/o (`attention_bias`) or the MLP (`mlp_bias`): not part of the Llama
    /// tensors this reader lists; refused when true.
    #[serde(default)]
    pub attention_bias: bool,
    /// See [`attention_bias`](Self::attention_bias).
    #[serde(default)]
    pub mlp_bias: bool,
    /// Mistral's sliding-window attention: each position attends to the last `sliding_window`
    /// positions only. A forward over more positions than that must apply the window.
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// The rotary scaling `rope_parameters` / `rope_scaling` asks for (read by
    /// [`from_json`](Self::from_json); not a JSON field of its own).
    #[serde(skip)]
    pub rope_scaling: RopeScaling,
}

/// A rotary-embedding scaling of the inverse frequencies, as transformers computes them
/// (`modeling_rope_utils.py`); [`LlamaConfig::rope_frequencies`] applies it.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_type` `default`).
    #[default]
    None,
    /// `linear`: every frequency divided by `factor`.
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// `llama3` (Llama 3.1 and later): low frequencies divided by `factor`, high ones kept,
    /// the band between interpolated.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// `original_max_position_embeddings / low_freq_factor` is the low-frequency wavelength.
        low_freq_factor: f64,
        /// `original_max_position_embeddings / high_freq_factor` is the high-frequency wavelength.
        high_freq_factor: f64,
        /// The pretraining context length.
        original_max_position_embeddings: f64,
    },
}

impl RopeScaling {
    /// `inv_freq` scaled.
    pub fn apply(&self, inv_freq: &[f64]) -> Vec<f64> {
        match *self {
            RopeScaling::None => inv_freq.to_vec(),
            RopeScaling::Linear { factor } => inv_freq.iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                inv_freq
                    .iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        }
    }
}

/// Where a `config.json` may say the rotary base and its scaling: `rope_theta` (transformers
/// 4), `rope_parameters` (transformers 5: `{"rope_theta": .., "rope_type": ..}`) and the
/// legacy `rope_scaling`.
#[derive(Deserialize)]
struct RopeFields {
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
}

impl RopeFields {
    /// The rotary base the config gives, if any; an error for a scaling or two bases that
    /// disagree.
    fn theta(&self) -> std::result::Result<Option<f64>, String> {
        let nested = match self.rope_parameters.as_ref().and_then(|v| v.get("rope_theta")) {
            None => None,
            Some(t) => Some(t.as_f64().ok_or("`rope_parameters.rope_theta` is not a number")?),
        };
        match (self.rope_theta, nested) {
            (Some(a), Some(b)) if a != b => {
                Err(format!("`rope_theta` {a} and `rope_parameters.rope_theta` {b} disagree"))
            }
            (a, b) => Ok(b.or(a)),
        }
    }

    /// The scaling asked for; an error naming the field for one this reader does not
    /// implement, for a partial rotary factor, or for a missing or bad parameter.
    fn scaling(&self) -> std::result::Result<RopeScaling, String> {
        let mut found = RopeScaling::None;
        for (field, v) in [("rope_parameters", &self.rope_parameters), ("rope_scaling", &self.rope_scaling)] {
            let Some(v) = v.as_ref().filter(|v| !v.is_null()) else { continue };
            let Some(obj) = v.as_object() else { return Err(format!("`{field}` is not an object")) };
            let num = |key: &str| -> std::result::Result<f64, String> {
                let x = obj
                    .get(key)
                    .and_then(|x| x.as_f64())
                    .ok_or(format!("`{field}.{key}` is missing or not a number"))?;
                if x.is_finite() && x > 0.0 {
                    Ok(x)
                } else {
                    Err(format!("`{field}.{key}` {x} must be finite and > 0"))
                }
            };
            if let Some(p) = obj.get("partial_rotary_factor").and_then(|p| p.as_f64()).filter(|&p| p != 1.0) {
                return Err(format!(
                    "`{field}.partial_rotary_factor` {p}: partial rotary embeddings are not implemented"
                ));
            }
            let kind = obj.get("rope_type").or_else(|| obj.get("type")).and_then(|t| t.as_str()).unwrap_or("default");
            let this = match kind {
                "default" => RopeScaling::None,
                "linear" => RopeScaling::Linear { factor: num("factor")? },
                "llama3" => {
                    let s = RopeScaling::Llama3 {
                        factor: num("factor")?,
                        low_freq_factor: num("low_freq_factor")?,
                        high_freq_factor: num("high_freq_factor")?,
                        original_max_position_embeddings: num("original_max_position_embeddings")?,
                    };
                    if let RopeScaling::Llama3 { low_freq_factor: lo, high_freq_factor: hi, .. } = s {
                        if hi <= lo {
                            return Err(format!("`{field}`: high_freq_factor {hi} must exceed low_freq_factor {lo}"));
                        }
                    }
                    s
                }
                other => {
                    return Err(format!(
                        "`{field}` asks for rotary scaling `{other}`, which this reader does not implement (its \
                         frequencies differ from the ones it would compute; implemented: default, linear, llama3)"
                    ))
                }
            };
            if this != RopeScaling::None {
                if found != RopeScaling::None && found != this {
                    return Err(format!(
                        "`rope_parameters` and `rope_scaling` ask for different scalings: {found:?}, {this:?}"
                    ));
                }
                found = this;
            }
        }
        Ok(found)
    }
}

/// What a tensor-parallel plan does with the key/value projections when tp does not divide
/// the key/value heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvHeads {
    /// Column-parallel like the queries; refused (naming the heads) when tp does not divide
    /// the key/value heads, so a head is never cut in the middle.
    #[default]
    Shard,
    /// Every tp rank loads all key/value heads (Megatron and vLLM replicate them when tp
    /// exceeds their number); the attention then picks the heads its query heads use.
    Replicate,
}

impl LlamaConfig {
    /// Reads and checks `dir/config.json` (a regular file of the directory, at most
    /// [`MAX_INDEX_BYTES`]).
    pub fn read(dir: impl AsRef<Path>) -> Result<LlamaConfig> {
        let dir = dir.as_ref();
        let mut f = SafeDir::new(dir)?.open(CONFIG_FILE)?;
        let text = f.read_all(MAX_INDEX_BYTES)?;
        Self::from_json(&text, &dir.join(CONFIG_FILE))
    }

    /// Parses and checks a `config.json`'s text (`path` names it in errors). The rotary base
    /// is read from `rope_theta` or from transformers 5's `rope_parameters`, and the scaling
    /// from `rope_parameters` or the legacy `rope_scaling` into
    /// [`rope_scaling`](Self::rope_scaling): `linear` and `llama3` are implemented, any other
    /// (`yarn`, `dynamic`, `longrope`, a partial rotary factor) is refused, naming it, since
    /// plain tables would give other frequencies. Read configs through this (or
    /// [`read`](Self::read)): deserializing the struct directly leaves the scaling out.
    pub fn from_json(text: &[u8], path: &Path) -> Result<LlamaConfig> {
        let bad = |reason: String| Error::Checkpoint { path: path.display().to_string(), reason };
        let mut cfg: LlamaConfig = serde_json::from_slice(text).map_err(|e| bad(format!("not a Llama config: {e}")))?;
        let rope: RopeFields = serde_json::from_slice(text).map_err(|e| bad(format!("not a Llama config: {e}")))?;
        cfg.rope_theta = rope.theta().map_err(bad)?.unwrap_or(cfg.rope_theta);
        cfg.rope_scaling = rope.scaling().map_err(bad)?;
        cfg.validate().map_err(bad)?;
        Ok(cfg)
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// The rotary inverse frequencies of one head (`head_dim / 2` of them): `rope_theta`'s,
    /// scaled as [`rope_scaling`](Self::rope_scaling) says. Build the tables with
    /// [`RotaryStyle::tables_from_frequencies`](crate::ops::rotary::RotaryStyle::tables_from_frequencies).
    pub fn rope_frequencies(&self) -> Vec<f64> {
        self.rope_scaling.apply(&crate::ops::rotary::default_frequencies(self.head_dim(), self.rope_theta))
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    fn validate(&self) -> std::result::Result<(), String> {
        if let Some(t) = &self.model_type {
            if !["llama", "mistral"].contains(&t.as_str()) {
                return Err(format!("model_type `{t}` is not of the Llama family (llama, mistral)"));
            }
        }
        // transformers' `swish` is the same function as `silu`.
        if let Some(act) = self.hidden_act.as_deref().filter(|a| !["silu", "swish"].contains(a)) {
            return Err(format!("hidden_act `{act}` is not implemented (the Llama family's MLP is SwiGLU: `silu`)"));
        }
        for (field, on) in [("attention_bias", self.attention_bias), ("mlp_bias", self.mlp_bias)] {
            if on {
                return Err(format!("`{field}` is true: biased Llama projections are not among this reader's tensors"));
            }
        }
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("head_dim", self.head_dim()),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(format!("`{name}` must be positive"));
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {} (and no head_dim is given)",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !self.num_attention_heads.is_multiple_of(self.kv_heads()) {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.kv_heads()
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(format!("rms_norm_eps {} must be finite and > 0", self.rms_norm_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!("rope_theta {} must be finite and > 0", self.rope_theta));
        }
        let too_big = |a: usize, b: usize| a.checked_mul(b).is_none_or(|n| n > isize::MAX as usize);
        if too_big(self.vocab_size, self.hidden_size)
            || too_big(self.intermediate_size, self.hidden_size)
            || too_big(self.num_attention_heads * self.head_dim(), self.hidden_size)
        {
            return Err("the sizes give a weight too large to exist".into());
        }
        Ok(())
    }

    /// The tensors of a `LlamaForCausalLM` checkpoint with this configuration: name and shape
    /// (`[out, in]` for projections).
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, i, hd) = (self.hidden_size, self.intermediate_size, self.head_dim());
        let (q, kv) = (self.num_attention_heads * hd, self.kv_heads() * hd);
        let mut v = vec![("model.embed_tokens.weight".to_string(), vec![self.vocab_size, h])];
        for l in 0..self.num_hidden_layers {
            let p = format!("model.layers.{l}");
            v.extend([
                (format!("{p}.input_layernorm.weight"), vec![h]),
                (format!("{p}.self_attn.q_proj.weight"), vec![q, h]),
                (format!("{p}.self_attn.k_proj.weight"), vec![kv, h]),
                (format!("{p}.self_attn.v_proj.weight"), vec![kv, h]),
                (format!("{p}.self_attn.o_proj.weight"), vec![h, q]),
                (format!("{p}.post_attention_layernorm.weight"), vec![h]),
                (format!("{p}.mlp.gate_proj.weight"), vec![i, h]),
                (format!("{p}.mlp.up_proj.weight"), vec![i, h]),
                (format!("{p}.mlp.down_proj.weight"), vec![h, i]),
            ]);
        }
        v.push(("model.norm.weight".to_string(), vec![h]));
        if !self.tie_word_embeddings {
            v.push(("lm_head.weight".to_string(), vec![self.vocab_size, h]));
        }
        v
    }

    /// Checks that `checkpoint` holds every tensor of [`tensor_shapes`](Self::tensor_shapes)
    /// with that shape: a configuration and weights that disagree are an error naming the
    /// tensor, before anything is loaded.
    pub fn check(&self, checkpoint: &mut HfCheckpoint) -> Result<()> {
        let path = checkpoint.listing().display().to_string();
        for (name, shape) in self.tensor_shapes() {
            let info = checkpoint.info(&name).map_err(|e| Error::Checkpoint {
                path: path.clone(),
                reason: format!("config.json describes a tensor `{name}` the weights lack ({e})"),
            })?;
            if info.shape != shape {
                return Err(Error::Checkpoint {
                    path: path.clone(),
                    reason: format!(
                        "config.json gives `{name}` the shape {shape:?}, the weights have {:?}",
                        info.shape
                    ),
                });
            }
        }
        Ok(())
    }

    /// The tensor-parallel plan over mesh dim `tp` of `mesh` (transformers' Llama plan):
    /// q/k/v, gate and up column-parallel, o and down row-parallel, the embedding row-parallel
    /// (vocabulary-sharded), `lm_head` column-parallel; norms replicated; every other mesh
    /// dim replicates.
    ///
    /// Refused, naming the heads, when tp does not divide the query heads (a query head would
    /// be cut in the middle), nor, with [`KvHeads::Shard`], the key/value heads.
    pub fn tp_plan(&self, mesh: &DeviceMesh, tp: &str, kv: KvHeads) -> Result<LoadPlan> {
        let n = mesh.size(mesh.dim_index(tp)?);
        let refuse = |what: &str, heads: usize, hint: &str| Error::InvalidArgument {
            context: "LlamaConfig::tp_plan".into(),
            reason: format!(
                "tp = {n} (mesh dim `{tp}`) does not divide the {heads} {what} heads: sharding them would cut \
                 a head in the middle{hint}"
            ),
        };
        if !self.num_attention_heads.is_multiple_of(n) {
            return Err(refuse("query", self.num_attention_heads, "; use a tp that divides them"));
        }
        if kv == KvHeads::Shard && !self.kv_heads().is_multiple_of(n) {
            return Err(refuse("key/value", self.kv_heads(), "; load them replicated (KvHeads::Replicate)"));
        }
        let col = || ColwiseParallel::new().mesh_dim(tp);
        let row = || RowwiseParallel::new().mesh_dim(tp);
        let (attn, mlp) = ("model.layers.*.self_attn", "model.layers.*.mlp");
        let mut plan = LoadPlan::new()
            .layer("model.embed_tokens", LayerKind::Embedding, row())
            .style(&format!("{attn}.q_proj"), col())
            .style(&format!("{attn}.o_proj"), row())
            .style(&format!("{mlp}.gate_proj"), col())
            .style(&format!("{mlp}.up_proj"), col())
            .style(&format!("{mlp}.down_proj"), row());
        plan = match kv {
            KvHeads::Shard => plan.style(&format!("{attn}.k_proj"), col()).style(&format!("{attn}.v_proj"), col()),
            KvHeads::Replicate => {
                let r = vec![Placement::Replicate; mesh.ndim()];
                plan.placements(&format!("{attn}.k_proj"), &r).placements(&format!("{attn}.v_proj"), &r)
            }
        };
        if !self.tie_word_embeddings {
            plan = plan.style("lm_head", col());
        }
        Ok(plan)
    }
}
