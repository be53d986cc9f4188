//! `model.safetensors.index.json`: which file of a sharded Hugging Face checkpoint holds each
//! tensor (the `weight_map`), as `transformers` writes and reads it.

use crate::checkpoint::safe_file::{is_plain_name, write_atomic, SafeDir, MAX_INDEX_BYTES};
use crate::error::FileProblem;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// File name of a single-file Hugging Face checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// File name of the index of a sharded Hugging Face checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The index of a sharded Hugging Face checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HfIndex {
    /// Free-form; `transformers` writes `{"total_size": <payload bytes>}`.
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Tensor name → file name (inside the checkpoint directory).
    pub weight_map: BTreeMap<String, String>,
}

impl HfIndex {
    /// Reads and checks the index file `name` of `dir` (opened under the rules of
    /// [`FileProblem`], at most [`MAX_INDEX_BYTES`]): every file it names must be a plain file
    /// name in the directory, every tensor name a possible safetensors name.
    pub(crate) fn read_in(dir: &SafeDir, name: &str) -> Result<HfIndex> {
        let mut file = dir.open(name)?;
        let text = file.read_all(MAX_INDEX_BYTES)?;
        let bad = |reason: String| Error::Checkpoint { path: file.path.display().to_string(), reason };
        let index: HfIndex =
            serde_json::from_slice(&text).map_err(|e| bad(format!("malformed Hugging Face index: {e}")))?;
        for (tensor, f) in &index.weight_map {
            if tensor.is_empty() || tensor == "__metadata__" {
                return Err(bad(format!("`{tensor}` cannot be a tensor name")));
            }
            if !is_plain_name(f) {
                return Err(Error::UnsafeFile {
                    path: dir.shown(f).display().to_string(),
                    problem: FileProblem::NotPlainName,
                });
            }
        }
        Ok(index)
    }

    /// Writes the index to `path` atomically through a securely created temporary file.
    pub(crate) fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(|e| Error::Checkpoint {
            path: path.display().to_string(),
            reason: format!("cannot encode: {e}"),
        })?;
        write_atomic(path, |f| f.write_all(&text))
    }
}
