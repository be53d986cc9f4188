//! A Hugging Face Llama (`LlamaForCausalLM`: RoPE, grouped-query attention, SwiGLU, RMSNorm,
//! untied or tied LM head) written with `#[distribute]` structs and typed ops, on a mesh
//! `dp × tp`. The structs mirror transformers' module tree, so every parameter's dotted name
//! is the checkpoint's and `LlamaForCausalLM::load_hf` builds the model straight from a
//! `save_pretrained` directory, each rank reading only its shards.
//!
//! Layouts (dp, tp): activations `[batch, seq, hidden]` `(Shard(0), Replicate)`; q/k/v,
//! gate/up and the LM head column-parallel (weights `[out, in]`, `(Replicate, Shard(0))`), so
//! heads and MLP features live on tp; o/down row-parallel `(Replicate, Shard(1))`; the token
//! table vocab-parallel; norms replicated. The collectives are the `redistribute` calls you
//! see (the row-parallel outputs' all-reduces, the embedding's), loss parallelism's statistics
//! (`cross_entropy_sum_loss_parallel`), and the explicit gathers of generation.

use dtensor::checkpoint::hf::LlamaConfig;
use dtensor::distribute;
use dtensor::ops::rotary::RotaryStyle;
use dtensor::prelude::*;
use dtensor::typed::attention::scaled_dot_product_attention;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::rotary::{rotary_tables_from_frequencies, RotaryTable};
use dtensor::typed::{Dim, Dims, Dt, Sum};
use dtensor::Element;

/// The mesh type: data parallel × tensor parallel.
pub type M = (dp, tp);
/// Activations `[batch, seq, hidden]`: the batch over dp, replicated over tp.
pub type Hidden<T> = Dt<T, M, (Shard<0>, Replicate), 3>;
/// Per-head tensors `[batch, heads, seq, head_dim]`: heads over tp.
pub type Heads<T> = Dt<T, M, (Shard<0>, Shard<1>), 4>;
/// Token ids `[batch, seq]`.
pub type Ids = Dt<i64, M, (Shard<0>, Replicate), 2>;
/// Logits `[batch, seq, vocab]`: the vocabulary over tp.
pub type Logits<T> = Dt<T, M, (Shard<0>, Shard<2>), 3>;

/// `nn.Linear` without bias, column-parallel: weight `[out, in]` sharded on its output rows.
#[distribute(mesh = "dp,tp")]
pub struct ColLinear<T: Element> {
    #[placements = [Replicate, Shard(0)]]
    pub weight: DTensor<T>,
}

/// `nn.Linear` without bias, row-parallel: weight `[out, in]` sharded on its input columns.
#[distribute(mesh = "dp,tp")]
pub struct RowLinear<T: Element> {
    #[placements = [Replicate, Shard(1)]]
    pub weight: DTensor<T>,
}

/// `LlamaRMSNorm`: a replicated `[hidden]` scale.
#[distribute(mesh = "dp,tp")]
pub struct RmsNorm<T: Element> {
    #[placements = [Replicate, Replicate]]
    pub weight: DTensor<T, 1>,
}

/// The token table `[vocab, hidden]`, vocab-parallel.
#[distribute(mesh = "dp,tp")]
pub struct Embedding<T: Element> {
    #[placements = [Replicate, Shard(0)]]
    pub weight: DTensor<T>,
}

/// `LlamaAttention`.
#[distribute(mesh = "dp,tp", elem = T)]
pub struct Attention<T: Element> {
    pub q_proj: ColLinear<T>,
    pub k_proj: ColLinear<T>,
    pub v_proj: ColLinear<T>,
    pub o_proj: RowLinear<T>,
}

/// `LlamaMLP` (SwiGLU).
#[distribute(mesh = "dp,tp", elem = T)]
pub struct Mlp<T: Element> {
    pub gate_proj: ColLinear<T>,
    pub up_proj: ColLinear<T>,
    pub down_proj: RowLinear<T>,
}

/// `LlamaDecoderLayer`.
#[distribute(mesh = "dp,tp", elem = T)]
pub struct DecoderLayer<T: Element> {
    pub self_attn: Attention<T>,
    pub mlp: Mlp<T>,
    pub input_layernorm: RmsNorm<T>,
    pub post_attention_layernorm: RmsNorm<T>,
}

/// `LlamaModel`.
#[distribute(mesh = "dp,tp", elem = T)]
pub struct LlamaModel<T: Element> {
    pub embed_tokens: Embedding<T>,
    pub layers: Vec<DecoderLayer<T>>,
    pub norm: RmsNorm<T>,
}

/// `LlamaForCausalLM`; `lm_head` is absent when the checkpoint ties it to the token table.
#[distribute(mesh = "dp,tp", elem = T)]
pub struct LlamaForCausalLM<T: Element> {
    pub model: LlamaModel<T>,
    pub lm_head: Option<ColLinear<T>>,
}

/// What the forward needs besides the weights: the configuration and the rotary tables.
pub struct Llama<T: Element> {
    pub cfg: LlamaConfig,
    cos: RotaryTable<T, M>,
    sin: RotaryTable<T, M>,
}

/// Keys and values of the positions seen so far, per layer (`[batch, kv_heads, t, head_dim]`,
/// heads over tp): generation appends one position per step instead of recomputing.
pub struct KvCache<T: Element> {
    layers: Vec<Option<(Heads<T>, Heads<T>)>>,
    /// Positions held.
    pub len: usize,
}

impl<T: Element> Default for KvCache<T> {
    fn default() -> Self {
        KvCache { layers: Vec::new(), len: 0 }
    }
}

/// The rows `[start, start + len)` of a rotary table: the positions of this step.
fn positions<T: Element>(x: &RotaryTable<T, M>, start: usize, len: usize) -> Result<RotaryTable<T, M>> {
    x.narrow(Dim::<0>, start, len)
}

impl<T: Element> Llama<T> {
    /// Rotary tables for `max_positions` positions (replicated), for `cfg`. Refused, naming
    /// the heads, when tp does not divide the query and key/value heads: the struct shards
    /// q/k/v by whole heads (transformers' plan decides it); refused when a sliding window
    /// shorter than `max_positions` would apply.
    pub fn new(cfg: LlamaConfig, max_positions: usize, mesh: &DeviceMesh) -> Result<Llama<T>> {
        cfg.tp_plan(mesh, "tp", dtensor::checkpoint::hf::KvHeads::Shard)?;
        // Mistral's sliding window changes nothing while every position sees all the others.
        if let Some(w) = cfg.sliding_window.filter(|&w| w < max_positions) {
            return Err(Error::InvalidArgument {
                context: "Llama::new".into(),
                reason: format!(
                    "sliding-window attention ({w} positions) over {max_positions} positions is not implemented"
                ),
            });
        }
        // RoPE's frequencies as the config gives them (Llama 3's scaling included).
        let (cos, sin) =
            rotary_tables_from_frequencies::<T, M>(max_positions, &cfg.rope_frequencies(), RotaryStyle::Half, mesh)?;
        Ok(Llama { cfg, cos, sin })
    }

    /// `[b, s, hidden]` → `[b, n, s, head_dim]` through a column-parallel projection: the
    /// heads land on tp, no communication.
    fn heads(&self, x: &Hidden<T>, w: &ColLinear<T>, n: usize) -> Result<Heads<T>> {
        let y: Dt<T, M, (Shard<0>, Shard<2>), 3> = x.linear(&w.weight)?;
        let y: Dt<T, M, (Shard<0>, Shard<2>), 4> = y.unflatten(Dim::<2>, [n, self.cfg.head_dim()])?;
        y.transpose(Dim::<1>, Dim::<2>)
    }

    /// Self-attention of positions `[start, start + s)`; with a cache, attends to the cached
    /// positions too and appends this step's keys and values. One all-reduce over tp.
    fn attention(
        &self,
        x: &Hidden<T>,
        a: &Attention<T>,
        start: usize,
        cache: Option<&mut Option<(Heads<T>, Heads<T>)>>,
    ) -> Result<Hidden<T>> {
        let (nh, nkv, s) = (self.cfg.num_attention_heads, self.cfg.kv_heads(), x.shape()[1]);
        let (cos, sin) = (positions(&self.cos, start, s)?, positions(&self.sin, start, s)?);
        let q = self.heads(x, &a.q_proj, nh)?.apply_rotary(&cos, &sin, RotaryStyle::Half)?;
        let mut k = self.heads(x, &a.k_proj, nkv)?.apply_rotary(&cos, &sin, RotaryStyle::Half)?;
        let mut v = self.heads(x, &a.v_proj, nkv)?;
        if let Some(slot) = cache {
            if let Some((ck, cv)) = slot.as_ref() {
                k = Dt::cat(&[ck, &k], Dim::<2>)?;
                v = Dt::cat(&[cv, &v], Dim::<2>)?;
            }
            *slot = Some((k.clone(), v.clone()));
        }
        // Grouped-query attention: each key/value head serves nh / nkv query heads (whole
        // groups per tp rank: the tp plan shards by whole key/value heads).
        let (k, v) = (k.repeat_interleave(nh / nkv, Dim::<1>)?, v.repeat_interleave(nh / nkv, Dim::<1>)?);
        // Causal among new positions that start at 0; a single new position sees them all.
        let o: Heads<T> = scaled_dot_product_attention(&q, &k, &v, start == 0 && s > 1, None)?;
        let o: Dt<T, M, (Shard<0>, Shard<2>), 4> = o.transpose(Dim::<1>, Dim::<2>)?;
        let o: Dt<T, M, (Shard<0>, Shard<2>), 3> = o.flatten(Dims::<2, 3>)?;
        let o: Dt<T, M, (Shard<0>, Partial<Sum>), 3> = o.linear(&a.o_proj.weight)?;
        o.redistribute()
    }

    /// SwiGLU: `down(silu(gate(x)) · up(x))`. One all-reduce over tp.
    fn mlp(&self, x: &Hidden<T>, m: &Mlp<T>) -> Result<Hidden<T>> {
        let g: Dt<T, M, (Shard<0>, Shard<2>), 3> = x.linear(&m.gate_proj.weight)?;
        let u: Dt<T, M, (Shard<0>, Shard<2>), 3> = x.linear(&m.up_proj.weight)?;
        let y: Dt<T, M, (Shard<0>, Partial<Sum>), 3> = g.silu()?.mul(&u)?.linear(&m.down_proj.weight)?;
        y.redistribute()
    }

    fn norm(&self, x: &Hidden<T>, n: &RmsNorm<T>) -> Result<Hidden<T>> {
        x.rms_norm([self.cfg.hidden_size], Some(&n.weight), self.cfg.rms_norm_eps)
    }

    /// Logits of `ids` `[batch, s]` at positions `[start, start + s)`, vocabulary over tp.
    /// Without a cache `start` is 0; with one, the cache holds positions `[0, start)` and gets
    /// these (a prompt at `start` 0, then one token per step).
    pub fn logits(
        &self,
        model: &LlamaForCausalLM<T>,
        ids: &Ids,
        start: usize,
        mut cache: Option<&mut KvCache<T>>,
    ) -> Result<Logits<T>> {
        let s = ids.shape()[1];
        if start > 0 && s != 1 {
            return Err(Error::InvalidArgument {
                context: "Llama::logits".into(),
                reason: format!("after the prompt the cache takes one position per step, not {s}"),
            });
        }
        let body = &model.model;
        let x: Dt<T, M, (Shard<0>, Partial<Sum>), 3> = body.embed_tokens.weight.embedding(ids)?;
        let mut x: Hidden<T> = x.redistribute()?;
        if let Some(c) = cache.as_deref_mut() {
            if c.len != start {
                return Err(Error::InvalidArgument {
                    context: "Llama::logits".into(),
                    reason: format!("the cache holds {} positions, the step starts at {start}", c.len),
                });
            }
            c.layers.resize_with(body.layers.len(), || None);
        }
        for (l, layer) in body.layers.iter().enumerate() {
            let slot = cache.as_deref_mut().map(|c| &mut c.layers[l]);
            let h = self.norm(&x, &layer.input_layernorm)?;
            x = x.add(&self.attention(&h, &layer.self_attn, start, slot)?)?;
            let h = self.norm(&x, &layer.post_attention_layernorm)?;
            x = x.add(&self.mlp(&h, &layer.mlp)?)?;
        }
        if let Some(c) = cache {
            c.len = start + s;
        }
        let x = self.norm(&x, &body.norm)?;
        match &model.lm_head {
            Some(head) => x.linear(&head.weight),
            None => x.linear(&body.embed_tokens.weight),
        }
    }

    /// transformers' causal-LM loss: the mean cross-entropy of the logits at positions
    /// `0..s-1` against the labels at `1..s`, over the labels that are not -100. Loss
    /// parallel over tp; the sum's and the count's all-reduces are the two redistributes.
    pub fn loss(
        &self,
        model: &LlamaForCausalLM<T>,
        ids: &Ids,
        labels: &Ids,
    ) -> Result<Dt<T, M, (Replicate, Replicate), 0>> {
        let s = ids.shape()[1];
        if s < 2 {
            return Err(Error::InvalidArgument {
                context: "Llama::loss".into(),
                reason: format!("a causal-LM loss needs at least 2 positions (one to predict from), got {s}"),
            });
        }
        let logits = self.logits(model, ids, 0, None)?.narrow(Dim::<1>, 0, s - 1)?;
        let targets = labels.narrow(Dim::<1>, 1, s - 1)?;
        let total: Dt<T, M, (Partial<Sum>, Partial<Sum>), 0> =
            logits.cross_entropy_sum_loss_parallel(&targets, Some(-100))?;
        // Counted exactly in f32 (a bf16 sum of ones stops being exact at 256).
        let count: Dt<f32, M, (Partial<Sum>, Replicate), 0> = targets.count_ne(-100)?;
        let total: Dt<T, M, (Replicate, Replicate), 0> = total.redistribute()?;
        let count: Dt<f32, M, (Replicate, Replicate), 0> = count.redistribute()?;
        total.div(&count.cast::<T>()?)
    }

    /// Greedy decoding with a KV cache (transformers' `generate(do_sample=False)`): `new`
    /// tokens after `prompt` `[batch, s]`; a row that produced one of the `eos` ids continues
    /// with `pad`, and decoding stops when every row has.
    /// Returns the prompt and the new tokens, `[batch, s + new]`, on every rank.
    pub fn generate(
        &self,
        model: &LlamaForCausalLM<T>,
        prompt: &Ids,
        new: usize,
        eos: &[i64],
        pad: i64,
    ) -> Result<ndarray::Array2<i64>> {
        let mesh = prompt.device_mesh().clone();
        let full = prompt.full_tensor()?;
        let (b, s) = (full.shape()[0], full.shape()[1]);
        if s == 0 {
            return Err(Error::InvalidArgument {
                context: "Llama::generate".into(),
                reason: "the prompt is empty".into(),
            });
        }
        let mut out = ndarray::Array2::<i64>::zeros((b, s + new));
        out.slice_mut(ndarray::s![.., ..s]).assign(&full.into_dimensionality::<ndarray::Ix2>().expect("2-d ids"));
        let mut cache = KvCache::default();
        let mut done = vec![false; b];
        let mut ids = prompt.clone();
        for step in 0..new {
            let start = cache.len;
            let logits = no_grad(|| self.logits(model, &ids, start, Some(&mut cache)))?;
            let n = logits.shape()[1];
            let last: Dt<T, M, (Shard<0>, Shard<2>), 3> = logits.narrow(Dim::<1>, n - 1, 1)?;
            // The argmax needs the whole vocabulary: gather it over tp (the one collective of
            // the step besides the layers' all-reduces).
            let last: Dt<T, M, (Shard<0>, Replicate), 3> = last.redistribute()?;
            let next: Dt<i64, M, (Shard<0>, Replicate), 3> = last.argmax(Dim::<2>)?;
            let next: Ids = next.squeeze(Dim::<2>)?;
            let mut tokens = next.full_tensor()?;
            for (r, t) in tokens.iter_mut().enumerate() {
                if done[r] {
                    *t = pad;
                }
                done[r] |= eos.contains(t);
                out[[r, s + step]] = *t;
            }
            if done.iter().all(|&d| d) {
                for r in 0..b {
                    out.slice_mut(ndarray::s![r, s + step + 1..]).fill(pad);
                }
                break;
            }
            ids = Dt::distribute(&tokens, &mesh)?;
        }
        Ok(out)
    }
}
