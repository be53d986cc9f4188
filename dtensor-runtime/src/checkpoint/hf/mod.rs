//! Hugging Face checkpoints: a single `model.safetensors`, or a sharded one
//! (`model-00001-of-00002.safetensors`, ... listed by `model.safetensors.index.json`), loaded
//! onto a mesh by a [`LoadPlan`] and saved back in the same format.
//!
//! **Loading** ([`HfCheckpoint`]) reads on each rank only the byte ranges of its own shards:
//! the files' headers, then for every tensor the runs of the rank's block (positioned reads;
//! a `Shard(0)` block is one read, a `Shard(1)` block one read per row). No rank reads a
//! whole file it does not need, and no communication happens. Weights stored as `BF16`,
//! `F16`, `F32` or `F64` are converted on load to the element type asked for, through a
//! bounded scratch buffer.
//!
//! **A checkpoint is untrusted input**, read under the same rules as this crate's own
//! checkpoints (see [`FileProblem`](super::FileProblem)): only regular files inside the
//! directory are opened (no FIFO, device, directory, nor symbolic link leading out of it),
//! every file the index names must be a plain file name, the index is capped at
//! [`MAX_INDEX_BYTES`](super::MAX_INDEX_BYTES) and a header at 100 MB, every byte range a
//! header claims is checked (overflow included, overlaps in `O(n log n)`) against the file's
//! length before anything is read, shapes go through [`checked_numel`], and buffers are
//! allocated fallibly. A bad file is an [`Error::Checkpoint`] (or [`Error::UnsafeFile`],
//! [`Error::ShapeOverflow`]) naming the file and the tensor.
//!
//! **Saving** ([`save`], [`save_sharded`]) gathers full tensors and writes them, `F32` or `F64`
//! with `{"format": "pt"}` metadata, through securely created temporary files renamed into
//! place, so the Python `safetensors` and `transformers` packages read the result.
//!
//! ```
//! use dtensor_runtime::checkpoint::hf::{self, HfCheckpoint, LoadPlan};
//! use dtensor_runtime::module::{ColwiseParallel, RowwiseParallel};
//! use dtensor_runtime::{distribute_tensor, run, Replicate, Shard};
//! let dir = tempfile::tempdir().unwrap();
//! let up = ndarray::ArrayD::from_shape_fn(vec![6, 4], |ix| (ix[0] * 4 + ix[1]) as f32);
//! let down = ndarray::ArrayD::from_shape_fn(vec![4, 6], |ix| (ix[0] * 6 + ix[1]) as f32);
//! // Write a checkpoint from one rank (any mesh works).
//! run(1, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[1], &["x"])?;
//!     let sd = vec![
//!         ("mlp.up_proj.weight".to_string(), distribute_tensor(&up, &mesh, &[Replicate], None)?),
//!         ("mlp.down_proj.weight".to_string(), distribute_tensor(&down, &mesh, &[Replicate], None)?),
//!     ];
//!     hf::save_sharded(dir.path(), &sd, 100) // 96 bytes per tensor: two files and an index
//! }).unwrap();
//! // Load it tensor-parallel on a 2 x 2 mesh.
//! let shapes = run(4, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
//!     let plan = LoadPlan::new()
//!         .style("mlp.up_proj", ColwiseParallel::new())
//!         .style("mlp.down_proj", RowwiseParallel::new());
//!     let sd = HfCheckpoint::open(dir.path())?.load::<f64>(&mesh, &plan)?;
//!     assert_eq!(sd[1].0, "mlp.up_proj.weight"); // sorted by name
//!     assert_eq!(sd[1].1.placements(), &[Replicate, Shard(0)]);
//!     Ok(sd.iter().map(|(_, t)| t.to_local().shape().to_vec()).collect::<Vec<_>>())
//! }).unwrap();
//! assert_eq!(shapes[3], vec![vec![4, 3], vec![3, 4]]);
//! ```

mod index;
mod llama;
mod plan;
mod save;
mod tensor_map;

pub use index::{HfIndex, INDEX_FILE, SINGLE_FILE};
pub use llama::{KvHeads, LlamaConfig, RopeScaling, CONFIG_FILE};
pub use plan::LoadPlan;
pub use save::{export_train_state, save, save_sharded, shard_file_name};
pub use tensor_map::{Split, TensorMap};

use super::convert::loadable_size;
use super::safe_file::SafeDir;
use super::shard_file::{read_intersection, SavedBlock, ShardFile};
use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::mesh::DeviceMesh;
use crate::module::Module;
use crate::placement::{normalize_placements, Placement};
use crate::shape::checked_numel;
use crate::storage::Storage;
use ndarray::{ArrayD, IxDyn};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

/// One tensor of a checkpoint, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// File holding it.
    pub file: String,
    /// safetensors dtype name (`BF16`, `F32`, ...).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
}

/// An opened Hugging Face checkpoint: the tensor → file map, and the files opened so far
/// (each a checked header; data is read on demand).
pub struct HfCheckpoint {
    dir: SafeDir,
    /// The file listing the tensors (the index, or the single file), for messages.
    listing: PathBuf,
    weight_map: BTreeMap<String, String>,
    files: HashMap<String, ShardFile>,
}

/// Adds the tensor a file was opened or read for to a checkpoint error.
fn for_tensor(e: Error, name: &str) -> Error {
    match e {
        Error::Checkpoint { path, reason } => Error::Checkpoint { path, reason: format!("{reason} (tensor `{name}`)") },
        other => other,
    }
}

impl HfCheckpoint {
    /// Opens a checkpoint: a directory (holding `model.safetensors`, else
    /// `model.safetensors.index.json`: the order `transformers` looks in), a `.safetensors`
    /// file, or an index file. Reads the index, or the single file's header; nothing else.
    pub fn open(path: impl AsRef<Path>) -> Result<HfCheckpoint> {
        Self::open_in(path.as_ref(), None)
    }

    /// [`HfCheckpoint::open`], letting the checkpoint's symbolic links resolve anywhere inside
    /// `root` (which must contain the checkpoint's directory) instead of only inside that
    /// directory: a Hugging Face hub cache keeps `snapshots/<revision>/model.safetensors` as a
    /// link to `../../blobs/<hash>`, so `root` is its `models--<org>--<name>` folder.
    pub fn open_with_link_root(path: impl AsRef<Path>, root: impl AsRef<Path>) -> Result<HfCheckpoint> {
        Self::open_in(path.as_ref(), Some(root.as_ref()))
    }

    fn open_in(path: &Path, link_root: Option<&Path>) -> Result<HfCheckpoint> {
        let (dir, name) = if path.is_dir() {
            let single = std::fs::symlink_metadata(path.join(SINGLE_FILE)).is_ok();
            (path.to_path_buf(), if single { SINGLE_FILE } else { INDEX_FILE }.to_string())
        } else {
            let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| Error::Checkpoint {
                path: path.display().to_string(),
                reason: "not a checkpoint file name".into(),
            })?;
            (dir.to_path_buf(), name.to_string())
        };
        let mut dir = SafeDir::new(&dir)?;
        if let Some(root) = link_root {
            dir = dir.with_link_root(root)?;
        }
        let listing = dir.shown(&name);
        let mut files = HashMap::new();
        let weight_map = if name.ends_with(".json") {
            index::HfIndex::read_in(&dir, &name)?.weight_map
        } else {
            let file = ShardFile::open(&dir, &name)?;
            let map = file.names().into_iter().map(|n| (n, name.clone())).collect();
            files.insert(name, file);
            map
        };
        Ok(HfCheckpoint { dir, listing, weight_map, files })
    }

    /// Tensor name → file, sorted (for the typed layer's module loader).
    pub(crate) fn weight_map(&self) -> &BTreeMap<String, String> {
        &self.weight_map
    }

    /// Names of every tensor, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.weight_map.keys().map(String::as_str).collect()
    }

    /// The file listing the tensors (the index, or the single file).
    pub fn listing(&self) -> &Path {
        &self.listing
    }

    /// Tensor payload bytes read so far (headers excluded).
    pub fn payload_bytes_read(&self) -> u64 {
        self.files.values().map(|f| f.payload_read).sum()
    }

    /// Header bytes read so far (each opened file's length prefix and JSON header).
    pub fn header_bytes_read(&self) -> u64 {
        self.files.values().map(|f| f.header_read).sum()
    }

    /// Names of the files opened so far, sorted.
    pub fn files_opened(&self) -> Vec<String> {
        let mut v: Vec<String> = self.files.keys().cloned().collect();
        v.sort();
        v
    }

    /// The opened file holding `name` (opened and its header checked on first use).
    fn file_of(&mut self, name: &str) -> Result<&mut ShardFile> {
        let Some(file) = self.weight_map.get(name) else {
            let some: Vec<&str> = self.weight_map.keys().take(8).map(String::as_str).collect();
            return Err(Error::Checkpoint {
                path: self.listing.display().to_string(),
                reason: format!("no tensor `{name}`; it holds {} tensors, e.g. {some:?}", self.weight_map.len()),
            });
        };
        Ok(match self.files.entry(file.clone()) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(ShardFile::open(&self.dir, file).map_err(|e| for_tensor(e, name))?)
            }
        })
    }

    /// Where and how tensor `name` is stored, after checking its dtype is loadable and its
    /// shape within [`checked_numel`]'s bound.
    pub(crate) fn source(&mut self, name: &str) -> Result<(safetensors::Dtype, Vec<usize>, u64)> {
        let file = self.file_of(name)?;
        let (dtype, shape, at) = file.tensor(name)?;
        let path = file.path().display().to_string();
        if loadable_size(dtype).is_none() {
            return Err(Error::Checkpoint {
                path,
                reason: format!(
                    "tensor `{name}` is {dtype:?}, which cannot be loaded as a float (BF16, F16, F32, F64)"
                ),
            });
        }
        checked_numel(&format!("checkpoint file `{path}`, tensor `{name}`"), shape)?;
        Ok((dtype, shape.to_vec(), at))
    }

    /// How tensor `name` is stored.
    pub fn info(&mut self, name: &str) -> Result<TensorInfo> {
        let file = self.weight_map.get(name).cloned();
        let f = self.file_of(name)?;
        let (dtype, shape, _) = f.tensor(name)?;
        Ok(TensorInfo { file: file.unwrap_or_default(), dtype: format!("{dtype:?}"), shape: shape.to_vec() })
    }

    /// The block (`offset`, `shape`) of tensor `name` as `T`, reading only its byte ranges.
    pub(crate) fn read_block<T: Scalar>(&mut self, name: &str, offset: &[usize], shape: &[usize]) -> Result<ArrayD<T>> {
        let (dtype, full, data_at) = self.source(name)?;
        let numel = checked_numel("checkpoint block", shape)?;
        let mut data = crate::alloc::try_zeroed::<T>(&format!("checkpoint: loading `{name}`"), numel)?;
        let zeros = vec![0; full.len()];
        let block = SavedBlock { offset: &zeros, shape: &full, data_at, dtype };
        let file = self.file_of(name)?;
        read_intersection(file, &block, offset, shape, &mut data).map_err(|e| for_tensor(e, name))?;
        Ok(ArrayD::from_shape_vec(IxDyn(shape), data).expect("block data has the block's size"))
    }

    /// The full tensor `name` as `T` (no mesh needed).
    pub fn read_full<T: Scalar>(&mut self, name: &str) -> Result<ArrayD<T>> {
        let (_, full, _) = self.source(name)?;
        self.read_block(name, &vec![0; full.len()], &full)
    }

    /// Loads tensor `name` onto `mesh` with `placements` (no `Partial`), as `T`: this rank
    /// reads only its shard's byte ranges.
    pub fn load_tensor<T: Scalar>(
        &mut self,
        name: &str,
        mesh: &DeviceMesh,
        placements: &[Placement],
    ) -> Result<DTensor<T>> {
        let (_, global, _) = self.source(name)?;
        let origin = vec![0; global.len()];
        self.load_region(name, global, &origin, mesh, placements)
    }

    /// The region of tensor `name` that starts at `origin` and has shape `global`, laid out on
    /// `mesh` with `placements` (no `Partial`) as if it were a tensor of its own: this rank
    /// reads only its shard of it. The whole tensor for [`load_tensor`](Self::load_tensor);
    /// one part of a fused tensor for the typed module loader's splits.
    pub(crate) fn load_region<T: Scalar>(
        &mut self,
        name: &str,
        global: Vec<usize>,
        origin: &[usize],
        mesh: &DeviceMesh,
        placements: &[Placement],
    ) -> Result<DTensor<T>> {
        let placements = normalize_placements(placements, global.len(), mesh.ndim()).map_err(|e| {
            Error::InvalidArgument { context: format!("loading `{name}` of shape {global:?}"), reason: e.to_string() }
        })?;
        if let Some(p) = placements.iter().find(|p| p.is_partial()) {
            return Err(Error::PartialNotAllowed { placement: *p, context: format!("loading `{name}`") });
        }
        let (shape, mut offset) = local_shape_and_offset(&global, mesh.shape(), mesh.coordinate(), &placements);
        for (o, base) in offset.iter_mut().zip(origin) {
            *o += base;
        }
        let local = Storage::from_host(self.read_block::<T>(name, &offset, &shape)?, mesh.target())?;
        Ok(DTensor::new_unchecked(local, mesh.clone(), placements, global, None))
    }

    /// Loads every tensor onto `mesh` with the placements `plan` gives, as `T`; sorted by name.
    pub fn load<T: Scalar>(&mut self, mesh: &DeviceMesh, plan: &LoadPlan) -> Result<Vec<(String, DTensor<T>)>> {
        let names: Vec<String> = self.weight_map.keys().cloned().collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let placements = plan.resolve(&refs, mesh, &self.listing.display().to_string())?;
        names
            .into_iter()
            .zip(placements)
            .map(|(n, p)| {
                let t = self.load_tensor(&n, mesh, &p)?;
                Ok((n, t))
            })
            .collect()
    }

    /// Replaces every parameter of `module` by the checkpoint's tensor `prefix` + its path
    /// (e.g. prefix `model.` for `layers.0.mlp.up_proj.weight`), loaded onto `mesh` with the
    /// placements `plan` gives (patterns match checkpoint names), keeping `requires_grad`.
    ///
    /// Strict, as PyTorch's `load_state_dict`: a parameter without a tensor, a tensor under
    /// `prefix` without a parameter, or a shape that differs is an error, raised before any
    /// parameter is replaced.
    pub fn load_into<T: crate::element::Element, M: Module<T>>(
        &mut self,
        module: &mut M,
        prefix: &str,
        mesh: &DeviceMesh,
        plan: &LoadPlan,
    ) -> Result<()> {
        let declared = crate::module::DeclaredLayouts::of(&*module);
        let mut params = module.named_parameters_mut();
        let names: Vec<String> = params.iter().map(|(n, _)| format!("{prefix}{n}")).collect();
        let wanted: HashSet<&str> = names.iter().map(String::as_str).collect();
        let paths: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
        let missing: Vec<&str> =
            names.iter().map(String::as_str).filter(|n| !self.weight_map.contains_key(*n)).collect();
        if !missing.is_empty() {
            return Err(Error::Checkpoint {
                path: self.listing.display().to_string(),
                reason: format!(
                    "no tensor for {} of the module's {} parameters with prefix `{prefix}`: {:?}{}",
                    missing.len(),
                    names.len(),
                    &missing[..missing.len().min(8)],
                    prefix_hint(&self.names(), &paths, prefix)
                ),
            });
        }
        let unexpected: Vec<&str> =
            self.names().into_iter().filter(|n| n.starts_with(prefix) && !wanted.contains(n)).collect();
        if !unexpected.is_empty() {
            return Err(Error::Checkpoint {
                path: self.listing.display().to_string(),
                reason: format!(
                    "tensors {:?} match no parameter of the module{}",
                    &unexpected[..unexpected.len().min(8)],
                    if unexpected.len() > 8 { format!(" ({} in all)", unexpected.len()) } else { String::new() }
                ),
            });
        }
        for ((path, p), name) in params.iter().zip(&names) {
            let (_, shape, _) = self.source(name)?;
            if shape != p.shape() {
                let file = self.file_of(name)?.path().display().to_string();
                return Err(Error::Checkpoint {
                    path: file,
                    reason: format!(
                        "tensor `{name}` has shape {shape:?} but the module's parameter `{path}` has {:?}",
                        p.shape()
                    ),
                });
            }
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let placements = plan.resolve(&refs, mesh, &self.listing.display().to_string())?;
        // A module whose type declares its layouts (a `#[distribute]` struct) keeps them: a
        // plan that disagrees is refused before any parameter is replaced.
        for ((path, p), pl) in params.iter().zip(&placements) {
            let got = normalize_placements(pl, p.ndim(), mesh.ndim()).unwrap_or_else(|_| pl.clone());
            declared.check(path, &got, "load_into with this plan would make it")?;
        }
        for (((_, p), name), pl) in params.iter_mut().zip(&names).zip(placements) {
            let rg = p.requires_grad();
            **p = self.load_tensor::<T>(name, mesh, &pl)?.requires_grad_(rg);
        }
        Ok(())
    }
}

/// A hint naming the prefix under which the checkpoint holds *every* parameter path, when
/// `prefix` is not it (a wrong prefix otherwise only lists names): the candidates are the
/// leading parts of the checkpoint names that end with the first path, at a dot.
pub(crate) fn prefix_hint(checkpoint: &[&str], paths: &[&str], prefix: &str) -> String {
    let Some(first) = paths.first() else { return String::new() };
    let have: HashSet<&str> = checkpoint.iter().copied().collect();
    let mut seen = HashSet::new();
    for name in checkpoint {
        let Some(lead) = name.strip_suffix(first) else { continue };
        if !(lead.is_empty() || lead.ends_with('.')) || lead == prefix || !seen.insert(lead) {
            continue;
        }
        if paths.iter().all(|p| have.contains(format!("{lead}{p}").as_str())) {
            return format!("; with prefix `{lead}` every parameter has a tensor");
        }
    }
    String::new()
}
