//! The whole training state as one checkpoint (PyTorch DCP's model + optimizer state dict):
//! the model's parameters and buffers, the optimizer's state tensors laid out as their
//! parameters, and as JSON (`train_state.json`) the optimizer's kind, hyperparameters and step
//! counts, the [`GradScaler`]'s state, the random generator's position and a user value.
//!
//! Tensors are named `model.<name>` (parameters and buffers, the module's names) and
//! `optim.<parameter>.<slot>` (`exp_avg`, `exp_avg_sq`, `momentum_buffer`, `master`), and saved
//! in the sharded format of [`save`](super::save): every rank writes its own blocks. Loading
//! ([`load_train_state`]) places every tensor as the *loading* model's parameter is placed
//! (another mesh, other placements), each rank reading only the byte ranges of its shards.

use super::index::INDEX_FILE;
use super::safe_file::{SafeDir, MAX_INDEX_BYTES};
use super::snapshot::Snapshot;
use super::Checkpoint;
use crate::dtensor::DTensor;
use crate::element::{Element, Scalar};
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::module::Module;
use crate::optim::{
    GradScaler, GradScalerState, OptimizerConfig, OptimizerState, OptimizerStateDict, ParamState, StateTensor,
};
use crate::placement::without_partials;
use crate::storage::Storage;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File name of the training state's JSON part inside a checkpoint directory. It is written
/// after every shard file and the index, so a directory without it is not a training state
/// (or one whose save has not finished).
pub const STATE_FILE: &str = "train_state.json";
/// Value of [`TrainStateMeta::format`].
pub const STATE_FORMAT: &str = "dtensor-rs/train-state";
/// Value of [`TrainStateMeta::version`].
pub const STATE_VERSION: u32 = 1;

/// Slot kinds in [`SavedParamState::slots`]: in the parameter's type, or f32.
const ELEM: &str = "elem";
const F32: &str = "f32";

/// The JSON part of a training state (`train_state.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainStateMeta {
    /// Always [`STATE_FORMAT`].
    pub format: String,
    /// Always [`STATE_VERSION`].
    pub version: u32,
    /// The training step the state was saved at.
    pub step: u64,
    /// safetensors dtype name of the model's parameters.
    pub dtype: String,
    /// The model's parameter names, in `named_parameters` order.
    pub parameters: Vec<String>,
    /// The model's buffer names.
    pub buffers: Vec<String>,
    /// The optimizer's state, if one was saved.
    pub optimizer: Option<SavedOptimizer>,
    /// The loss scaler's state, if one was saved.
    pub scaler: Option<GradScalerState>,
    /// The random generator's `(seed, offset)` on the first rank, if saved.
    pub rng: Option<(u64, u64)>,
    /// The user's value (epoch, data position, ...).
    pub extra: Option<serde_json::Value>,
}

/// An optimizer's saved configuration and, per parameter, its step count and slots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedOptimizer {
    /// Kind, hyperparameters, master weights.
    pub config: OptimizerConfig,
    /// Per parameter name.
    pub params: BTreeMap<String, SavedParamState>,
}

/// One parameter's saved optimizer state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedParamState {
    /// Steps taken.
    pub step: usize,
    /// Slot name → `"elem"` (the parameter's type) or `"f32"`.
    pub slots: BTreeMap<String, String>,
}

/// Name of a model tensor in the checkpoint.
pub fn model_tensor_name(name: &str) -> String {
    format!("model.{name}")
}

/// Name of an optimizer state tensor in the checkpoint.
pub fn optim_tensor_name(param: &str, slot: &str) -> String {
    format!("optim.{param}.{slot}")
}

/// What to save: a model and, optionally, its optimizer, loss scaler, the random generator's
/// position (on by default) and a user value.
pub struct TrainState<'a, T: Element> {
    step: u64,
    params: Vec<(String, &'a DTensor<T>)>,
    buffers: Vec<(String, &'a DTensor<T>)>,
    optimizer: Option<&'a dyn OptimizerState<T>>,
    scaler: Option<&'a GradScaler>,
    rng: bool,
    extra: Option<serde_json::Value>,
}

impl<'a, T: Element> TrainState<'a, T> {
    /// The state of `model` after `step` training steps.
    pub fn new<M: Module<T> + ?Sized>(model: &'a M, step: u64) -> Self {
        TrainState {
            step,
            params: model.named_parameters(),
            buffers: model.named_buffers(),
            optimizer: None,
            scaler: None,
            rng: true,
            extra: None,
        }
    }
    /// Saves the optimizer's state too.
    pub fn optimizer(mut self, optimizer: &'a dyn OptimizerState<T>) -> Self {
        self.optimizer = Some(optimizer);
        self
    }
    /// Saves the loss scaler's state too.
    pub fn scaler(mut self, scaler: &'a GradScaler) -> Self {
        self.scaler = Some(scaler);
        self
    }
    /// Saves a user value (anything `serde` serializes: epoch, position in the data, ...),
    /// read back with [`Restored::extra_as`]. The first rank's value is saved and every rank
    /// gets it back: give every rank the same value (a per-rank data position belongs in a
    /// value keyed by rank). A value that cannot be serialized is an error.
    pub fn extra(mut self, value: &impl Serialize) -> Result<Self> {
        let v = serde_json::to_value(value).map_err(|e| Error::InvalidArgument {
            context: "checkpoint: TrainState::extra".into(),
            reason: format!("the value cannot be saved as JSON: {e}"),
        })?;
        self.extra = Some(v);
        Ok(self)
    }
    /// Leaves the random generator's position out.
    pub fn without_rng(mut self) -> Self {
        self.rng = false;
        self
    }

    /// The step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The mesh every tensor lives on.
    pub(crate) fn mesh(&self) -> Result<&DeviceMesh> {
        let (first, t) = self.params.first().or(self.buffers.first()).ok_or_else(|| Error::InvalidArgument {
            context: "checkpoint: training state".into(),
            reason: "the model has no parameters and no buffers".into(),
        })?;
        for (name, p) in self.params.iter().chain(&self.buffers) {
            if !p.device_mesh().same_as(t.device_mesh()) {
                return Err(Error::MeshMismatch {
                    context: format!("checkpoint: `{name}` and `{first}` of the training state"),
                    left: p.device_mesh().to_string(),
                    right: t.device_mesh().to_string(),
                });
            }
        }
        Ok(t.device_mesh())
    }

    /// The model's Partial tensors reduced (as [`save`](super::save) does), by position in
    /// parameters-then-buffers order; `None` for the others. Collective over the mesh when a
    /// tensor is Partial; the part of a save every rank runs in the same order.
    pub(crate) fn reduce_partials(&self) -> Result<Vec<Option<DTensor<T>>>> {
        let partial = |t: &DTensor<T>| t.placements().iter().any(|p| p.is_partial());
        self.params
            .iter()
            .chain(&self.buffers)
            .map(|(_, t)| partial(t).then(|| t.redistribute(&without_partials(t.placements()))).transpose())
            .collect()
    }

    /// This rank's snapshot and the JSON part, given [`reduce_partials`](Self::reduce_partials)'
    /// result. No communication.
    pub(crate) fn snapshot(&self, reduced: &[Option<DTensor<T>>]) -> Result<(Snapshot, TrainStateMeta)> {
        let mesh = self.mesh()?;
        let mut snap = Snapshot::new(mesh);
        for ((name, t), r) in self.params.iter().chain(&self.buffers).zip(reduced) {
            let t = r.as_ref().unwrap_or(t);
            snap.add(&model_tensor_name(name), t.local(), mesh, t.placements(), t.shape())?;
        }
        let optimizer = match self.optimizer {
            None => None,
            Some(o) => Some(self.snapshot_optimizer(o.state_dict(), &mut snap)?),
        };
        let meta = TrainStateMeta {
            format: STATE_FORMAT.into(),
            version: STATE_VERSION,
            step: self.step,
            dtype: T::DTYPE.safetensors_name().into(),
            parameters: self.params.iter().map(|(n, _)| n.clone()).collect(),
            buffers: self.buffers.iter().map(|(n, _)| n.clone()).collect(),
            optimizer,
            scaler: self.scaler.map(GradScaler::state),
            rng: self.rng.then(crate::rng::rng_state),
            extra: self.extra.clone(),
        };
        Ok((snap, meta))
    }

    fn snapshot_optimizer(&self, sd: OptimizerStateDict<'_, T>, snap: &mut Snapshot) -> Result<SavedOptimizer> {
        let mut params = BTreeMap::new();
        for (name, state) in &sd.params {
            let (_, p) = self.params.iter().find(|(n, _)| n == name).ok_or_else(|| Error::InvalidArgument {
                context: "checkpoint: training state".into(),
                reason: format!("the optimizer has state for `{name}`, which is not a parameter of the model"),
            })?;
            let mut slots = BTreeMap::new();
            for (slot, t) in &state.slots {
                let tname = optim_tensor_name(name, slot);
                let (m, pl, sh) = (p.device_mesh(), p.placements(), p.shape());
                match t {
                    StateTensor::Elem(s) => snap.add(&tname, s.as_ref(), m, pl, sh)?,
                    StateTensor::F32(s) => snap.add(&tname, s.as_ref(), m, pl, sh)?,
                }
                slots.insert(slot.clone(), if t.is_f32() { F32 } else { ELEM }.to_string());
            }
            params.insert(name.clone(), SavedParamState { step: state.step, slots });
        }
        Ok(SavedOptimizer { config: sd.config.clone(), params })
    }
}

/// What to load into: a model (its parameters' placements say how every tensor is loaded)
/// and, optionally, its optimizer and loss scaler; the random generator's position is restored
/// when the checkpoint holds it, unless [`without_rng`](Self::without_rng).
pub struct Restore<'a, T: Element, M: Module<T> + ?Sized> {
    model: &'a mut M,
    optimizer: Option<&'a mut dyn OptimizerState<T>>,
    scaler: Option<&'a mut GradScaler>,
    rng: bool,
}

impl<'a, T: Element, M: Module<T> + ?Sized> Restore<'a, T, M> {
    /// Loads into `model`.
    pub fn new(model: &'a mut M) -> Self {
        Restore { model, optimizer: None, scaler: None, rng: true }
    }
    /// Loads the optimizer's state too (the checkpoint must hold one).
    pub fn optimizer(mut self, optimizer: &'a mut dyn OptimizerState<T>) -> Self {
        self.optimizer = Some(optimizer);
        self
    }
    /// Loads the loss scaler's state too (the checkpoint must hold one).
    pub fn scaler(mut self, scaler: &'a mut GradScaler) -> Self {
        self.scaler = Some(scaler);
        self
    }
    /// Leaves the random generator as it is.
    pub fn without_rng(mut self) -> Self {
        self.rng = false;
        self
    }
}

/// What a load restored besides the tensors.
#[derive(Debug, Clone)]
pub struct Restored {
    /// The directory loaded.
    pub path: PathBuf,
    /// The step the state was saved at.
    pub step: u64,
    /// The user value saved with it.
    pub extra: Option<serde_json::Value>,
    /// Tensor bytes this rank read.
    pub payload_bytes_read: u64,
}

impl Restored {
    /// The user value saved with [`TrainState::extra`], as `D` (`None` when none was saved);
    /// a value that is not a `D` is an error.
    pub fn extra_as<D: serde::de::DeserializeOwned>(&self) -> Result<Option<D>> {
        let Some(v) = &self.extra else { return Ok(None) };
        D::deserialize(v).map(Some).map_err(|e| Error::Checkpoint {
            path: self.path.join(STATE_FILE).display().to_string(),
            reason: format!("the saved user value is not of the type asked for: {e}"),
        })
    }
}

/// Reads and checks `dir/train_state.json`.
pub fn read_meta(dir: impl AsRef<Path>) -> Result<TrainStateMeta> {
    let dir = dir.as_ref();
    let safe = SafeDir::new(dir)?;
    let bad = |reason: String| Error::Checkpoint { path: dir.join(STATE_FILE).display().to_string(), reason };
    let mut file = match safe.open(STATE_FILE) {
        Err(Error::Checkpoint { .. }) if !dir.join(STATE_FILE).exists() => {
            let reason = "not a complete training state: train_state.json is missing (a save still running, \
                          one that was interrupted, or a plain tensor checkpoint of `checkpoint::save`; load the \
                          checkpoint root to get the last committed state)";
            return Err(bad(reason.into()));
        }
        r => r?,
    };
    let text = file.read_all(MAX_INDEX_BYTES)?;
    let meta: TrainStateMeta = serde_json::from_slice(&text).map_err(|e| bad(format!("malformed: {e}")))?;
    if meta.format != STATE_FORMAT || meta.version != STATE_VERSION {
        return Err(bad(format!(
            "format `{}` version {} is not `{STATE_FORMAT}` version {STATE_VERSION}",
            meta.format, meta.version
        )));
    }
    Ok(meta)
}

/// Which names are in one list and not the other, said for a message (`None`: the same set).
fn name_difference(what: &str, saved: &[String], model: &[String]) -> Option<String> {
    let (s, m): (BTreeSet<&String>, BTreeSet<&String>) = (saved.iter().collect(), model.iter().collect());
    let missing: Vec<&&String> = m.difference(&s).take(8).collect();
    let unexpected: Vec<&&String> = s.difference(&m).take(8).collect();
    if missing.is_empty() && unexpected.is_empty() {
        return None;
    }
    Some(format!(
        "the checkpoint is of another model: {what} the model has and the checkpoint lacks: {missing:?}; \
         {what} the checkpoint has and the model lacks: {unexpected:?}"
    ))
}

/// Loads tensor `name` as `like` is laid out (its mesh and placements), checking the saved
/// global shape is `like`'s.
fn load_like<E: Scalar, T: Element>(ck: &mut Checkpoint, name: &str, like: &DTensor<T>) -> Result<Storage<E>> {
    let path = ck.dir.shown(INDEX_FILE).display().to_string();
    let saved = ck.index.tensor(name).ok_or_else(|| Error::Checkpoint {
        path: path.clone(),
        reason: format!("tensor `{name}` is missing from the index"),
    })?;
    if saved.shape != like.shape() {
        return Err(Error::Checkpoint {
            path,
            reason: format!(
                "tensor `{name}` was saved with shape {:?}, the model's is {:?}",
                saved.shape,
                like.shape()
            ),
        });
    }
    let mut out = ck.load::<E>(like.device_mesh(), &[(name, like.placements())])?;
    Ok(out.pop().expect("one tensor asked, one loaded").1.into_local())
}

/// Loads the training state saved in `dir` (a version directory written by a
/// [`Checkpointer`](super::Checkpointer)) into `into`: every tensor placed as the model's
/// parameter of the same name is placed now, whatever mesh it was saved from. No
/// communication: every rank reads its own byte ranges.
///
/// Everything is read and checked before anything is written: another model (names or shapes
/// that differ), a dtype that is not `T`, an optimizer or scaler asked for and not saved (or
/// saved for another kind of optimizer), a damaged or truncated file: each is a typed error
/// and leaves model, optimizer, scaler and generator untouched. The price: while loading, a
/// rank holds its shards of the old and the loaded state at once.
pub fn load_train_state<T: Element, M: Module<T> + ?Sized>(
    dir: impl AsRef<Path>,
    into: Restore<'_, T, M>,
) -> Result<Restored> {
    let dir = dir.as_ref();
    let meta = read_meta(dir)?;
    let mut ck = Checkpoint::open(dir)?;
    let bad = |reason: String| Error::Checkpoint { path: dir.display().to_string(), reason };
    if meta.dtype != T::DTYPE.safetensors_name() {
        return Err(bad(format!(
            "the model was saved in {} but is loaded as {}",
            meta.dtype,
            T::DTYPE.safetensors_name()
        )));
    }
    let Restore { model, optimizer, scaler, rng } = into;
    let names = |v: Vec<(String, &DTensor<T>)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    if let Some(why) = name_difference("parameters", &meta.parameters, &names(model.named_parameters())) {
        return Err(bad(why));
    }
    if let Some(why) = name_difference("buffers", &meta.buffers, &names(model.named_buffers())) {
        return Err(bad(why));
    }
    // Read everything first.
    let mut params = HashMap::new();
    for (name, p) in model.named_parameters() {
        let local = load_like::<T, T>(&mut ck, &model_tensor_name(&name), p)?;
        params.insert(name, local);
    }
    let mut buffers = HashMap::new();
    for (name, b) in model.named_buffers() {
        let local = load_like::<T, T>(&mut ck, &model_tensor_name(&name), b)?;
        buffers.insert(name, local);
    }
    let opt_state = match (&optimizer, &meta.optimizer) {
        (None, _) => None,
        (Some(_), None) => return Err(bad("the checkpoint holds no optimizer state".into())),
        (Some(_), Some(saved)) => {
            let by_name: BTreeMap<String, &DTensor<T>> = model.named_parameters().into_iter().collect();
            let mut out = BTreeMap::new();
            for (name, ps) in &saved.params {
                let p = by_name.get(name).ok_or_else(|| {
                    bad(format!("the optimizer state names `{name}`, which is not a parameter of the model"))
                })?;
                let mut slots = BTreeMap::new();
                for (slot, kind) in &ps.slots {
                    let tname = optim_tensor_name(name, slot);
                    let t = match kind.as_str() {
                        ELEM => StateTensor::Elem(Cow::Owned(load_like::<T, T>(&mut ck, &tname, p)?)),
                        F32 => StateTensor::F32(Cow::Owned(load_like::<f32, T>(&mut ck, &tname, p)?)),
                        other => return Err(bad(format!("optimizer slot `{tname}` has an unknown kind `{other}`"))),
                    };
                    slots.insert(slot.clone(), t);
                }
                out.insert(name.clone(), ParamState { step: ps.step, slots });
            }
            Some(OptimizerStateDict { config: saved.config.clone(), params: out })
        }
    };
    let next_scaler = match (&scaler, &meta.scaler) {
        (None, _) => None,
        (Some(_), None) => return Err(bad("the checkpoint holds no loss-scaler state".into())),
        (Some(s), Some(saved)) => {
            let mut next = GradScaler::clone(s);
            next.load_state(saved)?;
            Some(next)
        }
    };
    // The optimizer's load is the last step that can fail; it changes nothing when it does.
    if let (Some(o), Some(sd)) = (optimizer, opt_state) {
        o.load_state_dict(sd)?;
    }
    if let (Some(s), Some(next)) = (scaler, next_scaler) {
        *s = next;
    }
    // By name: `named_parameters_mut` need not list them in `named_parameters`' order. A
    // shape mismatch here would mean the two lists disagree: keep the parameter, never a
    // tensor of another shape.
    for (name, p) in model.named_parameters_mut() {
        if let Some(local) = params.remove(&name) {
            p.local = Arc::new(local);
        }
    }
    for (name, b) in model.named_buffers_mut() {
        if let Some(local) = buffers.remove(&name) {
            b.local = Arc::new(local);
        }
    }
    if let (true, Some(state)) = (rng, meta.rng) {
        crate::rng::set_rng_state(state);
    }
    Ok(Restored {
        path: dir.to_path_buf(),
        step: meta.step,
        extra: meta.extra,
        payload_bytes_read: ck.payload_bytes_read(),
    })
}
