//! `#[distribute]` structs built straight from a Hugging Face checkpoint (`load_hf`): each
//! rank reads only the shards of its declared placements, nested structs and `Vec`s of layers
//! follow the checkpoint's dotted names, and a checkpoint that does not fit is a typed error
//! naming the parameter or tensor, with no module returned.

use dtensor::checkpoint::hf::{self, HfCheckpoint, TensorMap};
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::prelude::*;
use dtensor::{distribute, distribute_tensor, Replicate};
use std::path::Path;

#[distribute(mesh = "dp,tp")]
pub struct ColLinear {
    #[placements = [Replicate, Shard(0)]]
    pub weight: DTensor<f32>,
}

#[distribute(mesh = "dp,tp")]
pub struct RowLinear {
    #[placements = [Replicate, Shard(1)]]
    pub weight: DTensor<f32>,
}

#[distribute(mesh = "dp,tp")]
pub struct Norm {
    #[placements = [Replicate, Replicate]]
    pub weight: DTensor<f32, 1>,
}

#[distribute(mesh = "dp,tp")]
pub struct Attention {
    pub q_proj: ColLinear,
    pub k_proj: ColLinear,
    pub v_proj: ColLinear,
    pub o_proj: RowLinear,
}

#[distribute(mesh = "dp,tp")]
pub struct Layer {
    pub self_attn: Attention,
    pub input_layernorm: Norm,
}

/// Vocab-parallel embedding table.
#[distribute(mesh = "dp,tp")]
pub struct Embedding {
    #[placements = [Replicate, Shard(0)]]
    pub weight: DTensor<f32>,
}

#[distribute(mesh = "dp,tp")]
pub struct Body {
    pub embed_tokens: Option<Embedding>,
    pub layers: Vec<Layer>,
    pub norm: Norm,
}

#[distribute(mesh = "dp,tp")]
pub struct Causal {
    pub model: Body,
    pub lm_head: ColLinear,
}

/// A struct with configuration inside: cannot come from a checkpoint.
#[distribute(mesh = "dp,tp")]
pub struct WithEps {
    pub norm: Norm,
    pub eps: f64,
}

fn tensor(shape: &[usize], seed: usize) -> ArrayD<f32> {
    let mut i = 0;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        i += 1;
        ((i * 37 + seed * 11) % 23) as f32 / 23.0 - 0.5
    })
}

/// The tensors of a 2-layer causal LM (hidden 6, vocab 10; 5 query rows over tp = 2: uneven).
fn checkpoint_tensors() -> Vec<(String, ArrayD<f32>)> {
    let mut v = vec![("model.embed_tokens.weight".to_string(), tensor(&[10, 6], 1))];
    for l in 0..2 {
        for (k, n, shape) in
            [(0, "q_proj", [5, 6]), (1, "k_proj", [4, 6]), (2, "v_proj", [4, 6]), (3, "o_proj", [6, 5])]
        {
            v.push((format!("model.layers.{l}.self_attn.{n}.weight"), tensor(&shape, 10 * l + k)));
        }
        v.push((format!("model.layers.{l}.input_layernorm.weight"), tensor(&[6], 30 + l)));
    }
    v.push(("model.norm.weight".to_string(), tensor(&[6], 40)));
    v.push(("lm_head.weight".to_string(), tensor(&[10, 6], 41)));
    v
}

fn write(dir: &Path, tensors: &[(String, ArrayD<f32>)]) {
    dtensor::run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let state: Vec<(String, DTensor<f32>)> = tensors
            .iter()
            .map(|(n, a)| Ok((n.clone(), distribute_tensor(a, &mesh, &[Replicate], None)?)))
            .collect::<Result<_>>()?;
        hf::save_sharded(dir, &state, 400)
    })
    .unwrap();
}

#[test]
fn a_typed_model_loads_with_its_declared_layouts_reading_only_its_shards() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = checkpoint_tensors();
    write(dir.path(), &tensors);
    let total: u64 = tensors.iter().map(|(_, a)| 4 * a.len() as u64).sum();
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let mut ck = HfCheckpoint::open(dir.path())?;
        let m = Causal::load_hf(&mut ck, "", &mesh)?;
        let mut got = Vec::new();
        for ((name, p), (_, declared)) in m.named_parameters().into_iter().zip(m.parameter_placements()) {
            assert_eq!(p.placements(), declared.as_slice(), "{name}");
            assert!(p.requires_grad(), "{name}");
            got.push((name, p.full_tensor()?));
        }
        Ok((m.model.layers.len(), got, ck.payload_bytes_read()))
    })
    .unwrap();
    for (layers, got, read) in out {
        assert_eq!(layers, 2);
        assert_eq!(got.len(), tensors.len());
        for (name, full) in got {
            let want = &tensors.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("{name}")).1;
            assert_eq!(&full, want, "{name}");
        }
        // Sharded over tp: about half of the sharded weights, all of the replicated norms.
        assert!(read < total * 7 / 10, "read {read} of {total} bytes");
    }
}

/// Runs `load` on 2×2 and returns rank 0's error text.
fn error_of(dir: &Path, load: impl Fn(&mut HfCheckpoint, &DeviceMesh) -> Result<()> + Sync) -> String {
    dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let mut ck = HfCheckpoint::open(dir)?;
        Ok(load(&mut ck, &mesh).expect_err("the load must fail").to_string())
    })
    .unwrap()
    .remove(0)
}

#[test]
fn checkpoints_that_do_not_fit_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &checkpoint_tensors());
    // The body under the wrong prefix: the hint names the right one.
    let e = error_of(dir.path(), |ck, mesh| Body::load_hf(ck, "", mesh).map(drop));
    assert!(e.contains("no tensor `norm.weight`") && e.contains("with prefix `model.`"), "{e}");
    // Under the right prefix the body loads alone (the head is outside the prefix).
    let ok = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        Body::load_hf(&mut HfCheckpoint::open(dir.path())?, "model.", &mesh).map(|b| b.layers.len())
    })
    .unwrap();
    assert_eq!(ok, vec![2; 4]);
    // A prefix under which nothing loads.
    let e = error_of(dir.path(), |ck, mesh| Norm::load_hf(ck, "nothing.", mesh).map(drop));
    assert!(e.contains("no tensor `nothing.weight`"), "{e}");
    // Plain data in the struct: named.
    let e = error_of(dir.path(), |ck, mesh| WithEps::load_hf(ck, "model.", mesh).map(drop));
    assert!(e.contains("`eps`") && e.contains("plain data"), "{e}");
    // Another mesh.
    let e = dtensor::run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        Ok(Causal::load_hf(&mut HfCheckpoint::open(dir.path())?, "", &mesh).map(drop).unwrap_err().to_string())
    })
    .unwrap()
    .remove(0);
    assert!(e.contains("mesh dims"), "{e}");

    // A module that is a bare `Vec` of layers, at the layers' prefix.
    let layers = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let v: Vec<Layer> = HfCheckpoint::open(dir.path())?.load_module("model.layers.", &mesh)?;
        Ok(v.len())
    })
    .unwrap();
    assert_eq!(layers, vec![2; 4]);

    // A tensor of another rank than the field's, and an extra tensor under the prefix.
    let mut bad = checkpoint_tensors();
    bad.iter_mut().find(|(n, _)| n == "model.norm.weight").unwrap().1 = tensor(&[2, 3], 1);
    let bad_dir = tempfile::tempdir().unwrap();
    write(bad_dir.path(), &bad);
    let e = error_of(bad_dir.path(), |ck, mesh| Causal::load_hf(ck, "", mesh).map(drop));
    assert!(e.contains("`model.norm.weight`") && e.contains("rank"), "{e}");
    let mut extra = checkpoint_tensors();
    extra.push(("model.layers.0.mlp.up_proj.weight".to_string(), tensor(&[4, 6], 2)));
    let extra_dir = tempfile::tempdir().unwrap();
    write(extra_dir.path(), &extra);
    let e = error_of(extra_dir.path(), |ck, mesh| Causal::load_hf(ck, "", mesh).map(drop));
    assert!(e.contains("model.layers.0.mlp.up_proj.weight") && e.contains("match no parameter"), "{e}");
    // ... which a map may ignore (as transformers drops buffers it does not hold).
    let ok = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let map = TensorMap::new().ignore("model.layers.*.mlp.up_proj.weight");
        HfCheckpoint::open(extra_dir.path())?
            .load_module_mapped::<f32, Causal>("", &mesh, &map)
            .map(|m| m.model.layers.len())
    })
    .unwrap();
    assert_eq!(ok, vec![2; 4]);
}
