//! Saving a state dict as a Hugging Face checkpoint: one `model.safetensors`, or files of at
//! most a given size listed by `model.safetensors.index.json` (what `save_pretrained` writes).

use super::index::{HfIndex, INDEX_FILE, SINGLE_FILE};
use crate::checkpoint::common_mesh;
use crate::checkpoint::shard_file::{pt_metadata, write_file, RawTensor};
use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::Along;
use std::collections::BTreeMap;
use std::path::Path;

/// Name of file `i` (from 0) of `n` of a sharded checkpoint: `model-00001-of-00003.safetensors`.
pub fn shard_file_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{n:05}.safetensors", i + 1)
}

/// Removes `dir/name` if it exists (a link is removed, not followed).
fn remove_stale(dir: &Path, name: &str) -> Result<()> {
    match std::fs::remove_file(dir.join(name)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::Checkpoint { path: dir.join(name).display().to_string(), reason: format!("cannot remove: {e}") })
        }
        _ => Ok(()),
    }
}

/// Creates `dir`; on the leader, removes the file of the other layout, which readers would
/// otherwise take for the checkpoint (`transformers` prefers `model.safetensors`).
fn prepare_dir(dir: &Path, leader: bool, stale: &str) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Checkpoint { path: dir.display().to_string(), reason: format!("cannot create: {e}") })?;
    if leader {
        remove_stale(dir, stale)?;
    }
    Ok(())
}

/// Saves `state` to `dir/model.safetensors` (full tensors in `T`'s dtype: `F32`, `F64`,
/// `BF16`, `F16`, `I64`, `I32` or `U8`).
///
/// Collective: every rank calls it with the same names in the same order; each full tensor
/// is gathered ([`DTensor::full_tensor`]) and the first rank of the mesh writes the file
/// atomically. A `model.safetensors.index.json` left in `dir` is removed.
pub fn save<T: Scalar>(dir: impl AsRef<Path>, state: &[(String, DTensor<T>)]) -> Result<()> {
    let dir = dir.as_ref();
    let mesh = common_mesh("checkpoint::hf::save", state)?;
    prepare_dir(dir, mesh.ranks()[0] == mesh.rank(), INDEX_FILE)?;
    crate::checkpoint::save_full(dir.join(SINGLE_FILE), state)
}

/// Saves `state` to `dir` as files of at most `max_file_bytes` of tensor data each (a tensor
/// larger than that gets a file of its own), filled in state-dict order and named by
/// [`shard_file_name`], plus `model.safetensors.index.json`, written last.
///
/// Collective, as [`save`]; the tensors of one file at a time are gathered, so a rank holds
/// at most one file's full tensors. A `model.safetensors` left in `dir` is removed (files of
/// an earlier sharded save that the new index does not name are left in place).
pub fn save_sharded<T: Scalar>(
    dir: impl AsRef<Path>,
    state: &[(String, DTensor<T>)],
    max_file_bytes: u64,
) -> Result<()> {
    let dir = dir.as_ref();
    let mesh = common_mesh("checkpoint::hf::save_sharded", state)?;
    let leader = mesh.ranks()[0] == mesh.rank();
    prepare_dir(dir, leader, SINGLE_FILE)?;
    if leader {
        // No index may describe files while they are being rewritten.
        remove_stale(dir, INDEX_FILE)?;
    }
    // Greedy packing in state-dict order. A tensor's byte size fits in `isize`: it exists.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut filled = 0u64;
    for (i, (_, t)) in state.iter().enumerate() {
        let bytes = (t.numel() * std::mem::size_of::<T>()) as u64;
        match groups.last_mut() {
            Some(g) if filled + bytes <= max_file_bytes => {
                g.push(i);
                filled += bytes;
            }
            _ => {
                groups.push(vec![i]);
                filled = bytes;
            }
        }
    }
    let n = groups.len();
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    for (k, group) in groups.iter().enumerate() {
        let file = shard_file_name(k, n);
        let mut full = Vec::with_capacity(group.len());
        for &i in group {
            let (name, t) = &state[i];
            let raw = RawTensor::of(&t.full_tensor()?);
            total += raw.data.len() as u64;
            weight_map.insert(name.clone(), file.clone());
            full.push((name.clone(), raw));
        }
        if leader {
            write_file(&dir.join(&file), &full, pt_metadata())?;
        }
    }
    if leader {
        let metadata = serde_json::Map::from_iter([("total_size".to_string(), total.into())]);
        HfIndex { metadata, weight_map }.write(&dir.join(INDEX_FILE))?;
    }
    mesh.barrier(Along::All)
}
