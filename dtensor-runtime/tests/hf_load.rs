//! Hugging Face checkpoints loaded onto meshes by a plan (every shard checked against the
//! slice of the global tensor, dtype converted on load, bytes read exactly the shard's), and
//! saved back full or sharded with an index.

mod common;
mod hf_util;

use common::{coord_of, expected_shard, global};
use dtensor_runtime::checkpoint::hf::{self, HfCheckpoint, LoadPlan, INDEX_FILE, SINGLE_FILE};
use dtensor_runtime::module::{ColwiseParallel, LayerKind, Linear, Module, RowwiseParallel};
use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::{distribute_tensor, run, Element, Error, Placement, ReduceOp, Replicate, Shard};
use hf_util::{expect_checkpoint, through, write_index, write_st};
use safetensors::Dtype;
use std::path::Path;

/// Name, stored dtype, shape of the test checkpoint: every loadable dtype, uneven shapes.
const TENSORS: [(&str, Dtype, &[usize]); 5] = [
    ("model.embed_tokens.weight", Dtype::BF16, &[5, 3]),
    ("model.layers.0.mlp.up_proj.weight", Dtype::F16, &[7, 3]),
    ("model.layers.0.mlp.down_proj.weight", Dtype::F32, &[3, 7]),
    ("model.norm.weight", Dtype::F64, &[3]),
    ("lm_head.weight", Dtype::F32, &[5, 3]),
];

fn values(i: usize) -> ArrayD<f64> {
    global(TENSORS[i].2, i as u64)
}

/// Writes the test checkpoint: one file, or two files and an index.
fn write_checkpoint(dir: &Path, sharded: bool) {
    let vals: Vec<ArrayD<f64>> = (0..TENSORS.len()).map(values).collect();
    let all: Vec<(&str, Dtype, &ArrayD<f64>)> = TENSORS.iter().zip(&vals).map(|(t, v)| (t.0, t.1, v)).collect();
    if !sharded {
        write_st(&dir.join(SINGLE_FILE), &all);
        return;
    }
    write_st(&dir.join("model-00001-of-00002.safetensors"), &all[..2]);
    write_st(&dir.join("model-00002-of-00002.safetensors"), &all[2..]);
    let map: Vec<(&str, &str)> = TENSORS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (t.0, if i < 2 { "model-00001-of-00002.safetensors" } else { "model-00002-of-00002.safetensors" })
        })
        .collect();
    write_index(dir, &map);
}

fn plan() -> LoadPlan {
    LoadPlan::new()
        .layer("model.embed_tokens", LayerKind::Embedding, RowwiseParallel::new())
        .style("model.layers.*.mlp.up_proj", ColwiseParallel::new())
        .style("model.layers.*.mlp.down_proj", RowwiseParallel::new())
        .placements("lm_head.weight", &[Shard(1), Shard(0)])
}

/// The placements `plan()` gives on a `[dp, tp]` mesh, in `TENSORS` order.
fn planned() -> Vec<Vec<Placement>> {
    vec![
        vec![Replicate, Shard(0)],
        vec![Replicate, Shard(0)],
        vec![Replicate, Shard(1)],
        vec![Replicate, Replicate],
        vec![Shard(1), Shard(0)],
    ]
}

/// Loads the checkpoint in `dir` on a 2 x 2 mesh as `T` and checks every shard and the bytes read.
fn check_2x2<T: Element>(dir: &Path) {
    let per_rank = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let mut ck = HfCheckpoint::open(dir)?;
        let sd = ck.load::<T>(&mesh, &plan())?;
        let mut expected_bytes = 0;
        for (i, (name, dtype, _)) in TENSORS.iter().enumerate() {
            let (_, t) = sd.iter().find(|(n, _)| n == name).expect("loaded");
            assert_eq!(t.placements(), planned()[i].as_slice(), "{name}");
            let want =
                expected_shard(&through(*dtype, &values(i)), &[2, 2], &coord_of(ctx.rank(), &[2, 2]), t.placements());
            let got = t.to_host()?.mapv(|x| x.as_f64());
            let want = want.mapv(|x| T::of_f64(x).as_f64());
            assert_eq!(got, want, "rank {} {name}", ctx.rank());
            expected_bytes += (want.len() * dtype.bitsize() / 8) as u64;
        }
        assert_eq!(ck.payload_bytes_read(), expected_bytes, "rank {} reads exactly its shards", ctx.rank());
        Ok(ck.payload_bytes_read())
    })
    .unwrap();
    let total: u64 = (0..TENSORS.len()).map(|i| (values(i).len() * TENSORS[i].1.bitsize() / 8) as u64).sum();
    assert!(per_rank.iter().all(|&b| b < total), "{per_rank:?} of {total}");
}

#[test]
fn single_file_onto_2x2_as_f32_and_f64() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), false);
    check_2x2::<f32>(dir.path());
    check_2x2::<f64>(dir.path());
    // The file path itself opens too.
    let ck = HfCheckpoint::open(dir.path().join(SINGLE_FILE)).unwrap();
    assert_eq!(ck.names().len(), TENSORS.len());
}

#[test]
fn sharded_index_onto_2x2_opens_only_the_files_needed() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), true);
    check_2x2::<f32>(dir.path());
    run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let mut ck = HfCheckpoint::open(dir.path().join(INDEX_FILE))?;
        assert!(ck.files_opened().is_empty(), "opening reads the index only");
        let t = ck.load_tensor::<f64>("model.norm.weight", &mesh, &[Replicate])?;
        assert_eq!(t.to_host()?, values(3));
        assert_eq!(ck.files_opened(), ["model-00002-of-00002.safetensors"]);
        assert_eq!(ck.payload_bytes_read(), 3 * 8);
        let info = ck.info("model.embed_tokens.weight")?;
        assert_eq!(
            (info.file.as_str(), info.dtype.as_str(), info.shape),
            ("model-00001-of-00002.safetensors", "BF16", vec![5, 3])
        );
        Ok(())
    })
    .unwrap();
}

/// torch.chunk semantics: 3 rows over 4 ranks are 1, 1, 1, 0; the empty shard reads nothing.
#[test]
fn uneven_and_empty_shards() {
    let dir = tempfile::tempdir().unwrap();
    let g = global(&[3, 5], 9);
    write_st(&dir.path().join(SINGLE_FILE), &[("w", Dtype::BF16, &g)]);
    let got = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["tp"])?;
        let mut ck = HfCheckpoint::open(dir.path())?;
        let rows = ck.load_tensor::<f32>("w", &mesh, &[Shard(0)])?;
        let cols = ck.load_tensor::<f32>("w", &mesh, &[Shard(1)])?; // 5 over 4: 2, 2, 1, 0
        let c = coord_of(ctx.rank(), &[4]);
        assert_eq!(rows.to_host()?.mapv(f64::from), expected_shard(&g, &[4], &c, &[Shard(0)]));
        assert_eq!(cols.to_host()?.mapv(f64::from), expected_shard(&g, &[4], &c, &[Shard(1)]));
        Ok((rows.to_local().shape().to_vec(), ck.payload_bytes_read()))
    })
    .unwrap();
    assert_eq!(got[3].0, vec![0, 5]);
    assert_eq!(got.iter().map(|g| g.1).collect::<Vec<_>>(), [(5 + 6) * 2, (5 + 6) * 2, (5 + 3) * 2, 0]);
}

#[test]
fn partial_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_st(&dir.path().join(SINGLE_FILE), &[("w", Dtype::F32, &global(&[2, 2], 1))]);
    let e = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        HfCheckpoint::open(dir.path())?.load_tensor::<f32>("w", &mesh, &[Placement::Partial(ReduceOp::Sum)]).map(|_| ())
    })
    .unwrap_err();
    assert!(matches!(e, Error::PartialNotAllowed { ref context, .. } if context.contains("`w`")), "{e}");
}

/// Plan mistakes are errors: a tensor matched twice, a pattern matching nothing (a typo), a
/// style that does not apply, an unknown mesh dim.
#[test]
fn plan_mistakes_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), false);
    let path = dir.path();
    let try_plan = |plan: LoadPlan| {
        run(4, move |ctx| {
            let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
            HfCheckpoint::open(path)?.load::<f32>(&mesh, &plan).map(|_| ())
        })
        .unwrap_err()
        .to_string()
    };
    let twice = plan().placements("model.layers.*.mlp.up_proj.weight", &[Replicate, Replicate]);
    assert!(try_plan(twice).contains("matched by two entries"));
    let typo = plan().style("model.layer.*.mlp.gate_proj", ColwiseParallel::new());
    assert!(try_plan(typo).contains("pattern `model.layer.*.mlp.gate_proj` matches no tensor"));
    let norm = LoadPlan::new().layer("model.embed_tokens", LayerKind::Norm, ColwiseParallel::new().mesh_dim("tp"));
    let e = try_plan(norm);
    assert!(e.contains("model.embed_tokens.weight") && e.contains("ColwiseParallel does not apply"), "{e}");
    // Rowwise shards a Linear weight's dim 1, which a 1-d norm weight does not have.
    let e = try_plan(LoadPlan::new().style("model.norm", RowwiseParallel::new()));
    assert!(e.contains("`model.norm.weight`") && e.contains("Shard(1)"), "{e}");
    let dim = LoadPlan::new().style("model.layers.0.mlp.up_proj", ColwiseParallel::new().mesh_dim("pp"));
    assert!(try_plan(dim).contains("`pp`"));
    let empty = LoadPlan::new().placements("model..norm", &[Replicate, Replicate]);
    assert!(try_plan(empty).contains("empty component"));
}

/// Rust save (full and sharded by size) → load gives the same tensors; the files are plain
/// safetensors with `format: pt` and the index lists every tensor with the total size.
#[test]
fn save_full_and_sharded_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (full_dir, sharded_dir) = (dir.path().join("full"), dir.path().join("sharded"));
    let gs: Vec<ArrayD<f64>> =
        [&[5usize, 3][..], &[7, 3], &[3]].iter().enumerate().map(|(i, s)| global(s, i as u64)).collect();
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let pl: [&[Placement]; 3] = [&[Shard(0), Shard(1)], &[Replicate, Shard(0)], &[Shard(0), Replicate]];
        let sd = gs
            .iter()
            .zip(pl)
            .enumerate()
            .map(|(i, (g, p))| Ok((format!("t{i}"), distribute_tensor(g, &mesh, p, None)?)))
            .collect::<dtensor_runtime::Result<Vec<_>>>()?;
        hf::save(&full_dir, &sd)?;
        hf::save_sharded(&sharded_dir, &sd, 7 * 3 * 8)
    })
    .unwrap();
    // t0 (120 B) and t1 (168 B) do not fit together in 168; t1 alone does, then t2 (24 B) starts a third.
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sharded_dir.join(INDEX_FILE)).unwrap()).unwrap();
    assert_eq!(index["metadata"]["total_size"], 8 * (15 + 21 + 3));
    assert_eq!(index["weight_map"]["t0"], "model-00001-of-00003.safetensors");
    assert_eq!(index["weight_map"]["t1"], "model-00002-of-00003.safetensors");
    assert_eq!(index["weight_map"]["t2"], "model-00003-of-00003.safetensors");
    assert!(!sharded_dir.join(SINGLE_FILE).exists() && !full_dir.join(INDEX_FILE).exists());
    let bytes = std::fs::read(full_dir.join(SINGLE_FILE)).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(meta.metadata().as_ref().unwrap()["format"], "pt");
    for d in [&full_dir, &sharded_dir] {
        let mut ck = HfCheckpoint::open(d).unwrap();
        assert_eq!(ck.names(), ["t0", "t1", "t2"]);
        for (i, g) in gs.iter().enumerate() {
            assert_eq!(&ck.read_full::<f64>(&format!("t{i}")).unwrap(), g);
        }
    }
    // Saving sharded over a full save leaves one layout: the index.
    run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let sd = vec![("t0".to_string(), distribute_tensor(&gs[0], &mesh, &[Replicate], None)?)];
        hf::save_sharded(&full_dir, &sd, 1 << 20)
    })
    .unwrap();
    assert!(!full_dir.join(SINGLE_FILE).exists());
    assert_eq!(HfCheckpoint::open(&full_dir).unwrap().names(), ["t0"]);
}

/// A module's parameters loaded by name and prefix, sharded by the plan; strict about names
/// and shapes.
#[test]
fn load_into_a_module() {
    let dir = tempfile::tempdir().unwrap();
    let (w, b) = (global(&[6, 4], 1), global(&[6], 2));
    write_st(&dir.path().join(SINGLE_FILE), &[("up.weight", Dtype::BF16, &w), ("up.bias", Dtype::F32, &b)]);
    let split_dir = tempfile::tempdir().unwrap();
    write_st(&split_dir.path().join(SINGLE_FILE), &[("a.weight", Dtype::F32, &w), ("b.bias", Dtype::F32, &b)]);
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let mut ck = HfCheckpoint::open(dir.path())?;
        let mut lin = Linear::<f32>::new(4, 6, true)?;
        ck.load_into(&mut lin, "up.", &mesh, &LoadPlan::new().style("up", ColwiseParallel::new()))?;
        assert_eq!(lin.weight.placements(), &[Shard(0)]);
        assert!(lin.weight.requires_grad());
        assert_eq!(lin.weight.full_tensor()?.mapv(f64::from), w);
        assert_eq!(lin.bias.as_ref().unwrap().full_tensor()?.mapv(f64::from), b);
        // Shape mismatch, missing tensor, tensor without a parameter.
        let mut wrong = Linear::<f32>::new(6, 4, true)?;
        expect_checkpoint(
            ck.load_into(&mut wrong, "up.", &mesh, &LoadPlan::new()),
            SINGLE_FILE,
            &["`up.weight`", "[6, 4]", "[4, 6]"],
        );
        let mut no_bias = Linear::<f32>::new(4, 6, false)?;
        expect_checkpoint(
            ck.load_into(&mut no_bias, "up.", &mesh, &LoadPlan::new()),
            SINGLE_FILE,
            &["up.bias", "no parameter"],
        );
        expect_checkpoint(
            ck.load_into(&mut lin, "down.", &mesh, &LoadPlan::new()),
            SINGLE_FILE,
            &[
                "no tensor for 2 of the module's 2 parameters with prefix `down.`",
                "\"down.weight\"",
                "with prefix `up.` every parameter has a tensor",
            ],
        );
        // No prefix at all: the hint names the one that matches every parameter.
        expect_checkpoint(
            ck.load_into(&mut lin, "", &mesh, &LoadPlan::new()),
            SINGLE_FILE,
            &["with prefix `up.` every parameter has a tensor"],
        );
        // No prefix covers every parameter: no hint, rather than a wrong one.
        let mut split = HfCheckpoint::open(split_dir.path())?;
        let err = split.load_into(&mut lin, "", &mesh, &LoadPlan::new()).unwrap_err().to_string();
        assert!(
            err.contains("no tensor for 2 of the module's 2 parameters") && !err.contains("every parameter"),
            "{err}"
        );
        assert_eq!(no_bias.named_parameters().len(), 1);
        Ok(())
    })
    .unwrap();
}

/// A module whose type declares its parameters' layouts, as the `Module` impl of a
/// `#[distribute]` struct does (column-parallel here).
struct DeclaredColwise(Linear<f32>);

impl Module<f32> for DeclaredColwise {
    fn named_parameters(&self) -> Vec<(String, &dtensor_runtime::DTensor<f32>)> {
        self.0.named_parameters()
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut dtensor_runtime::DTensor<f32>)> {
        self.0.named_parameters_mut()
    }
    fn declared_placements(&self) -> Vec<(String, Vec<Placement>)> {
        vec![("weight".into(), vec![Shard(0)]), ("bias".into(), vec![Shard(0)])]
    }
}

/// Issue 31 ("`load_into` with a plan that gives another layout than the field declares"):
/// refused before any parameter is replaced, naming the parameter and both layouts; the plan
/// that agrees loads.
#[test]
fn load_into_keeps_the_declared_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let (w, b) = (global(&[6, 4], 1), global(&[6], 2));
    write_st(&dir.path().join(SINGLE_FILE), &[("up.weight", Dtype::BF16, &w), ("up.bias", Dtype::F32, &b)]);
    let split_dir = tempfile::tempdir().unwrap();
    write_st(&split_dir.path().join(SINGLE_FILE), &[("a.weight", Dtype::F32, &w), ("b.bias", Dtype::F32, &b)]);
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let mut ck = HfCheckpoint::open(dir.path())?;
        let mut m = DeclaredColwise(Linear::<f32>::new(4, 6, true)?);
        let before = m.0.weight.to_host()?;
        match ck.load_into(&mut m, "up.", &mesh, &LoadPlan::new().style("up", RowwiseParallel::new())) {
            Err(Error::DeclaredLayout { parameter, declared, actual, by }) => {
                assert_eq!((parameter.as_str(), declared.as_str(), actual.as_str()), ("weight", "(S(0))", "(S(1))"));
                assert!(by.contains("load_into"), "{by}");
            }
            other => panic!("expected DeclaredLayout, got {other:?}"),
        }
        assert_eq!(m.0.weight.to_host()?, before, "nothing is replaced before the refusal");
        ck.load_into(&mut m, "up.", &mesh, &LoadPlan::new().style("up", ColwiseParallel::new()))?;
        assert_eq!(m.0.weight.placements(), &[Shard(0)]);
        assert_eq!(m.0.weight.full_tensor()?.mapv(f64::from), w);
        Ok(())
    })
    .unwrap();
}
