//! What one rank saves of a sharded checkpoint, taken apart from the writing: each tensor's
//! index entry, and a host copy of the blocks this rank owns. Taking the snapshot is the part
//! of a save that must happen before training goes on (the copy); writing it may happen later,
//! on another thread ([`Checkpointer::save_async`](super::Checkpointer::save_async)).

use super::index::{CheckpointIndex, MeshInfo, ShardEntry, TensorEntry, FORMAT, VERSION};
use super::shard_file::{write_file, RawTensor};
use super::shard_file_name;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::mesh::DeviceMesh;
use crate::placement::Placement;
use crate::storage::Storage;
use std::collections::HashMap;
use std::path::Path;

/// The blocks of a tensor with `placements` as saved: one per distinct non-empty block. A
/// block held by several replicas (the mesh dims that do not shard the tensor) is written by
/// one of them, the `salt`-th modulo their number in row-major order: with the tensor's
/// position as the salt, the replicated tensors of a state spread over the replicas instead of
/// all landing on the first rank (pure data parallelism would otherwise write everything from
/// rank 0).
pub(crate) fn owned_blocks(
    shape: &[usize],
    mesh: &DeviceMesh,
    placements: &[Placement],
    salt: usize,
) -> Result<Vec<ShardEntry>> {
    let replica_dims: Vec<usize> = (0..placements.len()).filter(|&d| !placements[d].is_shard()).collect();
    let replicas: usize = replica_dims.iter().map(|&d| mesh.shape()[d]).product();
    let writer = salt % replicas.max(1);
    let mut out = Vec::new();
    for &rank in mesh.ranks() {
        let c = mesh.coordinate_of(rank)?;
        let replica = replica_dims.iter().fold(0, |i, &d| i * mesh.shape()[d] + c[d]);
        if replica != writer {
            continue;
        }
        let (sz, off) = local_shape_and_offset(shape, mesh.shape(), &c, placements);
        if sz.iter().all(|&s| s > 0) {
            out.push(ShardEntry { file: shard_file_name(rank), rank, offset: off, shape: sz });
        }
    }
    Ok(out)
}

/// The bytes a shard is saved as (a device shard goes through a host copy).
fn raw_shard<T: Scalar>(local: &Storage<T>) -> Result<RawTensor> {
    Ok(match local.as_cpu() {
        Some(a) => RawTensor::of(a),
        None => RawTensor::of(&local.to_host()?),
    })
}

/// This rank's part of a save: every tensor's index entry (the same on every rank) and the
/// bytes of the blocks this rank writes.
pub(crate) struct Snapshot {
    mesh: MeshInfo,
    rank: usize,
    entries: Vec<TensorEntry>,
    mine: Vec<(String, RawTensor)>,
    meta: HashMap<String, String>,
}

impl Snapshot {
    /// An empty snapshot of `mesh` taken on this rank.
    pub(crate) fn new(mesh: &DeviceMesh) -> Snapshot {
        let rank = mesh.rank();
        Snapshot {
            mesh: MeshInfo {
                shape: mesh.shape().to_vec(),
                dim_names: mesh.dim_names().to_vec(),
                ranks: mesh.ranks().to_vec(),
            },
            rank,
            entries: Vec::new(),
            mine: Vec::new(),
            meta: HashMap::from([("format".to_string(), FORMAT.to_string()), ("rank".to_string(), rank.to_string())]),
        }
    }

    /// Adds tensor `name`: this rank's shard `local` of a tensor of global `shape` laid out
    /// with `placements` (no Partial) over `mesh`, copied if this rank owns its block.
    pub(crate) fn add<T: Scalar>(
        &mut self,
        name: &str,
        local: &Storage<T>,
        mesh: &DeviceMesh,
        placements: &[Placement],
        shape: &[usize],
    ) -> Result<()> {
        if name.is_empty() || name == "__metadata__" {
            return Err(Error::InvalidArgument {
                context: "checkpoint".into(),
                reason: format!("`{name}` cannot be a tensor name"),
            });
        }
        if self.entries.iter().any(|e| e.name == name) {
            return Err(Error::InvalidArgument {
                context: "checkpoint".into(),
                reason: format!("tensor name `{name}` appears twice"),
            });
        }
        if mesh.shape() != self.mesh.shape.as_slice() || mesh.ranks() != self.mesh.ranks.as_slice() {
            return Err(Error::MeshMismatch {
                context: format!("checkpoint: tensor `{name}`"),
                left: format!("{:?}", self.mesh.shape),
                right: mesh.to_string(),
            });
        }
        if let Some(p) = placements.iter().find(|p| p.is_partial()) {
            return Err(Error::PartialNotAllowed { placement: *p, context: format!("checkpoint: tensor `{name}`") });
        }
        let (want, offset) = local_shape_and_offset(shape, mesh.shape(), mesh.coordinate(), placements);
        if local.shape() != want.as_slice() {
            return Err(Error::ShapeMismatch {
                context: format!("checkpoint: the local shard of `{name}` does not match its layout"),
                expected: want,
                actual: local.shape().to_vec(),
            });
        }
        let blocks = owned_blocks(shape, mesh, placements, self.entries.len())?;
        if blocks.iter().any(|b| b.rank == self.rank) {
            self.mine.push((name.to_string(), raw_shard(local)?));
            self.meta.insert(format!("{name}.offset"), format!("{offset:?}"));
            self.meta.insert(format!("{name}.global_shape"), format!("{shape:?}"));
        }
        self.entries.push(TensorEntry {
            name: name.to_string(),
            dtype: T::DTYPE.safetensors_name().to_string(),
            shape: shape.to_vec(),
            placements: placements.iter().map(|p| p.to_string()).collect(),
            shards: blocks,
        });
        Ok(())
    }

    /// Bytes of tensor data this rank writes.
    pub(crate) fn bytes(&self) -> usize {
        self.mine.iter().map(|(_, t)| t.data.len()).sum()
    }

    /// Writes this rank's shard file into `dir` (none when it owns no block); returns whether
    /// it wrote one. With `sync`, the file's data reach the disk before it returns.
    pub(crate) fn write_mine(&self, dir: &Path, sync: bool) -> Result<bool> {
        if self.mine.is_empty() {
            return Ok(false);
        }
        let path = dir.join(shard_file_name(self.rank));
        write_file(&path, &self.mine, self.meta.clone())?;
        if sync {
            let f = std::fs::File::open(&path).and_then(|f| f.sync_all().map(|()| f));
            f.map_err(|e| Error::Checkpoint { path: path.display().to_string(), reason: format!("cannot sync: {e}") })?;
        }
        Ok(true)
    }

    /// The checkpoint's index.
    pub(crate) fn index(&self) -> CheckpointIndex {
        CheckpointIndex {
            format: FORMAT.into(),
            version: VERSION,
            mesh: self.mesh.clone(),
            tensors: self.entries.clone(),
        }
    }
}
