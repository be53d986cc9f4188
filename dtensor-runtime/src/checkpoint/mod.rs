//! Sharded checkpoints in the safetensors format, loadable onto any mesh and placements.
//!
//! A checkpoint is a directory:
//! - `shard-RRRRR.safetensors`, one per global rank that owns data: that rank's block of every
//!   tensor of the state dict, under the tensor's name, with the block's global offset in the
//!   file's `__metadata__`. A block replicated over several ranks is written once, by one
//!   replica (the tensors of a state dict take turns among the replicas, so the writing is
//!   spread over them); ranks that write no block write no file.
//! - `index.json` ([`CheckpointIndex`]): global shape, dtype and placements of each tensor, the
//!   saving mesh (shape, dim names, ranks), and each block's file, offset and shape. It is
//!   written last, so a checkpoint without it is incomplete.
//!
//! [`load`] builds each rank's shard for the mesh and placements *you* ask for: for every
//! saved block that overlaps the shard it reads just the overlapping byte ranges (the
//! safetensors header locates the data; reads are seek + read of contiguous runs), so no rank
//! reads whole files it does not need and no communication happens.
//!
//! **Partial tensors are reduced before saving**: [`save`] redistributes every `Partial` mesh
//! dim to `Replicate` (an all-reduce), so the checkpoint holds logical values.
//!
//! **Training state**: a [`Checkpointer`] saves a model with its optimizer's state, loss
//! scaler, random generator and a user value ([`TrainState`]) into versioned directories of a
//! root, in the background, committing each atomically; [`Checkpointer::load`] (or
//! [`load_train_state`]) resumes it onto any mesh ([`Restore`]).
//!
//! [`save_full`] writes one plain safetensors file with full tensors (readable by any
//! safetensors reader); [`Checkpoint::export_full`] does the same offline from a sharded
//! checkpoint, without a mesh.
//!
//! **A checkpoint directory is untrusted input.** Files are opened only when they are regular
//! files inside the directory (FIFOs, devices, directories and symbolic links that leave it
//! are refused with [`Error::UnsafeFile`]), the index is capped at [`MAX_INDEX_BYTES`], every
//! size and offset it or a file header claims is checked (overflow included) against the
//! real file lengths before anything is allocated, and writes go through securely created
//! temporary files renamed into place (see [`FileProblem`] for the rules).
//!
//! ```
//! use dtensor_runtime::{run, distribute_tensor, Shard, checkpoint};
//! let dir = tempfile::tempdir().unwrap();
//! let g = ndarray::ArrayD::from_shape_fn(vec![5, 3], |ix| (ix[0] * 3 + ix[1]) as f32);
//! run(2, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
//!     let w = distribute_tensor(&g, &mesh, &[Shard(0)], None)?;
//!     checkpoint::save(dir.path(), &[("w".to_string(), w)])
//! }).unwrap();
//! // Load on 3 ranks, sharded the other way.
//! let locals = run(3, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[3], &["tp"])?;
//!     let sd = checkpoint::load::<f32>(dir.path(), &mesh, &[("w", &[Shard(1)][..])])?;
//!     sd[0].1.to_host()
//! }).unwrap();
//! assert_eq!(locals[2], g.slice(ndarray::s![.., 2..3]).into_dyn());
//! ```

mod checkpointer;
mod convert;
pub mod hf;
mod index;
pub(crate) mod safe_file;
mod shard_file;
mod snapshot;
mod train_state;

pub use crate::error::{FileKind, FileProblem};
pub use checkpointer::{latest_version, Checkpointer, SaveTimes, DEFAULT_SAVE_TIMEOUT, LATEST_FILE};
pub use index::{CheckpointIndex, MeshInfo, ShardEntry, TensorEntry, FORMAT, INDEX_FILE, VERSION};
pub use safe_file::MAX_INDEX_BYTES;
pub use train_state::{
    load_train_state, model_tensor_name, optim_tensor_name, read_meta, Restore, Restored, SavedOptimizer,
    SavedParamState, TrainState, TrainStateMeta, STATE_FILE, STATE_FORMAT, STATE_VERSION,
};

use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::mesh::DeviceMesh;
use crate::placement::{normalize_placements, without_partials, Placement};
use crate::storage::Storage;
use crate::Along;
use index::safetensors_dtype;
use ndarray::{ArrayD, IxDyn};
use safe_file::SafeDir;
use shard_file::{pt_metadata, read_intersection, write_file, RawTensor, SavedBlock, ShardFile};
use snapshot::Snapshot;
use std::collections::HashMap;
use std::path::Path;

/// File name of global rank `rank`'s shard file.
pub fn shard_file_name(rank: usize) -> String {
    format!("shard-{rank:05}.safetensors")
}

fn invalid(context: &str, reason: String) -> Error {
    Error::InvalidArgument { context: context.into(), reason }
}

/// Checks names and that every tensor lives on one mesh; returns that mesh.
pub(crate) fn common_mesh<'a, T: Scalar>(context: &str, state: &'a [(String, DTensor<T>)]) -> Result<&'a DeviceMesh> {
    let (_, first) = state.first().ok_or_else(|| invalid(context, "the state dict is empty".into()))?;
    for (i, (name, t)) in state.iter().enumerate() {
        if name.is_empty() || name == "__metadata__" {
            return Err(invalid(context, format!("`{name}` cannot be a tensor name")));
        }
        if state[..i].iter().any(|(n, _)| n == name) {
            return Err(invalid(context, format!("tensor name `{name}` appears twice")));
        }
        if !t.device_mesh().same_as(first.device_mesh()) {
            return Err(Error::MeshMismatch {
                context: format!("{context}: tensor `{name}`"),
                left: first.device_mesh().to_string(),
                right: t.device_mesh().to_string(),
            });
        }
    }
    Ok(first.device_mesh())
}

/// `t` with every Partial mesh dim reduced to Replicate (no-op without Partials).
fn replicate_partials<T: Scalar>(t: &DTensor<T>) -> Result<DTensor<T>> {
    if !t.placements().iter().any(|p| p.is_partial()) {
        return Ok(t.clone());
    }
    t.redistribute(&without_partials(t.placements()))
}

/// Saves a state dict as a sharded checkpoint in `dir` (created if needed).
///
/// Collective: every rank of the mesh calls it with the same names in the same order. Each
/// rank writes its own blocks; the first rank of the mesh writes `index.json` once every rank
/// has written, and every rank returns only after that. Partial tensors are reduced first
/// (see the module docs). An existing checkpoint in `dir` is replaced.
pub fn save<T: Scalar>(dir: impl AsRef<Path>, state: &[(String, DTensor<T>)]) -> Result<()> {
    let dir = dir.as_ref();
    let mesh = common_mesh("checkpoint::save", state)?;
    let leader = mesh.ranks()[0] == mesh.rank();
    let reduced: Vec<DTensor<T>> = state.iter().map(|(_, t)| replicate_partials(t)).collect::<Result<_>>()?;
    let dir_err = |e: std::io::Error| Error::Checkpoint { path: dir.display().to_string(), reason: e.to_string() };
    std::fs::create_dir_all(dir).map_err(dir_err)?;
    if leader {
        // An index left from an earlier save must not describe the files being rewritten.
        match std::fs::remove_file(dir.join(INDEX_FILE)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(dir_err(e)),
        }
    }
    let mut snap = Snapshot::new(mesh);
    for ((name, _), t) in state.iter().zip(&reduced) {
        snap.add(name, t.local(), mesh, t.placements(), t.shape())?;
    }
    snap.write_mine(dir, false)?;
    mesh.barrier(Along::All)?;
    if leader {
        snap.index().write(dir)?;
    }
    mesh.barrier(Along::All)
}

/// Loads the named tensors of the checkpoint in `dir` onto `mesh` with the given placements
/// (any mesh, any placements but Partial), reading only the byte ranges this rank's shards
/// need. No communication: each rank loads on its own. See [`Checkpoint::load`].
pub fn load<T: Scalar>(
    dir: impl AsRef<Path>,
    mesh: &DeviceMesh,
    wanted: &[(&str, &[Placement])],
) -> Result<Vec<(String, DTensor<T>)>> {
    Checkpoint::open(dir)?.load(mesh, wanted)
}

/// Writes the full tensors of a state dict to one safetensors file at `path`, readable by
/// any safetensors reader (tensor names as given, dtype F32/F64/BF16/F16, row-major).
///
/// Collective: every rank gathers each full tensor ([`DTensor::full_tensor`]); the first rank
/// of the mesh writes the file, and every rank returns after it exists.
pub fn save_full<T: Scalar>(path: impl AsRef<Path>, state: &[(String, DTensor<T>)]) -> Result<()> {
    let path = path.as_ref();
    let mesh = common_mesh("checkpoint::save_full", state)?;
    let full: Vec<(String, RawTensor)> =
        state.iter().map(|(n, t)| Ok((n.clone(), RawTensor::of(&t.full_tensor()?)))).collect::<Result<_>>()?;
    if mesh.ranks()[0] == mesh.rank() {
        write_file(path, &full, pt_metadata())?;
    }
    mesh.barrier(Along::All)
}

/// An opened checkpoint directory: its index, plus the shard files opened so far.
pub struct Checkpoint {
    dir: SafeDir,
    index: CheckpointIndex,
    /// Position of each tensor in `index.tensors`.
    by_name: HashMap<String, usize>,
    files: HashMap<String, ShardFile>,
}

impl Checkpoint {
    /// Reads and checks `dir/index.json`; opens no shard file yet.
    pub fn open(dir: impl AsRef<Path>) -> Result<Checkpoint> {
        let dir = SafeDir::new(dir.as_ref())?;
        let index = CheckpointIndex::read_in(&dir)?;
        let by_name = index.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Checkpoint { dir, index, by_name, files: HashMap::new() })
    }

    /// The index.
    pub fn index(&self) -> &CheckpointIndex {
        &self.index
    }

    /// Tensor payload bytes read from shard files so far (headers excluded).
    pub fn payload_bytes_read(&self) -> u64 {
        self.files.values().map(|f| f.payload_read).sum()
    }

    /// Names of the shard files opened so far, sorted.
    pub fn files_opened(&self) -> Vec<String> {
        let mut v: Vec<String> = self.files.keys().cloned().collect();
        v.sort();
        v
    }

    /// Position of tensor `name` in the index, after checking it holds `T`.
    fn entry<T: Scalar>(&self, name: &str) -> Result<usize> {
        let path = self.dir.shown(INDEX_FILE).display().to_string();
        let &i = self.by_name.get(name).ok_or_else(|| Error::Checkpoint {
            path: path.clone(),
            reason: format!(
                "no tensor `{name}`; the checkpoint holds {:?}",
                self.index.tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>()
            ),
        })?;
        let e = &self.index.tensors[i];
        if e.dtype != T::DTYPE.safetensors_name() {
            return Err(Error::Checkpoint {
                path,
                reason: format!("tensor `{name}` is {} but was requested as {}", e.dtype, T::DTYPE.safetensors_name()),
            });
        }
        Ok(i)
    }

    /// Fills the block (`offset`, `shape`) of tensor `name` from the saved blocks.
    ///
    /// Every file the block reads is opened and its header checked against its length (and
    /// the tensor's shape against the index) before the block's buffer is allocated, so a
    /// hostile index cannot make the loader allocate what no file on disk backs.
    fn read_block<T: Scalar>(&mut self, name: &str, offset: &[usize], shape: &[usize]) -> Result<ArrayD<T>> {
        let entry = &self.index.tensors[self.entry::<T>(name)?];
        let numel = crate::shape::checked_numel("checkpoint block", shape)?;
        let mut sources: Vec<(usize, u64)> = Vec::new(); // (block of `entry.shards`, data start)
        for (k, s) in entry.shards.iter().enumerate() {
            let overlaps =
                (0..shape.len()).all(|d| s.offset[d] < offset[d] + shape[d] && offset[d] < s.offset[d] + s.shape[d]);
            if !overlaps {
                continue;
            }
            let file = match self.files.entry(s.file.clone()) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => v.insert(ShardFile::open(&self.dir, &s.file)?),
            };
            sources.push((k, file.locate::<T>(name, &s.shape)?));
        }
        let mut data = crate::alloc::try_zeroed::<T>(&format!("checkpoint: loading `{name}`"), numel)?;
        let mut copied = 0;
        for (k, data_at) in sources {
            let s = &entry.shards[k];
            let file = self.files.get_mut(&s.file).expect("opened above");
            let block = SavedBlock { offset: &s.offset, shape: &s.shape, data_at, dtype: safetensors_dtype(T::DTYPE) };
            copied += read_intersection(file, &block, offset, shape, &mut data)?;
        }
        // The index was checked to tile the tensor; keep the check cheap and typed anyway.
        if copied != data.len() {
            return Err(Error::Checkpoint {
                path: self.dir.shown(INDEX_FILE).display().to_string(),
                reason: format!("saved blocks of `{name}` cover {copied} of the {} elements needed", data.len()),
            });
        }
        Ok(ArrayD::from_shape_vec(IxDyn(shape), data).expect("block data has the block's size"))
    }

    /// Loads the named tensors onto `mesh` with the given placements: each rank reads only
    /// the byte ranges of its own shard. `Partial` placements are rejected.
    pub fn load<T: Scalar>(
        &mut self,
        mesh: &DeviceMesh,
        wanted: &[(&str, &[Placement])],
    ) -> Result<Vec<(String, DTensor<T>)>> {
        let mut out = Vec::with_capacity(wanted.len());
        for &(name, placements) in wanted {
            let entry = &self.index.tensors[self.entry::<T>(name)?];
            let global = entry.shape.clone();
            let placements = normalize_placements(placements, global.len(), mesh.ndim())?;
            if let Some(p) = placements.iter().find(|p| p.is_partial()) {
                return Err(Error::PartialNotAllowed { placement: *p, context: "checkpoint::load".into() });
            }
            let (shape, offset) = local_shape_and_offset(&global, mesh.shape(), mesh.coordinate(), &placements);
            let local = Storage::from_host(self.read_block::<T>(name, &offset, &shape)?, mesh.target())?;
            out.push((name.to_string(), DTensor::new_unchecked(local, mesh.clone(), placements, global, None)));
        }
        Ok(out)
    }

    /// The full tensor `name`, assembled from every block (no mesh needed).
    pub fn read_full<T: Scalar>(&mut self, name: &str) -> Result<ArrayD<T>> {
        let shape = self.index.tensors[self.entry::<T>(name)?].shape.clone();
        self.read_block(name, &vec![0; shape.len()], &shape)
    }

    /// Writes every tensor of the checkpoint, full, to one safetensors file at `path` (offline
    /// consolidation; every tensor must have dtype `T`).
    pub fn export_full<T: Scalar>(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let names: Vec<String> = self.index.tensors.iter().map(|t| t.name.clone()).collect();
        let full: Vec<(String, RawTensor)> = names
            .into_iter()
            .map(|n| Ok((n.clone(), RawTensor::of(&self.read_full::<T>(&n)?))))
            .collect::<Result<_>>()?;
        write_file(path.as_ref(), &full, pt_metadata())
    }
}
