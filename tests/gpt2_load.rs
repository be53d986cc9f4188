//! A second Hugging Face family through the same loading machinery: GPT-2 (transformers'
//! `GPT2LMHeadModel`, fixture by `scripts/gen_gpt2_fixture.py`). Its fused `c_attn` weight
//! holds q, k and v side by side; a `TensorMap` splits it into the struct's `q`, `k`, `v`
//! parameters *before* each is sharded over tp, so every rank keeps its own heads of all three
//! (sharding the fused weight as one block would hand the first ranks all of q). Conv1D
//! weights are `[in, out]` (column-parallel is `Shard(1)`), positions are learned, and the LM
//! head is the token table. Logits and loss match transformers within 1e-4 relative in f32 on
//! 1×1, 2×2 and 1×2.

mod fixture_util;

use dtensor::checkpoint::hf::{HfCheckpoint, TensorMap};
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::prelude::*;
use dtensor::{distribute, distribute_tensor, scaled_dot_product_attention as sdpa, CrossEntropyOptions};
use fixture_util::{data, ids, json};
use std::path::Path;

/// Conv1D, column-parallel: weight `[in, out]` and bias sharded on the outputs.
#[distribute(mesh = "dp,tp")]
pub struct ColConv {
    #[placements = [Replicate, Shard(1)]]
    pub weight: DTensor<f32>,
    #[placements = [Replicate, Shard(0)]]
    pub bias: DTensor<f32, 1>,
}

/// Conv1D, row-parallel: weight `[in, out]` sharded on the inputs, bias replicated.
#[distribute(mesh = "dp,tp")]
pub struct RowConv {
    #[placements = [Replicate, Shard(0)]]
    pub weight: DTensor<f32>,
    #[placements = [Replicate, Replicate]]
    pub bias: DTensor<f32, 1>,
}

#[distribute(mesh = "dp,tp", placements = [Replicate, Replicate])]
pub struct LayerNorm {
    pub weight: DTensor<f32, 1>,
    pub bias: DTensor<f32, 1>,
}

/// q, k and v are separate parameters here; the checkpoint fuses them in `c_attn`.
#[distribute(mesh = "dp,tp")]
pub struct Attn {
    pub q: ColConv,
    pub k: ColConv,
    pub v: ColConv,
    pub c_proj: RowConv,
}

#[distribute(mesh = "dp,tp")]
pub struct Mlp {
    pub c_fc: ColConv,
    pub c_proj: RowConv,
}

#[distribute(mesh = "dp,tp")]
pub struct Block {
    pub ln_1: LayerNorm,
    pub attn: Attn,
    pub ln_2: LayerNorm,
    pub mlp: Mlp,
}

/// Token table `[vocab, n_embd]`, vocab-parallel; also the LM head.
#[distribute(mesh = "dp,tp")]
pub struct Wte {
    #[placements = [Replicate, Shard(0)]]
    pub weight: DTensor<f32>,
}

#[distribute(mesh = "dp,tp")]
pub struct Wpe {
    #[placements = [Replicate, Replicate]]
    pub weight: DTensor<f32>,
}

#[distribute(mesh = "dp,tp")]
pub struct Gpt2 {
    pub wte: Wte,
    pub wpe: Wpe,
    pub h: Vec<Block>,
    pub ln_f: LayerNorm,
}

/// q, k, v from thirds of `c_attn` (weights along their output dim 1, biases along dim 0).
fn gpt2_map() -> TensorMap {
    let mut map = TensorMap::new();
    for (part, p) in ["q", "k", "v"].into_iter().enumerate() {
        map = map.split(&format!("h.*.attn.{p}.weight"), "h.*.attn.c_attn.weight", 1, part, 3).split(
            &format!("h.*.attn.{p}.bias"),
            "h.*.attn.c_attn.bias",
            0,
            part,
            3,
        );
    }
    map
}

fn conv(x: &DTensor<f32>, c: &ColConv) -> Result<DTensor<f32>> {
    x.matmul(c.weight.as_dtensor())?.add(c.bias.as_dtensor())
}

fn row(x: &DTensor<f32>, c: &RowConv) -> Result<DTensor<f32>> {
    x.matmul(c.weight.as_dtensor())?.add(c.bias.as_dtensor())?.redistribute(&[Shard(0), Replicate])
}

fn norm(x: &DTensor<f32>, n: &LayerNorm) -> Result<DTensor<f32>> {
    x.layer_norm(&[x.shape()[2]], Some(n.weight.as_dtensor()), Some(n.bias.as_dtensor()), 1e-5)
}

/// GPT-2's forward (transformers' `GPT2LMHeadModel`), logits `[b, s, vocab]` vocab-sharded.
fn logits(m: &Gpt2, ids: &DTensor<i64>, heads: usize) -> Result<DTensor<f32>> {
    let (b, s) = (ids.shape()[0] as isize, ids.shape()[1] as isize);
    let e = m.wpe.weight.shape()[1] as isize;
    let pos = distribute_tensor(
        ArrayD::from_shape_fn(IxDyn(&[s as usize]), |i| i[0] as i64),
        ids.device_mesh(),
        &[Replicate, Replicate],
        None,
    )?;
    let tokens = m.wte.weight.as_dtensor().embedding(ids)?.redistribute(&[Shard(0), Replicate])?;
    let mut x = tokens.add(&m.wpe.weight.as_dtensor().embedding(&pos)?)?;
    let nh = heads as isize;
    for blk in &m.h {
        let h = norm(&x, &blk.ln_1)?;
        let split = |t: DTensor<f32>| t.reshape(&[b, s, nh, e / nh])?.transpose(1, 2);
        let (q, k, v) =
            (split(conv(&h, &blk.attn.q)?)?, split(conv(&h, &blk.attn.k)?)?, split(conv(&h, &blk.attn.v)?)?);
        let a = sdpa(&q, &k, &v, None, true, None)?.transpose(1, 2)?.reshape(&[b, s, e])?;
        x = x.add(&row(&a, &blk.attn.c_proj)?)?;
        let h = conv(&norm(&x, &blk.ln_2)?, &blk.mlp.c_fc)?.gelu()?;
        x = x.add(&row(&h, &blk.mlp.c_proj)?)?;
    }
    norm(&x, &m.ln_f)?.linear(m.wte.weight.as_dtensor(), None)
}

#[test]
fn gpt2_loads_through_a_tensor_map_and_matches_transformers() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2");
    let (exp, cfg) = (json(&dir, "expected.json"), json(&dir, "config.json"));
    let heads = cfg["n_head"].as_u64().unwrap() as usize;
    let (input, labels) = (ids(&exp["input_ids"]), ids(&exp["labels"]));
    let want = data(&exp["logits"]);
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let want_loss = exp["loss"].as_f64().unwrap() as f32;
    for (dp, tp) in [(1, 1), (2, 2), (1, 2)] {
        let out = dtensor::run(dp * tp, |ctx| {
            let mesh = ctx.init_device_mesh(&[dp, tp], &["dp", "tp"])?;
            let mut ck = HfCheckpoint::open(&dir)?;
            let m: Gpt2 = ck.load_module_mapped("transformer.", &mesh, &gpt2_map())?;
            let x = distribute_tensor(input.clone().into_dyn(), &mesh, &[Shard(0), Replicate], None)?;
            let y = distribute_tensor(labels.clone().into_dyn(), &mesh, &[Shard(0), Replicate], None)?;
            let lg = logits(&m, &x, heads)?;
            let s = lg.shape()[1];
            let loss = lg
                .narrow(1, 0, s - 1)?
                .cross_entropy_with(&y.narrow(1, 1, s - 1)?, &CrossEntropyOptions::new().ignore_index(-100))?;
            // Rank 0's local q weight: its heads' columns of the q third of `c_attn`.
            let q_local = m.h[0].attn.q.weight.to_host()?;
            Ok((lg.full_tensor()?, loss.full_tensor()?.sum(), q_local, m.h.len()))
        })
        .unwrap();
        let fused = dtensor::run(1, |ctx| {
            let mesh = ctx.init_device_mesh(&[1], &["x"])?;
            HfCheckpoint::open(&dir)?
                .load_tensor::<f32>("transformer.h.0.attn.c_attn.weight", &mesh, &[Replicate])?
                .full_tensor()
        })
        .unwrap()
        .remove(0);
        let e = fused.shape()[0];
        for (r, (lg, loss, q_local, layers)) in out.into_iter().enumerate() {
            assert_eq!(layers, 2);
            let err = lg.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
            assert!(err <= 1e-4, "{dp}x{tp}: logits relative error {err}");
            assert!(((loss - want_loss) / want_loss).abs() <= 1e-4, "{dp}x{tp}: loss {loss} vs {want_loss}");
            let cols = e / tp;
            let t = r % tp;
            let want_q = fused.slice(dtensor::ndarray::s![.., t * cols..(t + 1) * cols]).to_owned().into_dyn();
            assert_eq!(q_local, want_q, "{dp}x{tp} rank {r}: its own q heads");
        }
    }
}

/// A map that cannot apply is a typed error naming the rule, the tensor or the parameter.
#[test]
fn bad_tensor_maps_are_typed_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2");
    let errors = dtensor::run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[1, 2], &["dp", "tp"])?;
        let mut out = Vec::new();
        for map in [
            // 96 columns are not 5 equal parts.
            TensorMap::new().split("h.*.attn.q.weight", "h.*.attn.c_attn.weight", 1, 0, 5),
            // There is no fourth third.
            TensorMap::new().split("h.*.attn.q.weight", "h.*.attn.c_attn.weight", 1, 3, 3),
            // No such tensor.
            TensorMap::new().rename("h.*.attn.q.weight", "h.*.attn.query.weight"),
            // v read from k's third by mistake: the last third of `c_attn` would be dropped.
            TensorMap::new()
                .split("h.*.attn.q.weight", "h.*.attn.c_attn.weight", 1, 0, 3)
                .split("h.*.attn.k.weight", "h.*.attn.c_attn.weight", 1, 1, 3)
                .split("h.*.attn.v.weight", "h.*.attn.c_attn.weight", 1, 1, 3)
                .split("h.*.attn.q.bias", "h.*.attn.c_attn.bias", 0, 0, 3)
                .split("h.*.attn.k.bias", "h.*.attn.c_attn.bias", 0, 1, 3)
                .split("h.*.attn.v.bias", "h.*.attn.c_attn.bias", 0, 2, 3),
        ] {
            let e = HfCheckpoint::open(&dir)?.load_module_mapped::<f32, Gpt2>("transformer.", &mesh, &map);
            out.push(e.map(drop).unwrap_err().to_string());
        }
        Ok(out)
    })
    .unwrap()
    .remove(0);
    assert!(errors[0].contains("c_attn.weight") && errors[0].contains("5 equal parts"), "{}", errors[0]);
    assert!(errors[1].contains("part 3 of 3 does not exist"), "{}", errors[1]);
    assert!(errors[2].contains("no tensor `transformer.h.0.attn.query.weight`"), "{}", errors[2]);
    assert!(
        errors[3].contains("parts [2] of the 3 parts of tensor `transformer.h.0.attn.c_attn.weight`"),
        "{}",
        errors[3]
    );
}
