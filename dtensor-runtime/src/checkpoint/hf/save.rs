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

/// Greedy packing in state-dict order into files of at most `max_file_bytes` (a tensor larger
/// than that gets a file of its own): the positions of the tensors of each file.
fn pack(sizes: &[u64], max_file_bytes: u64) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut filled = 0u64;
    for (i, &bytes) in sizes.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if filled.saturating_add(bytes) <= max_file_bytes => {
                g.push(i);
                filled += bytes;
            }
            _ => {
                groups.push(vec![i]);
                filled = bytes;
            }
        }
    }
    groups
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
    // A tensor's byte size fits in `isize`: it exists.
    let sizes: Vec<u64> = state.iter().map(|(_, t)| (t.numel() * std::mem::size_of::<T>()) as u64).collect();
    let groups = pack(&sizes, max_file_bytes);
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

/// Exports the model of a training state (a version directory of a
/// [`Checkpointer`](crate::checkpoint::Checkpointer)) as a Hugging Face checkpoint in `out`:
/// files of at most `max_file_bytes` named by [`shard_file_name`] and
/// `model.safetensors.index.json`, the tensors under the model's names (`named_parameters`,
/// then `named_buffers`) in the dtype they were saved in. Offline (no mesh): each tensor is
/// assembled from its saved blocks, one output file's tensors in memory at a time. Returns the
/// names written.
///
/// The names are the model's: a model whose parameters carry Hugging Face names (one loaded with
/// [`HfCheckpoint::load_into`](super::HfCheckpoint::load_into)) exports a directory
/// `transformers` loads with `from_pretrained` beside its `config.json`; `rename` maps each name
/// (return `None` to leave a tensor out).
pub fn export_train_state(
    version: impl AsRef<Path>,
    out: impl AsRef<Path>,
    max_file_bytes: u64,
    rename: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>> {
    use crate::element::DType;
    let version = version.as_ref();
    let meta = crate::checkpoint::read_meta(version)?;
    match DType::from_safetensors_name(&meta.dtype) {
        Some(DType::F32) => export_as::<f32>(version, out.as_ref(), max_file_bytes, rename, &meta),
        Some(DType::F64) => export_as::<f64>(version, out.as_ref(), max_file_bytes, rename, &meta),
        Some(DType::BF16) => export_as::<half::bf16>(version, out.as_ref(), max_file_bytes, rename, &meta),
        Some(DType::F16) => export_as::<half::f16>(version, out.as_ref(), max_file_bytes, rename, &meta),
        _ => Err(Error::Checkpoint {
            path: version.display().to_string(),
            reason: format!("a model of dtype `{}` cannot be exported", meta.dtype),
        }),
    }
}

fn export_as<T: Scalar>(
    version: &Path,
    out: &Path,
    max_file_bytes: u64,
    rename: &dyn Fn(&str) -> Option<String>,
    meta: &crate::checkpoint::TrainStateMeta,
) -> Result<Vec<String>> {
    let mut ck = crate::checkpoint::Checkpoint::open(version)?;
    let mut names: Vec<(String, String)> = Vec::new(); // (name in the checkpoint, exported name)
    let mut seen = std::collections::HashSet::new();
    for n in meta.parameters.iter().chain(&meta.buffers) {
        if let Some(to) = rename(n) {
            if !seen.insert(to.clone()) {
                return Err(Error::InvalidArgument {
                    context: "checkpoint::hf::export_train_state".into(),
                    reason: format!("two tensors are exported as `{to}`"),
                });
            }
            names.push((crate::checkpoint::model_tensor_name(n), to));
        }
    }
    let mut sizes = Vec::with_capacity(names.len());
    for (from, _) in &names {
        let e = ck.index().tensor(from).ok_or_else(|| Error::Checkpoint {
            path: version.display().to_string(),
            reason: format!("tensor `{from}` is missing from the index"),
        })?;
        let bytes = crate::shape::checked_numel("export", &e.shape)?.checked_mul(std::mem::size_of::<T>());
        sizes.push(
            bytes.ok_or_else(|| Error::ShapeOverflow {
                context: format!("export of `{from}`"),
                shape: e.shape.clone(),
            })? as u64,
        );
    }
    prepare_dir(out, true, SINGLE_FILE)?;
    remove_stale(out, INDEX_FILE)?;
    let groups = pack(&sizes, max_file_bytes);
    let n = groups.len();
    let (mut weight_map, mut total) = (BTreeMap::new(), 0u64);
    for (k, group) in groups.iter().enumerate() {
        let file = shard_file_name(k, n);
        let mut full = Vec::with_capacity(group.len());
        for &i in group {
            let (from, to) = &names[i];
            let raw = RawTensor::of(&ck.read_full::<T>(from)?);
            total += raw.data.len() as u64;
            weight_map.insert(to.clone(), file.clone());
            full.push((to.clone(), raw));
        }
        write_file(&out.join(&file), &full, pt_metadata())?;
    }
    let metadata = serde_json::Map::from_iter([("total_size".to_string(), total.into())]);
    HfIndex { metadata, weight_map }.write(&out.join(INDEX_FILE))?;
    Ok(names.into_iter().map(|(_, to)| to).collect())
}
