//! The checkpoint index (`index.json`): what the checkpoint holds and where each shard lives.

use super::safe_file::{is_plain_name, write_atomic, SafeDir, MAX_INDEX_BYTES};
use crate::element::DType;
use crate::error::{Error, Result};
use crate::placement::Placement;
use crate::shape::checked_numel;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::Write;
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
    /// Number of ranks along each mesh dim.
    pub shape: Vec<usize>,
    /// Names of the mesh dims, one per entry of `shape`.
    pub dim_names: Vec<String>,
    /// Global ranks, row-major.
    pub ranks: Vec<usize>,
}

/// One tensor of the state dict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// Key of the tensor in the state dict.
    pub name: String,
    /// safetensors dtype name: `F32` or `F64`.
    pub dtype: String,
    /// Global shape.
    pub shape: Vec<usize>,
    /// Placements it was saved with (`S(0)`, `R`; Partials were reduced before saving).
    pub placements: Vec<String>,
    /// Every distinct non-empty block once (replicas are written by one rank only). The
    /// blocks form a grid: along each tensor dim their ranges partition the dim, and each cell
    /// of the grid is one block (what sharding by any placements gives).
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

pub(crate) fn safetensors_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::F64 => safetensors::Dtype::F64,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::F16 => safetensors::Dtype::F16,
        DType::I64 => safetensors::Dtype::I64,
        DType::I32 => safetensors::Dtype::I32,
        DType::U8 => safetensors::Dtype::U8,
    }
}

fn bad(path: &Path, reason: String) -> Error {
    Error::Checkpoint { path: path.display().to_string(), reason }
}

impl CheckpointIndex {
    /// Reads and validates `dir/index.json` (opened under the rules of
    /// [`FileProblem`](super::FileProblem): a regular file of at most
    /// [`MAX_INDEX_BYTES`](super::MAX_INDEX_BYTES)).
    pub fn read(dir: &Path) -> Result<CheckpointIndex> {
        Self::read_in(&SafeDir::new(dir)?)
    }

    pub(crate) fn read_in(dir: &SafeDir) -> Result<CheckpointIndex> {
        let mut file = dir.open(INDEX_FILE)?;
        let text = file.read_all(MAX_INDEX_BYTES)?;
        let index: CheckpointIndex =
            serde_json::from_slice(&text).map_err(|e| bad(&file.path, format!("malformed index: {e}")))?;
        index.validate().map_err(|reason| bad(&file.path, reason))?;
        Ok(index)
    }

    /// Writes `dir/index.json` atomically through a securely created temporary file.
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(INDEX_FILE);
        let text = serde_json::to_vec_pretty(self).map_err(|e| bad(&path, format!("cannot encode: {e}")))?;
        write_atomic(&path, |f| f.write_all(&text))
    }

    /// The entry called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Consistency checks, so that a damaged or hostile index cannot send reads out of bounds
    /// or out of the checkpoint directory, nor make a loader allocate what no file backs.
    /// Linearithmic in the number of blocks.
    fn validate(&self) -> std::result::Result<(), String> {
        if self.format != FORMAT {
            return Err(format!("format `{}` is not `{FORMAT}`", self.format));
        }
        if self.version != VERSION {
            return Err(format!("version {} is not supported (expected {VERSION})", self.version));
        }
        let m = &self.mesh;
        let mesh_size = checked_numel("", &m.shape).map_err(|_| format!("mesh shape {:?} overflows", m.shape))?;
        if m.shape.is_empty()
            || m.shape.contains(&0)
            || mesh_size != m.ranks.len()
            || m.dim_names.len() != m.shape.len()
        {
            return Err(format!(
                "mesh of shape {:?} with {} names and {} ranks is not a mesh",
                m.shape,
                m.dim_names.len(),
                m.ranks.len()
            ));
        }
        let mut names = HashSet::with_capacity(self.tensors.len());
        for t in &self.tensors {
            let ctx = |m: String| format!("tensor `{}`: {m}", t.name);
            if !names.insert(t.name.as_str()) {
                return Err(ctx("appears twice".into()));
            }
            let elem = match DType::from_safetensors_name(&t.dtype) {
                Some(d) => d.size_of(),
                None => return Err(ctx(format!("dtype `{}` is not F32, F64, BF16 or F16", t.dtype))),
            };
            if t.placements.len() != m.shape.len() {
                return Err(ctx(format!("{} placements for a {}-d mesh", t.placements.len(), m.shape.len())));
            }
            for p in &t.placements {
                match p.parse::<Placement>().ok().map(|p| p.normalize(t.shape.len())) {
                    Some(Ok(_)) => {}
                    _ => return Err(ctx(format!("placement `{p}` is unknown or out of range"))),
                }
            }
            let numel = checked_numel("", &t.shape).map_err(|_| ctx(format!("shape {:?} overflows", t.shape)))?;
            if numel.checked_mul(elem).is_none_or(|b| b > isize::MAX as usize) {
                return Err(ctx(format!("shape {:?} has more bytes than memory can address", t.shape)));
            }
            check_blocks(&t.shape, numel, &t.shards).map_err(ctx)?;
        }
        Ok(())
    }
}

/// Checks that the blocks of a tensor of `shape` tile it exactly, as the saver writes them: a
/// grid, in which along each tensor dim the blocks' ranges partition the dim, and every cell
/// of the grid is one block. `O(n log n)` in the number of blocks `n`.
fn check_blocks(shape: &[usize], numel: usize, shards: &[ShardEntry]) -> std::result::Result<(), String> {
    let nd = shape.len();
    for s in shards {
        if !is_plain_name(&s.file) {
            return Err(format!("shard file name `{}` is not a plain file name", s.file));
        }
        if s.offset.len() != nd || s.shape.len() != nd {
            return Err(format!("shard in `{}` has the wrong rank", s.file));
        }
        if s.shape.contains(&0) {
            return Err(format!("shard in `{}` of shape {:?} is empty (empty blocks are not saved)", s.file, s.shape));
        }
        if (0..nd).any(|d| s.offset[d].checked_add(s.shape[d]).is_none_or(|e| e > shape[d])) {
            return Err(format!(
                "shard in `{}` at {:?} of shape {:?} lies outside {shape:?}",
                s.file, s.offset, s.shape
            ));
        }
    }
    if numel == 0 {
        return match shards.first() {
            Some(s) => Err(format!("the tensor has no elements but a block in `{}`", s.file)),
            None => Ok(()),
        };
    }
    // Per dim: the distinct ranges, sorted; they must partition [0, shape[d]).
    let mut ranges: Vec<Vec<(usize, usize, usize)>> = Vec::with_capacity(nd); // (start, end, a block)
    for (d, &size) in shape.iter().enumerate() {
        let mut r: Vec<(usize, usize, usize)> =
            shards.iter().enumerate().map(|(i, s)| (s.offset[d], s.offset[d] + s.shape[d], i)).collect();
        r.sort_unstable();
        r.dedup_by_key(|x| (x.0, x.1));
        let mut covered = 0;
        for w in 0..r.len() {
            let (start, end, i) = r[w];
            if start < covered {
                let j = r[w - 1].2;
                return Err(format!(
                    "shards in `{}` and `{}` overlap: ranges {}..{} and {start}..{end} of dim {d} (blocks form a grid)",
                    shards[j].file,
                    shards[i].file,
                    r[w - 1].0,
                    r[w - 1].1
                ));
            }
            if start > covered {
                return Err(format!("no shard covers {covered}..{start} of dim {d}"));
            }
            covered = end;
        }
        if covered != size {
            return Err(format!("no shard covers {covered}..{size} of dim {d}"));
        }
        ranges.push(r);
    }
    // Each block is one cell of the grid; every cell must be one block.
    let cells_wanted = ranges.iter().try_fold(1usize, |n, r| n.checked_mul(r.len()));
    let mut cells: Vec<(Vec<usize>, usize)> = shards
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let cell = (0..nd).map(|d| ranges[d].partition_point(|r| r.0 < s.offset[d])).collect();
            (cell, i)
        })
        .collect();
    cells.sort_unstable();
    if let Some(w) = cells.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!(
            "shards in `{}` and `{}` overlap: they hold the same block",
            shards[w[0].1].file, shards[w[1].1].file
        ));
    }
    if cells_wanted != Some(cells.len()) {
        return Err(format!(
            "the shards hold {} blocks of a grid of {} (some blocks are missing)",
            cells.len(),
            ranges.iter().map(|r| r.len().to_string()).collect::<Vec<_>>().join(" x ")
        ));
    }
    Ok(())
}
