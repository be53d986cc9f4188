//! A Llama-family `config.json` (`LlamaConfig`) and its ready tensor-parallel plan: the plan
//! loads a grouped-query checkpoint sharded by heads, refuses to cut a head (naming the
//! heads) or replicates the key/value heads when asked; configurations that are not Llama's,
//! are inconsistent, or disagree with the weights are typed errors naming the field or tensor.

mod hf_util;

use dtensor_runtime::checkpoint::hf::{HfCheckpoint, KvHeads, LlamaConfig, CONFIG_FILE, SINGLE_FILE};
use dtensor_runtime::{run, Replicate, Shard};
use hf_util::{expect_checkpoint, write_st};
use ndarray::ArrayD;
use safetensors::Dtype;
use std::path::Path;

/// 4 query heads, 2 key/value heads of width 4: hidden 16, kv width 8.
const CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 10, "hidden_size": 16, "intermediate_size": 12, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
  "tie_word_embeddings": false, "torch_dtype": "float32", "hidden_act": "silu"
}"#;

fn values(shape: &[usize], seed: usize) -> ArrayD<f64> {
    let mut i = seed;
    ArrayD::from_shape_fn(shape.to_vec(), |_| {
        i += 7;
        (i % 23) as f64 / 8.0 - 1.0
    })
}

/// A checkpoint with every tensor `cfg` describes, plus its config.
fn write_llama(dir: &Path, text: &str) -> Vec<(String, ArrayD<f64>)> {
    std::fs::write(dir.join(CONFIG_FILE), text).unwrap();
    let cfg = LlamaConfig::read(dir).unwrap();
    let tensors: Vec<(String, ArrayD<f64>)> =
        cfg.tensor_shapes().into_iter().enumerate().map(|(i, (n, s))| (n, values(&s, i))).collect();
    let refs: Vec<(&str, Dtype, &ArrayD<f64>)> = tensors.iter().map(|(n, v)| (n.as_str(), Dtype::F32, v)).collect();
    write_st(&dir.join(SINGLE_FILE), &refs);
    tensors
}

#[test]
fn reads_a_llama_config() {
    let dir = tempfile::tempdir().unwrap();
    write_llama(dir.path(), CONFIG);
    let cfg = LlamaConfig::read(dir.path()).unwrap();
    assert_eq!((cfg.kv_heads(), cfg.head_dim(), cfg.rope_theta, cfg.rms_norm_eps), (2, 4, 500000.0, 1e-5));
    assert_eq!(cfg.tensor_shapes().len(), 1 + 2 * 9 + 2);
    cfg.check(&mut HfCheckpoint::open(dir.path()).unwrap()).unwrap();
    // transformers 5 writes the base inside `rope_parameters`: read from there, not defaulted.
    let v5 = CONFIG.replace(
        "\"rope_theta\": 500000.0",
        "\"rope_parameters\": {\"rope_theta\": 250000.0, \"rope_type\": \"default\"}",
    );
    assert_ne!(v5, CONFIG);
    let cfg = LlamaConfig::from_json(v5.as_bytes(), Path::new("c.json")).unwrap();
    assert_eq!(cfg.rope_theta, 250000.0);
    // A legacy linear scaling divides every frequency.
    let linear = CONFIG.replace(
        "\"rope_theta\": 500000.0",
        "\"rope_theta\": 500000.0, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}",
    );
    let scaled = LlamaConfig::from_json(linear.as_bytes(), Path::new("c.json")).unwrap().rope_frequencies();
    let plain = LlamaConfig::from_json(CONFIG.as_bytes(), Path::new("c.json")).unwrap().rope_frequencies();
    assert_eq!(scaled.len(), 2);
    assert!(scaled.iter().zip(&plain).all(|(s, p)| (s * 4.0 - p).abs() < 1e-15 * p));
}

/// The plan on a 2-rank tp mesh: q/k/v sharded by whole heads, o and down by rows, the
/// embedding by vocabulary rows; every tensor loads equal to the checkpoint.
#[test]
fn tp_plan_shards_by_heads() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = write_llama(dir.path(), CONFIG);
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let cfg = LlamaConfig::read(dir.path())?;
        let plan = cfg.tp_plan(&mesh, "tp", KvHeads::Shard)?;
        let mut ck = HfCheckpoint::open(dir.path())?;
        let loaded = ck.load::<f32>(&mesh, &plan)?;
        let by_name: std::collections::HashMap<_, _> = loaded.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let pl = |n: &str| by_name[n].placements().to_vec();
        assert_eq!(pl("model.layers.0.self_attn.q_proj.weight"), [Replicate, Shard(0)]);
        assert_eq!(pl("model.layers.1.self_attn.k_proj.weight"), [Replicate, Shard(0)]);
        assert_eq!(pl("model.layers.1.self_attn.o_proj.weight"), [Replicate, Shard(1)]);
        assert_eq!(pl("model.layers.0.mlp.down_proj.weight"), [Replicate, Shard(1)]);
        assert_eq!(pl("model.embed_tokens.weight"), [Replicate, Shard(0)]);
        assert_eq!(pl("lm_head.weight"), [Replicate, Shard(0)]);
        assert_eq!(pl("model.norm.weight"), [Replicate, Replicate]);
        // Each tp rank holds one whole kv head (4 rows of 8).
        assert_eq!(by_name["model.layers.0.self_attn.k_proj.weight"].local().shape(), &[4, 16]);
        for (n, v) in &tensors {
            assert_eq!(&by_name[n.as_str()].full_tensor()?.mapv(f64::from), v, "{n}");
        }
        Ok(())
    })
    .unwrap();
}

/// tp = 4 with 2 key/value heads: sharding them would cut each head in two, so the plan is
/// refused naming the heads; replicating them loads.
#[test]
fn key_value_heads_are_never_split() {
    let dir = tempfile::tempdir().unwrap();
    write_llama(dir.path(), CONFIG);
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["tp"])?;
        let cfg = LlamaConfig::read(dir.path())?;
        let e = cfg.tp_plan(&mesh, "tp", KvHeads::Shard).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("does not divide the 2 key/value heads") && e.contains("KvHeads::Replicate"), "{e}");
        let plan = cfg.tp_plan(&mesh, "tp", KvHeads::Replicate)?;
        let loaded = HfCheckpoint::open(dir.path())?.load::<f32>(&mesh, &plan)?;
        let k = &loaded.iter().find(|(n, _)| n == "model.layers.0.self_attn.k_proj.weight").unwrap().1;
        assert_eq!(k.placements(), &[Replicate]);
        let q = &loaded.iter().find(|(n, _)| n == "model.layers.0.self_attn.q_proj.weight").unwrap().1;
        assert_eq!((q.placements(), q.local().shape()), (&[Shard(0)][..], &[4usize, 16][..]));
        Ok(())
    })
    .unwrap();
    // 3 does not divide the 4 query heads.
    run(3, |ctx| {
        let mesh = ctx.init_device_mesh(&[3], &["tp"])?;
        let e = LlamaConfig::read(dir.path())?.tp_plan(&mesh, "tp", KvHeads::Replicate).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("does not divide the 4 query heads"), "{e}");
        Ok(())
    })
    .unwrap();
}

/// Configurations that are not a Llama's, inconsistent or hostile: typed errors naming the
/// field; a configuration that disagrees with the weights: an error naming the tensor.
#[test]
fn bad_configs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_llama(dir.path(), CONFIG);
    let edit = |from: &str, to: &str| CONFIG.replace(from, to);
    for (text, want) in [
        (edit("\"llama\"", "\"gpt2\""), "model_type `gpt2` is not of the Llama family"),
        (edit("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 0"), "`num_hidden_layers` must be positive"),
        (edit("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"), "not a multiple of num_key_value_heads 3"),
        (
            edit("\"hidden_size\": 16", "\"hidden_size\": 18"),
            "hidden_size 18 is not a multiple of num_attention_heads 4",
        ),
        (edit("\"rms_norm_eps\": 1e-5", "\"rms_norm_eps\": -1"), "rms_norm_eps -1 must be finite and > 0"),
        (edit("\"vocab_size\": 10", "\"vocab_size\": 18446744073709551615"), "too large to exist"),
        (edit("\"vocab_size\": 10,", ""), "missing field `vocab_size`"),
        ("[1, 2]".to_string(), "not a Llama config"),
        (edit("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""), "hidden_act `gelu` is not implemented"),
        (edit("\"llama\"", "\"llama\", \"attention_bias\": true"), "`attention_bias` is true"),
        (
            edit(
                "\"rope_theta\": 500000.0",
                "\"rope_parameters\": {\"rope_theta\": 5e5, \"rope_type\": \"linear\", \"factor\": 2.0}, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}",
            ),
            "ask for different scalings",
        ),
        // Rotary scalings change the frequencies: refused, never read as plain tables.
        (
            edit(
                "\"rope_theta\": 500000.0",
                "\"rope_parameters\": {\"rope_theta\": 5e5, \"rope_type\": \"llama3\", \"factor\": 8.0}",
            ),
            "`rope_parameters.low_freq_factor` is missing",
        ),
        (
            edit(
                "\"rope_theta\": 500000.0",
                "\"rope_theta\": 5e5, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2.0}",
            ),
            "`rope_scaling` asks for rotary scaling `yarn`",
        ),
        (
            edit("\"rope_theta\": 500000.0", "\"rope_theta\": 5e5, \"rope_parameters\": {\"rope_theta\": 1e4}"),
            "disagree",
        ),
    ] {
        let bad = tempfile::tempdir().unwrap();
        std::fs::write(bad.path().join(CONFIG_FILE), &text).unwrap();
        expect_checkpoint(LlamaConfig::read(bad.path()), CONFIG_FILE, &[want]);
    }
    // Weights and config that disagree.
    let wider = LlamaConfig::from_json(
        edit("\"intermediate_size\": 12", "\"intermediate_size\": 14").as_bytes(),
        Path::new("c.json"),
    )
    .unwrap();
    let e = wider.check(&mut HfCheckpoint::open(dir.path()).unwrap()).unwrap_err().to_string();
    assert!(e.contains("`model.layers.0.mlp.gate_proj.weight` the shape [14, 16], the weights have [12, 16]"), "{e}");
    let tied = LlamaConfig::from_json(
        edit("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3").as_bytes(),
        Path::new("c.json"),
    )
    .unwrap();
    let e = tied.check(&mut HfCheckpoint::open(dir.path()).unwrap()).unwrap_err().to_string();
    assert!(e.contains("describes a tensor `model.layers.2.input_layernorm.weight` the weights lack"), "{e}");
    // No config.json at all.
    let empty = tempfile::tempdir().unwrap();
    assert!(LlamaConfig::read(empty.path()).is_err());
}
