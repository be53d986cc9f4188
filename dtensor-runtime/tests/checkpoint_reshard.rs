//! Sharded checkpoints: save on one mesh/layout, load on others, bit for bit.

mod common;

use common::{coord_of, expected_shard, global};
use dtensor_runtime::checkpoint::{self, Checkpoint};
use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::{
    distribute_tensor, from_local, run, DTensor, FromLocal, Partial, Placement, ReduceOp, Replicate, Shard,
};
use std::path::Path;

fn bits(a: &ArrayD<f64>) -> Vec<u64> {
    a.iter().map(|x| x.to_bits()).collect()
}

/// (name, global shape, placements on the 2×2 saving mesh): uneven shapes, an empty shard
/// (`e`: 1 row over 2 ranks), a replicated mesh dim (`b`) and a 3-D tensor (`t`).
fn spec() -> Vec<(&'static str, Vec<usize>, Vec<Placement>)> {
    vec![
        ("w", vec![5, 7], vec![Shard(0), Shard(1)]),
        ("v", vec![9, 4], vec![Shard(0), Shard(1)]),
        ("e", vec![1, 3], vec![Shard(0), Shard(1)]),
        ("b", vec![7], vec![Replicate, Shard(0)]),
        ("t", vec![3, 4, 5], vec![Shard(2), Shard(0)]),
    ]
}

fn globals() -> Vec<(&'static str, ArrayD<f64>)> {
    spec().into_iter().enumerate().map(|(i, (n, s, _))| (n, global(&s, i as u64 + 1))).collect()
}

fn save_on_2x2(dir: &Path) {
    let gs = globals();
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let state: Vec<(String, DTensor<f64>)> = spec()
            .iter()
            .zip(&gs)
            .map(|((n, _, p), (_, g))| Ok((n.to_string(), distribute_tensor(g, &mesh, p, None)?)))
            .collect::<dtensor_runtime::Result<_>>()?;
        checkpoint::save(dir, &state)
    })
    .unwrap();
}

/// Loads every tensor with `placements` on a mesh of `mesh_shape` and checks each rank's
/// shard against the slice of the global tensor, bit for bit, and that the rank read exactly
/// its shard's bytes. Returns one line per rank for the log.
fn load_and_check(dir: &Path, mesh_shape: &[usize], placements: &[Placement]) -> Vec<String> {
    let gs = globals();
    let world: usize = mesh_shape.iter().product();
    let names: Vec<&str> = (0..mesh_shape.len()).map(|i| ["a", "b", "c"][i]).collect();
    let lines = run(world, |ctx| {
        let mesh = ctx.init_device_mesh(mesh_shape, &names)?;
        let mut ckpt = Checkpoint::open(dir)?;
        let wanted: Vec<(&str, &[Placement])> = gs.iter().map(|(n, _)| (*n, placements)).collect();
        let loaded = ckpt.load::<f64>(&mesh, &wanted)?;
        let c = coord_of(ctx.rank(), mesh_shape);
        let mut line = format!("rank {} {:?}:", ctx.rank(), c);
        let mut need = 0u64;
        for ((name, dt), (gname, g)) in loaded.iter().zip(&gs) {
            assert_eq!(name, gname);
            assert_eq!(dt.shape(), g.shape());
            let norm: Vec<Placement> = placements.iter().map(|p| p.normalize(g.ndim()).unwrap()).collect();
            let want = expected_shard(g, mesh_shape, &c, &norm);
            assert_eq!(dt.local().shape(), want.shape(), "{name} on rank {}", ctx.rank());
            assert_eq!(bits(dt.local_cpu()?), bits(&want), "{name} on rank {}", ctx.rank());
            need += (want.len() * 8) as u64;
            line.push_str(&format!(" {name}{:?}@{:?}", dt.local().shape(), dt.local_offset()));
        }
        // Only the needed byte ranges were read.
        assert_eq!(ckpt.payload_bytes_read(), need, "rank {}", ctx.rank());
        line.push_str(&format!("  read {need} B from {:?}", ckpt.files_opened()));
        Ok(line)
    })
    .unwrap();
    lines
}

#[test]
fn save_2x2_s0_s1_load_on_4_ranks_s1_and_on_1_rank_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    save_on_2x2(dir.path());
    println!("saved on 2x2 (S(0), S(1)); `b` is (R, S(0)), `t` is (S(2), S(0))");
    println!("-- load on mesh [4] with (S(-1)): S(1) for 2-D, S(0) for 1-D, S(2) for 3-D:");
    for l in load_and_check(dir.path(), &[4], &[Shard(-1)]) {
        println!("{l}");
    }
    println!("-- load on mesh [1] with (R):");
    for l in load_and_check(dir.path(), &[1], &[Replicate]) {
        println!("{l}");
    }
    // And the full tensors, read offline, are the globals.
    let mut ckpt = Checkpoint::open(dir.path()).unwrap();
    for (name, g) in globals() {
        assert_eq!(bits(&ckpt.read_full::<f64>(name).unwrap()), bits(&g), "{name}");
    }
}

#[test]
fn load_onto_other_meshes_and_placements() {
    let dir = tempfile::tempdir().unwrap();
    save_on_2x2(dir.path());
    load_and_check(dir.path(), &[2, 2], &[Shard(-1), Shard(0)]);
    load_and_check(dir.path(), &[2, 2], &[Replicate, Replicate]);
    load_and_check(dir.path(), &[3], &[Shard(0)]);
    load_and_check(dir.path(), &[2, 3], &[Shard(0), Shard(0)]);
    // Same layout as saved: every rank opens only its own file (replicas and empty shards: none).
    let files = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let mut ckpt = Checkpoint::open(dir.path())?;
        ckpt.load::<f64>(&mesh, &[("w", &[Shard(0), Shard(1)][..]), ("v", &[Shard(0), Shard(1)][..])])?;
        Ok(ckpt.files_opened())
    })
    .unwrap();
    for (r, f) in files.iter().enumerate() {
        assert_eq!(f, &vec![checkpoint::shard_file_name(r)]);
    }
}

#[test]
fn index_describes_blocks_once() {
    let dir = tempfile::tempdir().unwrap();
    save_on_2x2(dir.path());
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let idx = ckpt.index();
    assert_eq!(idx.mesh.shape, vec![2, 2]);
    assert_eq!(idx.mesh.dim_names, vec!["dp".to_string(), "tp".to_string()]);
    let names: Vec<&str> = idx.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, vec!["w", "v", "e", "b", "t"]);
    let w = idx.tensor("w").unwrap();
    assert_eq!(w.placements, vec!["S(0)".to_string(), "S(1)".to_string()]);
    let blocks: Vec<(usize, Vec<usize>, Vec<usize>)> =
        w.shards.iter().map(|s| (s.rank, s.offset.clone(), s.shape.clone())).collect();
    // torch.chunk: 5 rows -> [3, 2], 7 cols -> [4, 3]
    assert_eq!(
        blocks,
        vec![
            (0, vec![0, 0], vec![3, 4]),
            (1, vec![0, 4], vec![3, 3]),
            (2, vec![3, 0], vec![2, 4]),
            (3, vec![3, 4], vec![2, 3])
        ]
    );
    // 1 row over 2: the dp=1 ranks hold empty shards and write nothing for `e`.
    assert_eq!(idx.tensor("e").unwrap().shards.iter().map(|s| s.rank).collect::<Vec<_>>(), vec![0, 1]);
    // Replicated over dp: written once, by one replica; `b` is the fourth tensor (salt 3), so
    // the dp=1 replicas write it (replicated tensors take turns among the replicas).
    assert_eq!(idx.tensor("b").unwrap().shards.iter().map(|s| s.rank).collect::<Vec<_>>(), vec![2, 3]);
}

#[test]
fn partial_is_reduced_before_saving() {
    let dir = tempfile::tempdir().unwrap();
    let parts = [global(&[3, 5], 11), global(&[3, 5], 12)];
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let p = from_local(parts[ctx.rank()].clone(), &mesh, &[Partial(ReduceOp::Sum)], FromLocal::default())?;
        checkpoint::save(dir.path(), &[("p".to_string(), p)])
    })
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.index().tensor("p").unwrap().placements, vec!["R".to_string()]);
    let got = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        checkpoint::load::<f64>(dir.path(), &mesh, &[("p", &[Replicate][..])])?.remove(0).1.to_host()
    })
    .unwrap();
    assert_eq!(bits(&got[0]), bits(&(&parts[0] + &parts[1])));
}

#[test]
fn full_export_is_a_plain_safetensors_file() {
    let dir = tempfile::tempdir().unwrap();
    save_on_2x2(dir.path());
    let online = dir.path().join("full.safetensors");
    let gs = globals();
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let state: Vec<(String, DTensor<f64>)> = spec()
            .iter()
            .zip(&gs)
            .map(|((n, _, p), (_, g))| Ok((n.to_string(), distribute_tensor(g, &mesh, p, None)?)))
            .collect::<dtensor_runtime::Result<_>>()?;
        checkpoint::save_full(&online, &state)
    })
    .unwrap();
    let offline = dir.path().join("consolidated.safetensors");
    Checkpoint::open(dir.path()).unwrap().export_full::<f64>(&offline).unwrap();
    for file in [&online, &offline] {
        let bytes = std::fs::read(file).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.len(), gs.len());
        for (name, g) in &gs {
            let t = st.tensor(name).unwrap();
            assert_eq!(t.dtype(), safetensors::Dtype::F64);
            assert_eq!(t.shape(), g.shape());
            let want: Vec<u8> = g.iter().flat_map(|x| x.to_le_bytes()).collect();
            assert_eq!(t.data(), &want[..], "{name} in {}", file.display());
        }
    }
}

#[test]
fn f32_round_trip_through_uneven_nested_sharding() {
    let dir = tempfile::tempdir().unwrap();
    let g: ArrayD<f32> = global(&[11, 3], 5).mapv(|x| x as f32 / 7.0);
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let t = distribute_tensor(&g, &mesh, &[Shard(0), Shard(0)], None)?;
        checkpoint::save(dir.path(), &[("g".to_string(), t)])
    })
    .unwrap();
    let got = run(3, |ctx| {
        let mesh = ctx.init_device_mesh(&[3], &["x"])?;
        let t = checkpoint::load::<f32>(dir.path(), &mesh, &[("g", &[Replicate][..])])?.remove(0).1;
        t.to_host()
    })
    .unwrap();
    for l in got {
        assert_eq!(
            l.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            g.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}
