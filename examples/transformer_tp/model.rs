//! The model of the `transformer_tp` example: a GPT-style decoder written with
//! `#[distribute]` and typed ops only, on a mesh `dp × tp`. Every layout below is computed
//! and checked by the type system; the only collectives are the explicit `.redistribute()`
//! calls (and what autograd and the loss-parallel `cross_entropy` derive from them).
//!
//! Layouts (dp, tp): the batch `(Shard(0), Replicate)`; the token table vocab-parallel
//! `(Replicate, Shard(0))`; q, k, v and the MLP's first weight column-parallel
//! `(Replicate, Shard(1))`, so the heads and the hidden features are sharded on tp; the
//! attention out-projection and the MLP's second weight row-parallel `(Replicate,
//! Shard(0))`; the LM head column-parallel, so the logits stay sharded on the vocabulary
//! and the loss is computed loss-parallel. Norm weights are replicated.

use dtensor::distribute;
use dtensor::prelude::*;
use dtensor::typed::attention::scaled_dot_product_attention;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::reduce::Dim;
use dtensor::typed::{Dims, Dt, Sum};
use dtensor::{local_mesh, rand};
use ndarray::{Array2, ArrayD};

/// `layer_norm`'s epsilon (PyTorch's default).
const EPS: f64 = 1e-5;

/// Sizes and training knobs.
#[derive(Debug, Clone, Copy)]
pub struct GptConfig {
    /// Vocabulary size (rows of the token table, columns of the LM head; sharded on tp).
    pub vocab: usize,
    /// Model width.
    pub width: usize,
    /// Attention heads (sharded on tp).
    pub heads: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Sequences per step (sharded on dp).
    pub batch: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Learning rate.
    pub lr: f64,
    /// Seed of the initialisation and of the data.
    pub seed: u64,
}

/// One pre-norm transformer block (no biases in the linear layers).
#[distribute(mesh = "dp,tp", placements = [Replicate, Replicate])]
#[derive(Clone)]
pub struct Block {
    /// `[width]`, replicated.
    pub ln1_w: DTensor<f64, 1>,
    /// `[width]`, replicated.
    pub ln1_b: DTensor<f64, 1>,
    /// `[width, width]` column-parallel: each tp rank holds the columns of its heads.
    #[placements = [Replicate, Shard(1)]]
    pub wq: DTensor<f64>,
    /// As `wq`.
    #[placements = [Replicate, Shard(1)]]
    pub wk: DTensor<f64>,
    /// As `wq`.
    #[placements = [Replicate, Shard(1)]]
    pub wv: DTensor<f64>,
    /// `[width, width]` row-parallel: the rows of this rank's heads.
    #[placements = [Replicate, Shard(0)]]
    pub wo: DTensor<f64>,
    /// `[width]`, replicated.
    pub ln2_w: DTensor<f64, 1>,
    /// `[width]`, replicated.
    pub ln2_b: DTensor<f64, 1>,
    /// `[width, 4·width]` column-parallel.
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f64>,
    /// `[4·width, width]` row-parallel.
    #[placements = [Replicate, Shard(0)]]
    pub w2: DTensor<f64>,
}

/// `[batch, seq, width]` → `[batch, heads, seq, head_dim]` through a column-parallel
/// projection: the heads land on tp. No communication.
#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate], returns = [Shard(0), Shard(1)])]
fn project_heads(
    x: &DTensor<f64, 3>,
    #[placements(Replicate, Shard(1))] w: &DTensor<f64>,
    heads: usize,
) -> Result<DTensor<f64, 4>> {
    let width = w.shape()[1];
    let y: Dt<f64, (dp, tp), (Shard<0>, Shard<2>), 3> = x.matmul(w)?;
    let y: Dt<f64, (dp, tp), (Shard<0>, Shard<2>), 4> = y.unflatten(Dim::<2>, [heads, width / heads])?;
    let y: Dt<f64, (dp, tp), (Shard<0>, Shard<1>), 4> = y.permute((Dim::<0>, Dim::<2>, Dim::<1>, Dim::<3>))?;
    Ok(y)
}

/// `x + attn(ln1(x))`, then `+ mlp(ln2(·))`, on `[batch, seq, width]` sharded on dp. Two
/// collectives in the forward: the all-reduces over tp of the row-parallel outputs.
#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
pub fn block_forward(x: &DTensor<f64, 3>, b: &Block, heads: usize) -> Result<DTensor<f64, 3>> {
    let width = x.shape()[2];
    let h = x.layer_norm([width], Some(&b.ln1_w), Some(&b.ln1_b), EPS)?;
    let (q, k, v) =
        (project_heads(&h, &b.wq, heads)?, project_heads(&h, &b.wk, heads)?, project_heads(&h, &b.wv, heads)?);
    // Heads sharded on tp: attention is local to each rank's heads.
    let a: Dt<f64, (dp, tp), (Shard<0>, Shard<1>), 4> = scaled_dot_product_attention(&q, &k, &v, true, None)?;
    // Merge the heads back: [b, nh, s, hd] → [b, s, nh, hd] → [b, s, nh·hd], still on tp.
    let a: Dt<f64, (dp, tp), (Shard<0>, Shard<2>), 4> = a.permute((Dim::<0>, Dim::<2>, Dim::<1>, Dim::<3>))?;
    let a: Dt<f64, (dp, tp), (Shard<0>, Shard<2>), 3> = a.flatten(Dims::<2, 3>)?;
    let a: Dt<f64, (dp, tp), (Shard<0>, Partial<Sum>), 3> = a.matmul(&b.wo)?;
    let x = x.add(&a.redistribute::<(Shard<0>, Replicate)>()?)?;
    let h = x.layer_norm([width], Some(&b.ln2_w), Some(&b.ln2_b), EPS)?;
    let h: Dt<f64, (dp, tp), (Shard<0>, Shard<2>), 3> = h.matmul(&b.w1)?.gelu()?;
    let m: Dt<f64, (dp, tp), (Shard<0>, Partial<Sum>), 3> = h.matmul(&b.w2)?;
    x.add(&m.redistribute::<(Shard<0>, Replicate)>()?)
}

/// The decoder: token table, blocks, final norm, LM head.
#[distribute(mesh = "dp,tp", placements = [Replicate, Replicate])]
#[derive(Clone)]
pub struct Gpt {
    /// `[vocab, width]` vocab-parallel: each tp rank looks up only its rows.
    #[placements = [Replicate, Shard(0)]]
    pub wte: DTensor<f64>,
    /// The transformer blocks.
    pub blocks: Vec<Block>,
    /// `[width]`, replicated.
    pub lnf_w: DTensor<f64, 1>,
    /// `[width]`, replicated.
    pub lnf_b: DTensor<f64, 1>,
    /// `[width, vocab]` column-parallel: logits sharded on the vocabulary.
    #[placements = [Replicate, Shard(1)]]
    pub head: DTensor<f64>,
}

/// Logits `[batch, seq, vocab]` of `model` on token ids `[batch, seq]` (sharded on dp), sharded
/// on the vocabulary over tp (the LM head is column-parallel).
#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate], returns = [Shard(0), Shard(2)])]
pub fn logits(model: &Gpt, ids: &DTensor<i64>, heads: usize) -> Result<DTensor<f64, 3>> {
    // Vocab-parallel lookup: ids outside this rank's rows give zeros; one all-reduce over tp.
    let x: Dt<f64, (dp, tp), (Shard<0>, Partial<Sum>), 3> = model.wte.embedding(ids)?;
    let mut x: Dt<f64, (dp, tp), (Shard<0>, Replicate), 3> = x.redistribute()?;
    for b in &model.blocks {
        x = block_forward(&x, b, heads)?;
    }
    let width = x.shape()[2];
    let x = x.layer_norm([width], Some(&model.lnf_w), Some(&model.lnf_b), EPS)?;
    x.matmul(&model.head)
}

/// Mean next-token cross-entropy of `model` on token ids `[batch, seq]` against `targets`
/// (both sharded on dp), loss-parallel over tp. The loss stays a partial sum on both mesh
/// dims: only its reader sums it.
#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate], returns = [Partial(Sum), Partial(Sum)])]
pub fn loss(model: &Gpt, ids: &DTensor<i64>, targets: &DTensor<i64>, heads: usize) -> Result<DTensor<f64, 0>> {
    let logits: Dt<f64, (dp, tp), (Shard<0>, Shard<2>), 3> = logits(model, ids, heads)?;
    logits.cross_entropy_loss_parallel(targets)
}

/// Global `[rows, cols]` weight, uniform in `±1/√rows` (PyTorch's Linear init for a fan-in of
/// `rows`), from the counter-based generator: the same values on every rank.
fn uniform(shape: &[usize], fan_in: usize) -> Result<ArrayD<f64>> {
    let bound = 1.0 / (fan_in as f64).sqrt();
    let u = rand::<f64>(shape, &TensorOptions::new().mesh(&local_mesh()))?;
    Ok(u.to_host()?.mapv(|v| (2.0 * v - 1.0) * bound))
}

impl Gpt {
    /// Draws the global weights (call `manual_seed` first) and distributes them over `mesh`
    /// as parameters (collective: every rank of `mesh` calls it).
    pub fn new(cfg: &GptConfig, mesh: &DeviceMesh) -> Result<Gpt> {
        let (w, v) = (cfg.width, cfg.vocab);
        let ones = || ArrayD::<f64>::ones(vec![w]);
        let zeros = || ArrayD::<f64>::zeros(vec![w]);
        let blocks = (0..cfg.layers)
            .map(|_| {
                Ok(BlockGlobal {
                    ln1_w: ones(),
                    ln1_b: zeros(),
                    wq: uniform(&[w, w], w)?,
                    wk: uniform(&[w, w], w)?,
                    wv: uniform(&[w, w], w)?,
                    wo: uniform(&[w, w], w)?,
                    ln2_w: ones(),
                    ln2_b: zeros(),
                    w1: uniform(&[w, 4 * w], w)?,
                    w2: uniform(&[4 * w, w], 4 * w)?,
                })
            })
            .collect::<Result<_>>()?;
        let global =
            GptGlobal { wte: uniform(&[v, w], 1)?, blocks, lnf_w: ones(), lnf_b: zeros(), head: uniform(&[w, v], w)? };
        Gpt::distribute(global, mesh)
    }
}

/// Sequences of the rule `t[i+1] = (5·t[i] + 3) mod vocab` from random starts: the ids
/// `[batch, seq]` and the next tokens (the targets), the same on every rank, as `i64` (ids are
/// integers: read in the model's float type they would round past its exact integers).
pub fn batch_data(cfg: &GptConfig) -> Result<(ArrayD<i64>, ArrayD<i64>)> {
    let starts = rand::<f64>(&[cfg.batch], &TensorOptions::new().mesh(&local_mesh()))?.to_host()?;
    let v = cfg.vocab;
    let tokens = Array2::from_shape_fn((cfg.batch, cfg.seq + 1), |(b, i)| {
        let mut t = (starts[[b]] * v as f64) as usize % v;
        for _ in 0..i {
            t = (5 * t + 3) % v;
        }
        t as i64
    });
    let ids = tokens.slice(ndarray::s![.., ..cfg.seq]).to_owned().into_dyn();
    let targets = tokens.slice(ndarray::s![.., 1..]).to_owned().into_dyn();
    Ok((ids, targets))
}
