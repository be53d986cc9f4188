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
use dtensor::typed::rotary::{rotary_tables, RotaryTable};
use dtensor::typed::{Dim, Dims, Dt, Sum};

/// The mesh type: data parallel × tensor parallel.
pub type M = (dp, tp);
/// Activations `[batch, seq, hidden]`: the batch over dp, replicated over tp.
pub type Hidden = Dt<f32, M, (Shard<0>, Replicate), 3>;
/// Per-head tensors `[batch, heads, seq, head_dim]`: heads over tp.
pub type Heads = Dt<f32, M, (Shard<0>, Shard<1>), 4>;
/// Token ids `[batch, seq]`.
pub type Ids = Dt<i64, M, (Shard<0>, Replicate), 2>;
/// Logits `[batch, seq, vocab]`: the vocabulary over tp.
pub type Logits = Dt<f32, M, (Shard<0>, Shard<2>), 3>;

/// `nn.Linear` without bias, column-parallel: weight `[out, in]` sharded on its output rows.
#[distribute(mesh = "dp,tp")]
pub struct ColLinear {
    #[placements = [Replicate, Shard(0)]]
    pub weight: DTensor<f32>,
}

/// `nn.Linear` without bias, row-parallel: weight `[out, in]` sharded on its input columns.
#[distribute(mesh = "dp,tp")]
pub struct RowLinear {
    #[placements = [Replicate, Shard(1)]]
    pub weight: DTensor<f32>,
}

/// `LlamaRMSNorm`: a replicated `[hidden]` scale.
#[distribute(mesh = "dp,tp")]
pub struct RmsNorm {
    #[placements = [Replicate, Replicate]]
    pub weight: DTensor<f32, 1>,
}

/// The token table `[vocab, hidden]`, vocab-parallel.
#[distribute(mesh = "dp,tp")]
pub struct Embedding {
    #[placements = [Replicate, Shard(0)]]
    pub weight: DTensor<f32>,
}

/// `LlamaAttention`.
#[distribute(mesh = "dp,tp")]
pub struct Attention {
    pub q_proj: ColLinear,
    pub k_proj: ColLinear,
    pub v_proj: ColLinear,
    pub o_proj: RowLinear,
}

/// `LlamaMLP` (SwiGLU).
#[distribute(mesh = "dp,tp")]
pub struct Mlp {
    pub gate_proj: ColLinear,
    pub up_proj: ColLinear,
    pub down_proj: RowLinear,
}

/// `LlamaDecoderLayer`.
#[distribute(mesh = "dp,tp")]
pub struct DecoderLayer {
    pub self_attn: Attention,
    pub mlp: Mlp,
    pub input_layernorm: RmsNorm,
    pub post_attention_layernorm: RmsNorm,
}

/// `LlamaModel`.
#[distribute(mesh = "dp,tp")]
pub struct LlamaModel {
    pub embed_tokens: Embedding,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
}

/// `LlamaForCausalLM`; `lm_head` is absent when the checkpoint ties it to the token table.
#[distribute(mesh = "dp,tp")]
pub struct LlamaForCausalLM {
    pub model: LlamaModel,
    pub lm_head: Option<ColLinear>,
}

/// What the forward needs besides the weights: the configuration and the rotary tables.
pub struct Llama {
    pub cfg: LlamaConfig,
    cos: RotaryTable<f32, M>,
    sin: RotaryTable<f32, M>,
}

/// Keys and values of the positions seen so far, per layer (`[batch, kv_heads, t, head_dim]`,
/// heads over tp): generation appends one position per step instead of recomputing.
#[derive(Default)]
pub struct KvCache {
    layers: Vec<Option<(Heads, Heads)>>,
    /// Positions held.
    pub len: usize,
}

/// The columns `[start, start + len)` of a layout-keeping op's dim 1.
fn positions(x: &RotaryTable<f32, M>, start: usize, len: usize) -> Result<RotaryTable<f32, M>> {
    x.narrow(Dim::<0>, start, len)
}

impl Llama {
    /// Rotary tables for `max_positions` positions (replicated), for `cfg`. Refused, naming
    /// the heads, when tp does not divide the query and key/value heads: the struct shards
    /// q/k/v by whole heads (transformers' plan decides it).
    pub fn new(cfg: LlamaConfig, max_positions: usize, mesh: &DeviceMesh) -> Result<Llama> {
        cfg.tp_plan(mesh, "tp", dtensor::checkpoint::hf::KvHeads::Shard)?;
        let (cos, sin) =
            rotary_tables::<f32, M>(max_positions, cfg.head_dim(), cfg.rope_theta, RotaryStyle::Half, mesh)?;
        Ok(Llama { cfg, cos, sin })
    }

    /// `[b, s, hidden]` → `[b, n, s, head_dim]` through a column-parallel projection: the
    /// heads land on tp, no communication.
    fn heads(&self, x: &Hidden, w: &ColLinear, n: usize) -> Result<Heads> {
        let y: Dt<f32, M, (Shard<0>, Shard<2>), 3> = x.linear(&w.weight)?;
        let y: Dt<f32, M, (Shard<0>, Shard<2>), 4> = y.unflatten(Dim::<2>, [n, self.cfg.head_dim()])?;
        y.transpose(Dim::<1>, Dim::<2>)
    }

    /// Self-attention of positions `[start, start + s)`; with a cache, attends to the cached
    /// positions too and appends this step's keys and values. One all-reduce over tp.
    fn attention(
        &self,
        x: &Hidden,
        a: &Attention,
        start: usize,
        cache: Option<&mut Option<(Heads, Heads)>>,
    ) -> Result<Hidden> {
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
        let o: Heads = scaled_dot_product_attention(&q, &k, &v, start == 0 && s > 1, None)?;
        let o: Dt<f32, M, (Shard<0>, Shard<2>), 4> = o.transpose(Dim::<1>, Dim::<2>)?;
        let o: Dt<f32, M, (Shard<0>, Shard<2>), 3> = o.flatten(Dims::<2, 3>)?;
        let o: Dt<f32, M, (Shard<0>, Partial<Sum>), 3> = o.linear(&a.o_proj.weight)?;
        o.redistribute()
    }

    /// SwiGLU: `down(silu(gate(x)) · up(x))`. One all-reduce over tp.
    fn mlp(&self, x: &Hidden, m: &Mlp) -> Result<Hidden> {
        let g: Dt<f32, M, (Shard<0>, Shard<2>), 3> = x.linear(&m.gate_proj.weight)?;
        let u: Dt<f32, M, (Shard<0>, Shard<2>), 3> = x.linear(&m.up_proj.weight)?;
        let y: Dt<f32, M, (Shard<0>, Partial<Sum>), 3> = g.silu()?.mul(&u)?.linear(&m.down_proj.weight)?;
        y.redistribute()
    }

    fn norm(&self, x: &Hidden, n: &RmsNorm) -> Result<Hidden> {
        x.rms_norm([self.cfg.hidden_size], Some(&n.weight), self.cfg.rms_norm_eps)
    }

    /// Logits of `ids` `[batch, s]` at positions `[start, start + s)`, vocabulary over tp.
    /// Without a cache `start` is 0; with one, the cache holds positions `[0, start)` and gets
    /// these (a prompt at `start` 0, then one token per step).
    pub fn logits(
        &self,
        model: &LlamaForCausalLM,
        ids: &Ids,
        start: usize,
        mut cache: Option<&mut KvCache>,
    ) -> Result<Logits> {
        let s = ids.shape()[1];
        if start > 0 && s != 1 {
            return Err(Error::InvalidArgument {
                context: "Llama::logits".into(),
                reason: format!("after the prompt the cache takes one position per step, not {s}"),
            });
        }
        let body = &model.model;
        let x: Dt<f32, M, (Shard<0>, Partial<Sum>), 3> = body.embed_tokens.weight.embedding(ids)?;
        let mut x: Hidden = x.redistribute()?;
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
        model: &LlamaForCausalLM,
        ids: &Ids,
        labels: &Ids,
    ) -> Result<Dt<f32, M, (Replicate, Replicate), 0>> {
        let s = ids.shape()[1];
        let logits = self.logits(model, ids, 0, None)?.narrow(Dim::<1>, 0, s - 1)?;
        let targets = labels.narrow(Dim::<1>, 1, s - 1)?;
        let total: Dt<f32, M, (Partial<Sum>, Partial<Sum>), 0> =
            logits.cross_entropy_sum_loss_parallel(&targets, Some(-100))?;
        let count: Dt<f32, M, (Partial<Sum>, Replicate), 0> = targets.count_ne(-100)?;
        let total: Dt<f32, M, (Replicate, Replicate), 0> = total.redistribute()?;
        let count: Dt<f32, M, (Replicate, Replicate), 0> = count.redistribute()?;
        total.div(&count)
    }

    /// Greedy decoding with a KV cache (transformers' `generate(do_sample=False)`): `new`
    /// tokens after `prompt` `[batch, s]`; a row that produced `eos` continues with `pad`.
    /// Returns the prompt and the new tokens, `[batch, s + new]`, on every rank.
    pub fn generate(
        &self,
        model: &LlamaForCausalLM,
        prompt: &Ids,
        new: usize,
        eos: Option<i64>,
        pad: i64,
    ) -> Result<ndarray::Array2<i64>> {
        let mesh = prompt.device_mesh().clone();
        let full = prompt.full_tensor()?;
        let (b, s) = (full.shape()[0], full.shape()[1]);
        let mut out = ndarray::Array2::<i64>::zeros((b, s + new));
        out.slice_mut(ndarray::s![.., ..s]).assign(&full.into_dimensionality::<ndarray::Ix2>().expect("2-d ids"));
        let mut cache = KvCache::default();
        let mut done = vec![false; b];
        let mut ids = prompt.clone();
        for step in 0..new {
            let start = cache.len;
            let logits = no_grad(|| self.logits(model, &ids, start, Some(&mut cache)))?;
            let n = logits.shape()[1];
            let last: Dt<f32, M, (Shard<0>, Shard<2>), 3> = logits.narrow(Dim::<1>, n - 1, 1)?;
            // The argmax needs the whole vocabulary: gather it over tp (the one collective of
            // the step besides the layers' all-reduces).
            let last: Dt<f32, M, (Shard<0>, Replicate), 3> = last.redistribute()?;
            let next: Dt<i64, M, (Shard<0>, Replicate), 3> = last.argmax(Dim::<2>)?;
            let next: Ids = next.squeeze(Dim::<2>)?;
            let mut tokens = next.full_tensor()?;
            for (r, t) in tokens.iter_mut().enumerate() {
                if done[r] {
                    *t = pad;
                }
                done[r] |= Some(*t) == eos;
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
