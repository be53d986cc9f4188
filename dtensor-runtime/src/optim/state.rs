//! An optimizer's state as data (PyTorch's `optimizer.state_dict()`): its kind and
//! hyperparameters, and per parameter the step count and the state tensors (momentum buffer,
//! Adam moments, f32 master weights) as local shards shaped like the parameter's shard.
//!
//! The shards carry no layout of their own: a state tensor is laid out as its parameter, so a
//! training checkpoint saves it with the parameter's mesh and placements and loads it with the
//! placements the parameter has at load time (another mesh included).

use super::{AdamW, Sgd};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::storage::Storage;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// One state tensor of a parameter: in the parameter's element type, or f32 (master weights
/// and the moments kept beside them).
#[derive(Clone)]
pub enum StateTensor<'a, T: Element> {
    /// In the parameter's type `T`.
    Elem(Cow<'a, Storage<T>>),
    /// In f32.
    F32(Cow<'a, Storage<f32>>),
}

impl<T: Element> StateTensor<'_, T> {
    /// Whether the tensor is f32 kept beside a parameter of another type (`F32`), or in the
    /// parameter's type (`Elem`, which is f32 too for an f32 parameter).
    pub fn is_f32(&self) -> bool {
        matches!(self, StateTensor::F32(_))
    }

    /// Shape of the local shard.
    pub fn shape(&self) -> &[usize] {
        match self {
            StateTensor::Elem(s) => s.shape(),
            StateTensor::F32(s) => s.shape(),
        }
    }
}

/// The state of one parameter.
#[derive(Clone)]
pub struct ParamState<'a, T: Element> {
    /// Steps taken (AdamW's bias-correction count; 0 for Sgd, which keeps none).
    pub step: usize,
    /// State tensors by slot name (`exp_avg`, `exp_avg_sq`, `momentum_buffer`, `master`).
    pub slots: BTreeMap<String, StateTensor<'a, T>>,
}

/// What an optimizer is: its kind, hyperparameters and whether it keeps f32 master weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    /// `"Sgd"` or `"AdamW"`.
    pub kind: String,
    /// Hyperparameters by name (`lr`, `momentum`, `betas.0`, ...).
    pub hyper: BTreeMap<String, f64>,
    /// Whether the optimizer keeps f32 master copies of the parameters.
    pub master_weights: bool,
}

/// An optimizer's whole state: its configuration and the state of every parameter it has
/// stepped (parameters never stepped have none, as in PyTorch).
#[derive(Clone)]
pub struct OptimizerStateDict<'a, T: Element> {
    /// Kind and hyperparameters.
    pub config: OptimizerConfig,
    /// State by parameter name (the module's `named_parameters` names).
    pub params: BTreeMap<String, ParamState<'a, T>>,
}

/// Optimizers whose state can be saved and restored (by a training checkpoint).
pub trait OptimizerState<T: Element> {
    /// The state, borrowing the optimizer's tensors.
    fn state_dict(&self) -> OptimizerStateDict<'_, T>;

    /// Replaces the state (hyperparameters included, as PyTorch's `load_state_dict` restores
    /// the param groups) by `sd`, after checking all of it: another kind of optimizer, a
    /// master-weight setting that differs, a missing or unexpected slot, a slot of the wrong
    /// type, or hyperparameters this optimizer refuses are an [`Error::InvalidArgument`] and
    /// leave the optimizer as it was.
    fn load_state_dict(&mut self, sd: OptimizerStateDict<'_, T>) -> Result<()>;
}

fn refuse(kind: &str, reason: String) -> Error {
    Error::InvalidArgument { context: format!("{kind}::load_state_dict"), reason }
}

/// `sd`'s hyperparameter `name`, or an error naming it.
fn hyper(kind: &str, sd: &OptimizerConfig, name: &str) -> Result<f64> {
    sd.hyper.get(name).copied().ok_or_else(|| refuse(kind, format!("the state has no hyperparameter `{name}`")))
}

/// Checks the kind and master-weight setting, then takes each parameter's slots out as the
/// type its setting needs: `F32` slots with master weights, `Elem` slots without.
fn check_config(kind: &str, master: bool, sd: &OptimizerConfig) -> Result<()> {
    if sd.kind != kind {
        return Err(refuse(kind, format!("the state is of a `{}` optimizer, not `{kind}`", sd.kind)));
    }
    if sd.master_weights != master {
        let has = |b: bool| if b { "with" } else { "without" };
        return Err(refuse(
            kind,
            format!(
                "the state was saved {} master weights but this optimizer runs {} them",
                has(sd.master_weights),
                has(master)
            ),
        ));
    }
    Ok(())
}

/// Slot `name` of parameter `param`, which must be f32 (`want_f32`) or of the element type.
fn take_slot<'a, T: Element>(
    kind: &str,
    param: &str,
    slots: &mut BTreeMap<String, StateTensor<'a, T>>,
    name: &str,
    want_f32: bool,
) -> Result<StateTensor<'a, T>> {
    let t = slots.remove(name).ok_or_else(|| refuse(kind, format!("parameter `{param}` has no `{name}` state")))?;
    if t.is_f32() != want_f32 {
        let what = if want_f32 { "f32" } else { "in the parameter's type" };
        return Err(refuse(kind, format!("state `{name}` of parameter `{param}` is not {what}")));
    }
    Ok(t)
}

/// Refuses slots left after the expected ones were taken.
fn no_more_slots<T: Element>(kind: &str, param: &str, slots: &BTreeMap<String, StateTensor<'_, T>>) -> Result<()> {
    match slots.keys().next() {
        Some(extra) => Err(refuse(kind, format!("parameter `{param}` has an unexpected `{extra}` state"))),
        None => Ok(()),
    }
}

fn elem<T: Element>(t: StateTensor<'_, T>) -> Storage<T> {
    match t {
        StateTensor::Elem(s) => s.into_owned(),
        StateTensor::F32(_) => unreachable!("take_slot checked the type"),
    }
}

fn f32s<T: Element>(t: StateTensor<'_, T>) -> Storage<f32> {
    match t {
        StateTensor::F32(s) => s.into_owned(),
        StateTensor::Elem(_) => unreachable!("take_slot checked the type"),
    }
}

impl<T: Element> OptimizerState<T> for Sgd<T> {
    fn state_dict(&self) -> OptimizerStateDict<'_, T> {
        let config = OptimizerConfig {
            kind: "Sgd".into(),
            hyper: BTreeMap::from([
                ("lr".into(), self.lr),
                ("momentum".into(), self.momentum),
                ("weight_decay".into(), self.weight_decay),
            ]),
            master_weights: self.master.is_some(),
        };
        let mut params = BTreeMap::new();
        for (name, b) in &self.buf {
            let slots = BTreeMap::from([("momentum_buffer".to_string(), StateTensor::Elem(Cow::Borrowed(b)))]);
            params.insert(name.clone(), ParamState { step: 0, slots });
        }
        for (name, (w, b)) in self.master.iter().flatten() {
            let slots = BTreeMap::from([
                ("master".to_string(), StateTensor::F32(Cow::Borrowed(w))),
                ("momentum_buffer".to_string(), StateTensor::F32(Cow::Borrowed(b))),
            ]);
            params.insert(name.clone(), ParamState { step: 0, slots });
        }
        OptimizerStateDict { config, params }
    }

    fn load_state_dict(&mut self, sd: OptimizerStateDict<'_, T>) -> Result<()> {
        let master = self.master.is_some();
        check_config("Sgd", master, &sd.config)?;
        let mut next = self.clone();
        next.lr = hyper("Sgd", &sd.config, "lr")?;
        next.momentum = hyper("Sgd", &sd.config, "momentum")?;
        next.weight_decay = hyper("Sgd", &sd.config, "weight_decay")?;
        next.validate().map_err(|e| refuse("Sgd", e.to_string()))?;
        let (mut buf, mut masters) = (HashMap::new(), HashMap::new());
        for (name, mut p) in sd.params {
            if master {
                let w = f32s(take_slot("Sgd", &name, &mut p.slots, "master", true)?);
                let b = f32s(take_slot("Sgd", &name, &mut p.slots, "momentum_buffer", true)?);
                masters.insert(name.clone(), (w, b));
            } else {
                buf.insert(name.clone(), elem(take_slot("Sgd", &name, &mut p.slots, "momentum_buffer", false)?));
            }
            no_more_slots("Sgd", &name, &p.slots)?;
        }
        next.buf = buf;
        next.master = master.then_some(masters);
        *self = next;
        Ok(())
    }
}

impl<T: Element> OptimizerState<T> for AdamW<T> {
    fn state_dict(&self) -> OptimizerStateDict<'_, T> {
        let config = OptimizerConfig {
            kind: "AdamW".into(),
            hyper: BTreeMap::from([
                ("lr".into(), self.lr),
                ("betas.0".into(), self.betas.0),
                ("betas.1".into(), self.betas.1),
                ("eps".into(), self.eps),
                ("weight_decay".into(), self.weight_decay),
            ]),
            master_weights: self.master.is_some(),
        };
        let mut params = BTreeMap::new();
        for (name, (t, m, v)) in &self.state {
            let slots = BTreeMap::from([
                ("exp_avg".to_string(), StateTensor::Elem(Cow::Borrowed(m))),
                ("exp_avg_sq".to_string(), StateTensor::Elem(Cow::Borrowed(v))),
            ]);
            params.insert(name.clone(), ParamState { step: *t, slots });
        }
        for (name, (t, w, m, v)) in self.master.iter().flatten() {
            let slots = BTreeMap::from([
                ("master".to_string(), StateTensor::F32(Cow::Borrowed(w))),
                ("exp_avg".to_string(), StateTensor::F32(Cow::Borrowed(m))),
                ("exp_avg_sq".to_string(), StateTensor::F32(Cow::Borrowed(v))),
            ]);
            params.insert(name.clone(), ParamState { step: *t, slots });
        }
        OptimizerStateDict { config, params }
    }

    fn load_state_dict(&mut self, sd: OptimizerStateDict<'_, T>) -> Result<()> {
        let master = self.master.is_some();
        check_config("AdamW", master, &sd.config)?;
        let mut next = self.clone();
        next.lr = hyper("AdamW", &sd.config, "lr")?;
        next.betas = (hyper("AdamW", &sd.config, "betas.0")?, hyper("AdamW", &sd.config, "betas.1")?);
        next.eps = hyper("AdamW", &sd.config, "eps")?;
        next.weight_decay = hyper("AdamW", &sd.config, "weight_decay")?;
        next.validate().map_err(|e| refuse("AdamW", e.to_string()))?;
        let (mut state, mut masters) = (HashMap::new(), HashMap::new());
        for (name, mut p) in sd.params {
            // The bias corrections raise the betas to the step (an i32 power).
            if p.step == 0 || p.step > i32::MAX as usize {
                return Err(refuse("AdamW", format!("parameter `{name}` has a step count of {}", p.step)));
            }
            if master {
                let w = f32s(take_slot("AdamW", &name, &mut p.slots, "master", true)?);
                let m = f32s(take_slot("AdamW", &name, &mut p.slots, "exp_avg", true)?);
                let v = f32s(take_slot("AdamW", &name, &mut p.slots, "exp_avg_sq", true)?);
                masters.insert(name.clone(), (p.step, w, m, v));
            } else {
                let m = elem(take_slot("AdamW", &name, &mut p.slots, "exp_avg", false)?);
                let v = elem(take_slot("AdamW", &name, &mut p.slots, "exp_avg_sq", false)?);
                state.insert(name.clone(), (p.step, m, v));
            }
            no_more_slots("AdamW", &name, &p.slots)?;
        }
        next.state = state;
        next.master = master.then_some(masters);
        *self = next;
        Ok(())
    }
}
