//! Optimizers that update DTensor parameters in place, shard by shard: a parameter's gradient
//! has the parameter's placements, so the update is purely local (no communication).
//!
//! ```
//! use dtensor_runtime::module::{Forward, Linear, Module};
//! use dtensor_runtime::optim::Sgd;
//! use dtensor_runtime::{manual_seed, DTensor, ndarray::ArrayD};
//! manual_seed(0);
//! let mut lin = Linear::<f64>::new(3, 1, true)?;
//! let x = DTensor::local_tensor(ArrayD::ones(vec![4, 3]));
//! let mut opt = Sgd::new(0.1);
//! let first = lin.forward(&x)?.mse_loss(&DTensor::local_tensor(ArrayD::zeros(vec![4, 1])))?;
//! for _ in 0..10 {
//!     lin.zero_grad();
//!     let loss = lin.forward(&x)?.mse_loss(&DTensor::local_tensor(ArrayD::zeros(vec![4, 1])))?;
//!     loss.backward()?;
//!     opt.step(&mut lin)?;
//! }
//! let last = lin.forward(&x)?.mse_loss(&DTensor::local_tensor(ArrayD::zeros(vec![4, 1])))?;
//! assert!(last.full_tensor()?.sum() < first.full_tensor()?.sum());
//! # Ok::<(), dtensor_runtime::Error>(())
//! ```
//!
//! Mixed precision (the AMP recipe): with [`Sgd::master_weights`] / [`AdamW::master_weights`]
//! the optimizer keeps an f32 copy of each bf16/f16 parameter shard and its state, applies the
//! update to the copy in f32 and writes the copy back rounded, so updates smaller than half an
//! ulp of the 16-bit weight are not lost. For f16, a [`GradScaler`] scales the loss against
//! gradient underflow and skips the steps whose gradients overflowed.

mod clip;
mod grad_scaler;
mod state;

pub use clip::clip_grad_norm;
pub use grad_scaler::{GradScaler, GradScalerState};
pub use state::{OptimizerConfig, OptimizerState, OptimizerStateDict, ParamState, StateTensor};

use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::module::Module;
use crate::op::{AdamWStep, SgdStep, UnaryOp};
use crate::storage::Storage;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

/// Gradient of `p` as a shard shaped like `p`'s local shard (shared with the stored gradient,
/// not copied), or `None` without a gradient.
fn local_grad<T: Element>(name: &str, p: &DTensor<T>) -> Result<Option<Arc<Storage<T>>>> {
    let Some(g) = p.grad() else { return Ok(None) };
    if g.placements() != p.placements() || g.local().shape() != p.local().shape() {
        return Err(Error::ShapeMismatch {
            context: format!("optimizer: gradient of `{name}` is laid out differently from the parameter"),
            expected: p.local().shape().to_vec(),
            actual: g.local().shape().to_vec(),
        });
    }
    Ok(Some(Arc::clone(&g.local)))
}

/// `g` times `factor` (the inverse loss scale), untouched for a factor of 1.
fn times<W: Element>(g: Arc<Storage<W>>, factor: f64) -> Result<Arc<Storage<W>>> {
    if factor == 1.0 {
        Ok(g)
    } else {
        g.unary(UnaryOp::MulScalar(factor)).map(Arc::new)
    }
}

/// What a [`GradScaler`] needs of an optimizer: one step whose gradients are first multiplied
/// by `grad_factor` (in f32 for master weights, so unscaling cannot underflow a 16-bit value).
pub trait Optimizer<T: Element> {
    /// One update of every parameter of `module` that has a gradient, each gradient taken
    /// times `grad_factor` (1 for a plain step).
    fn step_with_grad_factor<M: Module<T> + ?Sized>(&mut self, module: &mut M, grad_factor: f64) -> Result<()>;

    /// Whether the update runs in f32 on master copies of the parameters (then gradients are
    /// unscaled in f32). `false` unless the optimizer keeps master weights.
    fn updates_in_f32(&self) -> bool {
        false
    }

    /// Whether every gradient of `module`, taken times `grad_factor` in the precision the
    /// update runs in ([`updates_in_f32`](Self::updates_in_f32)), is finite on this rank: the
    /// gradients [`step_with_grad_factor`](Self::step_with_grad_factor) would apply, checked
    /// before anything is written (PyTorch's `unscale_` then `found_inf`).
    fn unscaled_grads_finite<M: Module<T> + ?Sized>(&self, module: &M, grad_factor: f64) -> Result<bool> {
        if self.updates_in_f32() {
            grads_finite::<T, f32, M>(module, grad_factor)
        } else {
            grads_finite::<T, T, M>(module, grad_factor)
        }
    }
}

/// Whether every gradient of `module`, cast to `W` and taken times `factor` by the kernel the
/// update uses ([`times`]), is finite.
fn grads_finite<T: Element, W: Element, M: Module<T> + ?Sized>(module: &M, factor: f64) -> Result<bool> {
    for (_, p) in module.named_parameters() {
        let Some(g) = p.grad() else { continue };
        let g = g.local().cast::<W>()?;
        if times(Arc::new(g), factor)?.to_host()?.iter().any(|v| !v.is_finite()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Checks one hyperparameter: `ok(value)` must hold and the value must be finite (PyTorch
/// raises `ValueError` for the same values; a non-finite one would write inf/NaN weights).
fn check_hyper(optimizer: &str, name: &str, value: f64, ok: bool, rule: &str) -> Result<()> {
    if ok && value.is_finite() {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        context: format!("{optimizer}: hyperparameter `{name}`"),
        reason: format!("{value} is invalid: it must be finite and {rule}"),
    })
}

/// The gradient factor a caller (the [`GradScaler`]) passes: finite and positive.
fn check_grad_factor(optimizer: &str, grad_factor: f64) -> Result<()> {
    check_hyper(optimizer, "grad_factor", grad_factor, grad_factor > 0.0, "> 0")
}

/// An f32 weight copy and its momentum buffer.
type SgdMaster = (Storage<f32>, Storage<f32>);
/// Step count, f32 weight copy, first and second moments.
type AdamWMaster = (usize, Storage<f32>, Storage<f32>, Storage<f32>);

/// Stochastic gradient descent with optional momentum and (coupled) weight decay, as
/// PyTorch `optim.SGD`.
#[derive(Debug, Clone)]
pub struct Sgd<T: Element> {
    /// Learning rate: the step is `lr` times the (momentum-smoothed) gradient. The
    /// hyperparameters are f64, as PyTorch's Python floats: a bf16 `lr` would be rounded to
    /// 8 significant bits before the f32 master-weight update ever saw it.
    pub lr: f64,
    /// Momentum factor in `[0, 1)`; 0 disables the momentum buffer.
    pub momentum: f64,
    /// L2 penalty coefficient added to the gradient (`grad + weight_decay * param`); 0 disables it.
    pub weight_decay: f64,
    buf: HashMap<String, Storage<T>>,
    /// f32 weight copies and momentum buffers by parameter name, with master weights on.
    master: Option<HashMap<String, SgdMaster>>,
}

impl<T: Element> Sgd<T> {
    /// Plain SGD with learning rate `lr`.
    pub fn new(lr: f64) -> Self {
        Sgd { lr, momentum: 0.0, weight_decay: 0.0, buf: HashMap::new(), master: None }
    }
    /// Keeps f32 master copies of the parameters (and an f32 momentum buffer), made from each
    /// parameter at its first step: the update runs in f32 and is written back rounded to `T`.
    /// Meant for bf16/f16 parameters; for f32 it changes nothing but memory.
    pub fn master_weights(mut self, on: bool) -> Self {
        self.master = on.then(HashMap::new);
        self
    }
    /// Sets the momentum.
    pub fn momentum(mut self, m: f64) -> Self {
        self.momentum = m;
        self
    }
    /// Sets the weight decay.
    pub fn weight_decay(mut self, wd: f64) -> Self {
        self.weight_decay = wd;
        self
    }

    /// One update of every parameter of `module` that has a gradient.
    pub fn step<M: Module<T> + ?Sized>(&mut self, module: &mut M) -> Result<()> {
        self.step_with_grad_factor(module, 1.0)
    }

    /// Checks the hyperparameters as PyTorch's `SGD` constructor does (`lr`, `momentum` and
    /// `weight_decay` ≥ 0), and that each is finite; every step calls it before touching a
    /// weight, so a bad value (the fields are public) is an [`Error::InvalidArgument`] naming
    /// it, never a NaN weight.
    pub fn validate(&self) -> Result<()> {
        check_hyper("Sgd", "lr", self.lr, self.lr >= 0.0, ">= 0")?;
        check_hyper("Sgd", "momentum", self.momentum, self.momentum >= 0.0, ">= 0")?;
        check_hyper("Sgd", "weight_decay", self.weight_decay, self.weight_decay >= 0.0, ">= 0")
    }
}

impl<T: Element> Optimizer<T> for Sgd<T> {
    fn updates_in_f32(&self) -> bool {
        self.master.is_some()
    }

    fn step_with_grad_factor<M: Module<T> + ?Sized>(&mut self, module: &mut M, grad_factor: f64) -> Result<()> {
        self.validate()?;
        check_grad_factor("Sgd", grad_factor)?;
        crate::module::check_declared_layouts(&*module, "the optimizer step found it")?;
        let momentum = self.momentum != 0.0;
        for (name, p) in module.named_parameters_mut() {
            let Some(g) = local_grad(&name, p)? else { continue };
            let mut step =
                SgdStep { lr: self.lr, momentum: self.momentum, weight_decay: self.weight_decay, first: false };
            if let Some(master) = &mut self.master {
                let g = times(Arc::new(g.cast::<f32>()?), grad_factor)?;
                let (w, buf) = match master.entry(name) {
                    Entry::Occupied(o) => o.into_mut(),
                    Entry::Vacant(e) => {
                        step.first = true;
                        e.insert((p.local.cast::<f32>()?, g.new_full(g.shape(), 0.0)?))
                    }
                };
                w.sgd_step(&g, momentum.then_some(buf), &step)?;
                p.local = Arc::new(w.cast::<T>()?);
                continue;
            }
            let g = times(g, grad_factor)?;
            let buf = if momentum {
                Some(match self.buf.entry(name) {
                    Entry::Occupied(o) => o.into_mut(),
                    Entry::Vacant(e) => {
                        // The first step starts the buffer at the (decayed) gradient (PyTorch).
                        step.first = true;
                        e.insert(g.new_full(g.shape(), T::zero())?)
                    }
                })
            } else {
                None
            };
            Arc::make_mut(&mut p.local).sgd_step(&g, buf, &step)?;
        }
        Ok(())
    }
}

/// Adam with decoupled weight decay, as PyTorch `optim.AdamW`.
#[derive(Debug, Clone)]
pub struct AdamW<T: Element> {
    /// Learning rate scaling each update (f64 like every hyperparameter, as PyTorch's Python
    /// floats: in f16 the default `eps` 1e-8 would round to 0).
    pub lr: f64,
    /// Decay rates `(beta1, beta2)` in `[0, 1)` of the first and second moment averages.
    pub betas: (f64, f64),
    /// Added to the square root of the second moment to avoid division by zero.
    pub eps: f64,
    /// Decoupled decay: each step scales parameters by `1 - lr * weight_decay` before the Adam update.
    pub weight_decay: f64,
    state: HashMap<String, (usize, Storage<T>, Storage<T>)>,
    /// (step count, f32 weight copy, first and second moments) by name, with master weights on.
    master: Option<HashMap<String, AdamWMaster>>,
}

impl<T: Element> AdamW<T> {
    /// PyTorch defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
    pub fn new(lr: f64) -> Self {
        AdamW { lr, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 0.01, state: HashMap::new(), master: None }
    }
    /// Keeps f32 master copies of the parameters and f32 moments, made from each parameter at
    /// its first step: the update runs in f32 and is written back rounded to `T`. Meant for
    /// bf16/f16 parameters; for f32 it changes nothing but memory.
    pub fn master_weights(mut self, on: bool) -> Self {
        self.master = on.then(HashMap::new);
        self
    }
    /// Sets the weight decay.
    pub fn weight_decay(mut self, wd: f64) -> Self {
        self.weight_decay = wd;
        self
    }
    /// Sets the moment decay rates.
    pub fn betas(mut self, b1: f64, b2: f64) -> Self {
        self.betas = (b1, b2);
        self
    }
    /// Sets the denominator's epsilon.
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// One update of every parameter of `module` that has a gradient.
    pub fn step<M: Module<T> + ?Sized>(&mut self, module: &mut M) -> Result<()> {
        self.step_with_grad_factor(module, 1.0)
    }

    /// Checks the hyperparameters as PyTorch's `AdamW` constructor does (`lr`, `eps` and
    /// `weight_decay` ≥ 0, each beta in `[0, 1)`), and that each is finite; every step calls it
    /// before touching a weight, so a bad value (the fields are public) is an
    /// [`Error::InvalidArgument`] naming it, never a NaN weight or an ascent.
    pub fn validate(&self) -> Result<()> {
        check_hyper("AdamW", "lr", self.lr, self.lr >= 0.0, ">= 0")?;
        check_hyper("AdamW", "eps", self.eps, self.eps >= 0.0, ">= 0")?;
        let (b1, b2) = self.betas;
        check_hyper("AdamW", "betas.0", b1, (0.0..1.0).contains(&b1), "in [0, 1)")?;
        check_hyper("AdamW", "betas.1", b2, (0.0..1.0).contains(&b2), "in [0, 1)")?;
        check_hyper("AdamW", "weight_decay", self.weight_decay, self.weight_decay >= 0.0, ">= 0")
    }
}

/// One AdamW update of `w` at step `t` (1-based), computed in `W` (the parameter's type, or
/// f32 for master weights).
fn adamw_update<W: Element>(
    hyper: &AdamW<impl Element>,
    t: usize,
    w: &mut Storage<W>,
    g: &Storage<W>,
    m: &mut Storage<W>,
    v: &mut Storage<W>,
) -> Result<()> {
    // The betas and bias corrections in f64, as PyTorch (Python floats, the corrections from
    // the step count in double): in a 16-bit type β₂ = 0.999 rounds to 1 and `1 − β₂ᵗ` to 0,
    // which would make every update 0/0. The kernel rounds them once into its compute type.
    let (b1, b2) = hyper.betas;
    let c1 = 1.0 - b1.powi(t as i32);
    let c2 = 1.0 - b2.powi(t as i32);
    let step = AdamWStep {
        lr: hyper.lr,
        beta1: b1,
        beta2: b2,
        eps: hyper.eps,
        weight_decay: hyper.weight_decay,
        bias_correction1: c1,
        bias_correction2: c2,
    };
    w.adamw_step(g, m, v, &step)
}

impl<T: Element> Optimizer<T> for AdamW<T> {
    fn updates_in_f32(&self) -> bool {
        self.master.is_some()
    }

    fn step_with_grad_factor<M: Module<T> + ?Sized>(&mut self, module: &mut M, grad_factor: f64) -> Result<()> {
        self.validate()?;
        check_grad_factor("AdamW", grad_factor)?;
        crate::module::check_declared_layouts(&*module, "the optimizer step found it")?;
        let mut master = self.master.take();
        let mut state = std::mem::take(&mut self.state);
        let result = (|| {
            for (name, p) in module.named_parameters_mut() {
                let Some(g) = local_grad(&name, p)? else { continue };
                if let Some(master) = &mut master {
                    let g = times(Arc::new(g.cast::<f32>()?), grad_factor)?;
                    let (t, w, m, v) = match master.entry(name) {
                        Entry::Occupied(o) => o.into_mut(),
                        Entry::Vacant(e) => {
                            let zeros = g.new_full(g.shape(), 0.0)?;
                            e.insert((0, p.local.cast::<f32>()?, zeros.clone(), zeros))
                        }
                    };
                    *t += 1;
                    adamw_update(self, *t, w, &g, m, v)?;
                    p.local = Arc::new(w.cast::<T>()?);
                    continue;
                }
                let g = times(g, grad_factor)?;
                let (t, m, v) = match state.entry(name) {
                    Entry::Occupied(o) => o.into_mut(),
                    Entry::Vacant(e) => {
                        let zeros = g.new_full(g.shape(), T::zero())?;
                        e.insert((0, zeros.clone(), zeros))
                    }
                };
                *t += 1;
                adamw_update(self, *t, Arc::make_mut(&mut p.local), &g, m, v)?;
            }
            Ok(())
        })();
        (self.master, self.state) = (master, state);
        result
    }
}
