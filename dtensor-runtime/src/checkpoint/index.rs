//! The checkpoint index (`index.json`): what the checkpoint holds and where each shard lives.

use crate::element::DType;
use crate::error::{Error, Result};
use crate::placement::{Placement, ReduceOp};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Value of [`CheckpointIndex::format`].
pub const FORMAT: &str = "dtensor-rs/sharded-safetensors";
/// Value of [`CheckpointIndex::version`].
pub const VERSION: u32 = 1;
/// File name of the index inside a checkpoint directory.
pub const INDEX_FILE: &str = "index.json";

/// The index of a sharded checkpoint, stored as `index.json` next to the shard files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointIndex {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`].
    pub version: u32,
    /// The mesh the checkpoint was saved from.
    pub mesh: MeshInfo,
    /// Tensors in state-dict order.
    pub tensors: Vec<TensorEntry>,
}

/// The saving mesh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshInfo {
    pub shape: Vec<usize>,
    pub dim_names: Vec<String>,
    /// Global ranks, row-major.
    pub ranks: Vec<usize>,
}

/// One tensor of the state dict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorEntry {
    pub name: String,
    /// safetensors dtype name: `F32` or `F64`.
    pub dtype: String,
    /// Global shape.
    pub shape: Vec<usize>,
    /// Placements it was saved with (`S(0)`, `R`; Partials were reduced before saving).
    pub placements: Vec<String>,
    /// Every distinct non-empty block once (replicas are written by one rank only).
    pub shards: Vec<ShardEntry>,
}

/// Where one block of a tensor lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// File name inside the checkpoint directory.
    pub file: String,
    /// Global rank that wrote it.
    pub rank: usize,
    /// Global index of the block's first element.
    pub offset: Vec<usize>,
    /// Shape of the block.
    pub shape: Vec<usize>,
}

/// safetensors name of a dtype.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F64 => "F64",
    }
}

pub(crate) fn safetensors_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::F64 => safetensors::Dtype::F64,
    }
}

/// Parses a placement as [`Placement`]'s `Display` writes it: `S(0)`, `R`, `P(sum)`.
pub fn parse_placement(s: &str) -> Option<Placement> {
    let s = s.trim();
    if s == "R" {
        return Some(Placement::Replicate);
    }
    let inner = |p: &str| s.strip_prefix(p).and_then(|r| r.strip_suffix(')'));
    if let Some(d) = inner("S(") {
        return d.trim().parse::<isize>().ok().map(Placement::Shard);
    }
    inner("P(").and_then(ReduceOp::parse).map(Placement::Partial)
}

fn bad(path: &Path, reason: String) -> Error {
    Error::Checkpoint { path: path.display().to_string(), reason }
}

impl CheckpointIndex {
    /// Reads and validates `dir/index.json`.
    pub fn read(dir: &Path) -> Result<CheckpointIndex> {
        let path = dir.join(INDEX_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| bad(&path, format!("cannot read the index: {e}")))?;
        let index: CheckpointIndex =
            serde_json::from_str(&text).map_err(|e| bad(&path, format!("malformed index: {e}")))?;
        index.validate().map_err(|reason| bad(&path, reason))?;
        Ok(index)
    }

    /// Writes `dir/index.json` atomically (temporary file, then rename).
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(INDEX_FILE);
        let tmp = dir.join(format!("{INDEX_FILE}.tmp"));
        let text = serde_json::to_string_pretty(self).map_err(|e| bad(&path, format!("cannot encode: {e}")))?;
        std::fs::write(&tmp, text).map_err(|e| bad(&tmp, format!("cannot write: {e}")))?;
        std::fs::rename(&tmp, &path).map_err(|e| bad(&path, format!("cannot move the index into place: {e}")))
    }

    /// The entry called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Consistency checks, so that a damaged index cannot send reads out of bounds or out of
    /// the checkpoint directory.
    fn validate(&self) -> std::result::Result<(), String> {
        if self.format != FORMAT {
            return Err(format!("format `{}` is not `{FORMAT}`", self.format));
        }
        if self.version != VERSION {
            return Err(format!("version {} is not supported (expected {VERSION})", self.version));
        }
        for (i, t) in self.tensors.iter().enumerate() {
            let ctx = |m: String| format!("tensor `{}`: {m}", t.name);
            if self.tensors[..i].iter().any(|u| u.name == t.name) {
                return Err(ctx("appears twice".into()));
            }
            if t.dtype != "F32" && t.dtype != "F64" {
                return Err(ctx(format!("dtype `{}` is not F32 or F64", t.dtype)));
            }
            if t.placements.len() != self.mesh.shape.len() {
                return Err(ctx(format!("{} placements for a {}-d mesh", t.placements.len(), self.mesh.shape.len())));
            }
            if let Some(p) = t.placements.iter().find(|p| parse_placement(p).is_none()) {
                return Err(ctx(format!("unknown placement `{p}`")));
            }
            let mut covered = 0usize;
            for s in &t.shards {
                if s.file.is_empty() || s.file.contains(['/', '\\']) || s.file.starts_with('.') {
                    return Err(ctx(format!("shard file name `{}` is not a plain file name", s.file)));
                }
                if s.offset.len() != t.shape.len() || s.shape.len() != t.shape.len() {
                    return Err(ctx(format!("shard in `{}` has the wrong rank", s.file)));
                }
                if (0..t.shape.len()).any(|d| s.offset[d].checked_add(s.shape[d]).is_none_or(|e| e > t.shape[d])) {
                    return Err(ctx(format!(
                        "shard in `{}` at {:?} of shape {:?} lies outside {:?}",
                        s.file, s.offset, s.shape, t.shape
                    )));
                }
                covered = covered.saturating_add(s.shape.iter().product());
            }
            for (a, sa) in t.shards.iter().enumerate() {
                if let Some(sb) = t.shards[..a].iter().find(|sb| overlaps(sa, sb)) {
                    return Err(ctx(format!("shards in `{}` and `{}` overlap", sb.file, sa.file)));
                }
            }
            // Shards are disjoint blocks; together they must be the whole tensor.
            if covered != t.shape.iter().product::<usize>() {
                return Err(ctx(format!(
                    "shards hold {covered} elements but the tensor has {}",
                    t.shape.iter().product::<usize>()
                )));
            }
        }
        Ok(())
    }
}

/// Do two non-empty blocks share an element?
fn overlaps(a: &ShardEntry, b: &ShardEntry) -> bool {
    let nonempty = |s: &ShardEntry| s.shape.iter().all(|&x| x > 0);
    nonempty(a)
        && nonempty(b)
        && (0..a.offset.len()).all(|d| a.offset[d] < b.offset[d] + b.shape[d] && b.offset[d] < a.offset[d] + a.shape[d])
}
