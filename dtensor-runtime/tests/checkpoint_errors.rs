//! Damaged, missing and misused checkpoints give typed errors naming the file.

mod checkpoint_util;
mod common;

use checkpoint_util::{expect_checkpoint_error, save_2x2};
use common::global;
use dtensor_runtime::checkpoint::{self, Checkpoint};
use dtensor_runtime::{distribute_tensor, run, Error, Partial, Placement, ReduceOp, Replicate, Shard};
use std::path::Path;

fn load_1(dir: &Path, name: &str, p: Placement) -> dtensor_runtime::Result<()> {
    run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        checkpoint::load::<f64>(dir, &mesh, &[(name, &[p][..])]).map(|_| ())
    })
    .map(|_| ())
}

#[test]
fn missing_index_and_missing_shard_file() {
    let dir = tempfile::tempdir().unwrap();
    expect_checkpoint_error(load_1(dir.path(), "w", Replicate), "index.json", "cannot open");
    save_2x2(dir.path());
    std::fs::remove_file(dir.path().join("shard-00002.safetensors")).unwrap();
    expect_checkpoint_error(load_1(dir.path(), "w", Replicate), "shard-00002.safetensors", "cannot open");
}

#[test]
fn truncated_shard_files() {
    let dir = tempfile::tempdir().unwrap();
    save_2x2(dir.path());
    let f = dir.path().join("shard-00001.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.set_len(len - 5).unwrap();
    expect_checkpoint_error(load_1(dir.path(), "w", Replicate), "shard-00001.safetensors", "truncated");
    file.set_len(4).unwrap();
    expect_checkpoint_error(load_1(dir.path(), "w", Replicate), "shard-00001.safetensors", "truncated");
}

#[test]
fn bad_headers() {
    let dir = tempfile::tempdir().unwrap();
    save_2x2(dir.path());
    let f = dir.path().join("shard-00003.safetensors");
    let good = std::fs::read(&f).unwrap();
    // Header length far past the end of the file.
    let mut bytes = good.clone();
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&f, &bytes).unwrap();
    expect_checkpoint_error(load_1(dir.path(), "w", Replicate), "shard-00003.safetensors", "bad header");
    // Header that is not JSON.
    let mut bytes = good.clone();
    bytes[8] = b'X';
    std::fs::write(&f, &bytes).unwrap();
    expect_checkpoint_error(load_1(dir.path(), "w", Replicate), "shard-00003.safetensors", "bad header");
    // Valid file, but the tensor has another shape than the index says.
    let other = global(&[3, 3], 2);
    run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let t = distribute_tensor(&other, &mesh, &[Replicate], None)?;
        checkpoint::save(dir.path().join("other"), &[("w".to_string(), t)])
    })
    .unwrap();
    std::fs::copy(dir.path().join("other/shard-00000.safetensors"), &f).unwrap();
    expect_checkpoint_error(load_1(dir.path(), "w", Replicate), "shard-00003.safetensors", "index says");
}

#[test]
fn damaged_index() {
    let dir = tempfile::tempdir().unwrap();
    save_2x2(dir.path());
    let idx = dir.path().join("index.json");
    let good = std::fs::read_to_string(&idx).unwrap();
    std::fs::write(&idx, &good[..good.len() / 2]).unwrap();
    expect_checkpoint_error(load_1(dir.path(), "w", Replicate), "index.json", "malformed");
    // A shard file outside the checkpoint directory is refused.
    std::fs::write(&idx, good.replace("shard-00001.safetensors", "../shard-00001.safetensors")).unwrap();
    expect_checkpoint_error(load_1(dir.path(), "w", Replicate), "index.json", "plain file name");
    // Blocks that do not tile the tensor are refused.
    std::fs::write(
        &idx,
        good.replacen(
            "\"offset\": [\n            0,\n            4",
            "\"offset\": [\n            0,\n            3",
            1,
        ),
    )
    .unwrap();
    expect_checkpoint_error(load_1(dir.path(), "w", Replicate), "index.json", "overlap");
}

#[test]
fn misuse() {
    let dir = tempfile::tempdir().unwrap();
    save_2x2(dir.path());
    expect_checkpoint_error(load_1(dir.path(), "nope", Replicate), "index.json", "no tensor `nope`");
    let r = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        checkpoint::load::<f32>(dir.path(), &mesh, &[("w", &[Replicate][..])]).map(|_| ())
    });
    expect_checkpoint_error(r.map(|_| ()), "index.json", "requested as F32");
    assert!(matches!(load_1(dir.path(), "w", Partial(ReduceOp::Sum)), Err(Error::PartialNotAllowed { .. })));
    assert!(matches!(load_1(dir.path(), "w", Shard(2)), Err(Error::ShardDimOutOfRange { dim: 2, ndim: 2 })));
    let g = global(&[2], 1);
    let r = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        let t = distribute_tensor(&g, &mesh, &[Replicate], None)?;
        checkpoint::save(dir.path(), &[("a".to_string(), t.clone()), ("a".to_string(), t)])
    });
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    let empty: Vec<(String, dtensor_runtime::DTensor<f64>)> = vec![];
    assert!(matches!(checkpoint::save(dir.path(), &empty), Err(Error::InvalidArgument { .. })));
    // Opening alone reads no shard file.
    assert!(Checkpoint::open(dir.path()).unwrap().files_opened().is_empty());
}
