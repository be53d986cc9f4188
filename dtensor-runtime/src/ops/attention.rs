//! `scaled_dot_product_attention` as one op, and rotary position embeddings.
//!
//! Rule per mesh dim (PyTorch's SDPA strategies): q, k, v all Replicate → Replicate; q, k, v
//! sharded alike on a batch or head dim (any dim before the last two) → the output sharded on
//! it; q sharded on its sequence dim with k and v Replicate → the output sharded on the
//! sequence dim (each rank attends its queries to every key). An additive mask follows the
//! output's layout on the dims it has at full size and is Replicate on broadcast ones; a
//! Partial input is reduced first. On a legal layout the whole op is local: the op computes
//! `softmax(q kᵀ · scale + mask) v` from the dynamic ops (the causal mask is built for the
//! local query rows only), so no collective is issued and autograd differentiates it.
//!
//! Rotary position embeddings, which attention's inputs take first, are in
//! [`rotary`](super::rotary).

use super::mask::scalar_like;
use super::strategy::{select, DimRule, Select};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::factory::{causal_mask, TensorOptions};
use crate::placement::Placement;

const R: Placement = Placement::Replicate;

/// Placement of an operand of `shape` (right-aligned against an output of `nd` dims) for an
/// output sharded on `d`: sharded on its matching dim when it has it at full size `full`.
fn follow(shape: &[usize], nd: usize, d: usize, full: usize) -> Placement {
    let off = nd - shape.len();
    if d >= off && shape[d - off] == full {
        Placement::Shard((d - off) as isize)
    } else {
        R
    }
}

/// Whether attention of rank-`ndim` q, k, v keeps a `Shard(dim)` of q without
/// communication: with k and v sharded alike (`kv_sharded`) on a batch or head dim (any dim
/// before the last two), or with k and v `Replicate` on q's sequence dim. The one rule of both
/// layers: the runtime's strategies and the typed layer's `AttentionRule` are generated from it.
pub const fn attention_keeps_shard(dim: usize, ndim: usize, kv_sharded: bool) -> bool {
    if kv_sharded {
        dim + 2 < ndim
    } else {
        dim + 2 == ndim
    }
}

/// Attention of `q [.., Lq, E]` over `k [.., Lk, E]`, `v [.., Lk, Ev]` (same leading dims):
/// `softmax(q kᵀ · scale + attn_mask) v`, with `is_causal` hiding keys after each query
/// (top-left aligned, as PyTorch) and `scale` defaulting to `1/√E` (PyTorch
/// `F.scaled_dot_product_attention`). `attn_mask` is additive (PyTorch's float mask; use
/// `-inf` to hide) and broadcasts to `[.., Lq, Lk]`. Grouped-query attention: repeat the key
/// and value heads first (`repeat_interleave`).
pub fn scaled_dot_product_attention<T: Element>(
    q: &DTensor<T>,
    k: &DTensor<T>,
    v: &DTensor<T>,
    attn_mask: Option<&DTensor<T>>,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<DTensor<T>> {
    let nd = q.ndim();
    let bad = |why: &str, expected: &[usize], actual: &[usize]| Error::ShapeMismatch {
        context: format!("scaled_dot_product_attention: {why}"),
        expected: expected.to_vec(),
        actual: actual.to_vec(),
    };
    if nd < 2 || k.ndim() != nd || v.ndim() != nd {
        return Err(bad("q, k, v need the same rank (at least 2)", &q.shape, &k.shape));
    }
    let (lq, e, lk) = (q.shape[nd - 2], q.shape[nd - 1], k.shape[nd - 2]);
    if k.shape[..nd - 2] != q.shape[..nd - 2] || k.shape[nd - 1] != e {
        return Err(bad("k must be [.., Lk, E] with q's leading dims", &q.shape, &k.shape));
    }
    if v.shape[..nd - 1] != k.shape[..nd - 1] {
        return Err(bad("v must be [.., Lk, Ev] with k's leading dims", &k.shape, &v.shape));
    }
    if is_causal && attn_mask.is_some() {
        return Err(Error::InvalidArgument {
            context: "scaled_dot_product_attention".into(),
            reason: "give either attn_mask or is_causal, not both (PyTorch)".into(),
        });
    }
    let mut scores_shape = q.shape[..nd - 1].to_vec();
    scores_shape.push(lk);
    if let Some(m) = attn_mask {
        let ok = m.ndim() <= nd && m.shape.iter().rev().zip(scores_shape.iter().rev()).all(|(&a, &b)| a == b || a == 1);
        if !ok {
            return Err(bad("attn_mask must broadcast to [.., Lq, Lk]", &scores_shape, &m.shape));
        }
    }
    // Strategies: (q, k, v[, mask]) → output.
    let with_mask = |mut ins: Vec<Placement>, d: Option<usize>| {
        if let Some(m) = attn_mask {
            ins.push(d.map_or(R, |d| follow(&m.shape, nd, d, scores_shape[d])));
        }
        ins
    };
    let mut rs = vec![DimRule::new(&with_mask(vec![R, R, R], None), R)];
    for d in 0..nd {
        let s = Placement::Shard(d as isize);
        if attention_keeps_shard(d, nd, true) {
            rs.push(DimRule::new(&with_mask(vec![s, s, s], Some(d)), s));
        }
        if attention_keeps_shard(d, nd, false) {
            rs.push(DimRule::new(&with_mask(vec![s, R, R], Some(d)), s));
        }
    }
    let seq = Placement::Shard((nd - 2) as isize);
    let mut inputs = vec![q, k, v];
    inputs.extend(attn_mask);
    let c = select("scaled_dot_product_attention", &inputs, &rs, Select::default())?;
    let (qi, ki, vi) = (&*c.inputs[0], &*c.inputs[1], &*c.inputs[2]);
    let scale = T::of_f64(scale.unwrap_or(1.0 / (e as f64).sqrt()));
    let mut scores = qi.matmul_t(ki, false, true)?.mul_scalar(scale)?;
    if let Some(m) = c.inputs.get(3) {
        scores = scores.add(m)?;
    }
    if is_causal {
        // The mask of the local query rows: sharded like the scores' sequence dim.
        let pl: Vec<Placement> =
            qi.placements.iter().map(|p| if *p == seq { Placement::Shard(0) } else { R }).collect();
        let keep = causal_mask::<T>(lq, lk, &TensorOptions::new().mesh(&qi.mesh).placements(&pl))?;
        let hidden = keep.eq_mask(&scalar_like(&keep, T::zero())?)?;
        scores = scores.masked_fill(&hidden, T::neg_infinity())?;
    }
    scores.softmax(-1)?.matmul(vi)
}
