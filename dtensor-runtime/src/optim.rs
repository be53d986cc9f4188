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

use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::module::Module;
use crate::storage::op::{AdamWStep, SgdStep};
use crate::storage::Storage;
use std::collections::hash_map::Entry;
use std::collections::HashMap;

/// Gradient of `p` as a shard shaped like `p`'s local shard, or `None` without a gradient.
fn local_grad<T: Element>(name: &str, p: &DTensor<T>) -> Result<Option<Storage<T>>> {
    let Some(g) = p.grad() else { return Ok(None) };
    if g.placements() != p.placements() || g.local().shape() != p.local().shape() {
        return Err(Error::ShapeMismatch {
            context: format!("optimizer: gradient of `{name}` is laid out differently from the parameter"),
            expected: p.local().shape().to_vec(),
            actual: g.local().shape().to_vec(),
        });
    }
    Ok(Some(g.into_local()))
}

/// Stochastic gradient descent with optional momentum and (coupled) weight decay, as
/// PyTorch `optim.SGD`.
#[derive(Debug, Clone)]
pub struct Sgd<T: Element> {
    /// Learning rate: the step is `lr` times the (momentum-smoothed) gradient.
    pub lr: T,
    /// Momentum factor in `[0, 1)`; 0 disables the momentum buffer.
    pub momentum: T,
    /// L2 penalty coefficient added to the gradient (`grad + weight_decay * param`); 0 disables it.
    pub weight_decay: T,
    buf: HashMap<String, Storage<T>>,
}

impl<T: Element> Sgd<T> {
    /// Plain SGD with learning rate `lr`.
    pub fn new(lr: T) -> Self {
        Sgd { lr, momentum: T::zero(), weight_decay: T::zero(), buf: HashMap::new() }
    }
    /// Sets the momentum.
    pub fn momentum(mut self, m: T) -> Self {
        self.momentum = m;
        self
    }
    /// Sets the weight decay.
    pub fn weight_decay(mut self, wd: T) -> Self {
        self.weight_decay = wd;
        self
    }

    /// One update of every parameter of `module` that has a gradient.
    pub fn step<M: Module<T> + ?Sized>(&mut self, module: &mut M) -> Result<()> {
        for (name, p) in module.named_parameters_mut() {
            let Some(g) = local_grad(&name, p)? else { continue };
            let mut step = SgdStep {
                lr: self.lr.as_f64(),
                momentum: self.momentum.as_f64(),
                weight_decay: self.weight_decay.as_f64(),
                first: false,
            };
            let buf = if self.momentum != T::zero() {
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
            p.local.sgd_step(&g, buf, &step)?;
        }
        Ok(())
    }
}

/// Adam with decoupled weight decay, as PyTorch `optim.AdamW`.
#[derive(Debug, Clone)]
pub struct AdamW<T: Element> {
    /// Learning rate scaling each update.
    pub lr: T,
    /// Decay rates `(beta1, beta2)` in `[0, 1)` of the first and second moment averages.
    pub betas: (T, T),
    /// Added to the square root of the second moment to avoid division by zero.
    pub eps: T,
    /// Decoupled decay: each step scales parameters by `1 - lr * weight_decay` before the Adam update.
    pub weight_decay: T,
    state: HashMap<String, (usize, Storage<T>, Storage<T>)>,
}

impl<T: Element> AdamW<T> {
    /// PyTorch defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
    pub fn new(lr: T) -> Self {
        AdamW {
            lr,
            betas: (T::of_f64(0.9), T::of_f64(0.999)),
            eps: T::of_f64(1e-8),
            weight_decay: T::of_f64(0.01),
            state: HashMap::new(),
        }
    }
    /// Sets the weight decay.
    pub fn weight_decay(mut self, wd: T) -> Self {
        self.weight_decay = wd;
        self
    }
    /// Sets the moment decay rates.
    pub fn betas(mut self, b1: T, b2: T) -> Self {
        self.betas = (b1, b2);
        self
    }
    /// Sets the denominator's epsilon.
    pub fn eps(mut self, eps: T) -> Self {
        self.eps = eps;
        self
    }

    /// One update of every parameter of `module` that has a gradient.
    pub fn step<M: Module<T> + ?Sized>(&mut self, module: &mut M) -> Result<()> {
        let (b1, b2) = self.betas;
        let (lr, eps, wd) = (self.lr, self.eps, self.weight_decay);
        for (name, p) in module.named_parameters_mut() {
            let Some(g) = local_grad(&name, p)? else { continue };
            let (t, m, v) = match self.state.entry(name) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(e) => {
                    let zeros = g.new_full(g.shape(), T::zero())?;
                    e.insert((0, zeros.clone(), zeros))
                }
            };
            *t += 1;
            // Bias corrections in `T`, as PyTorch computes them for the parameter's dtype.
            let c1 = T::one() - b1.powi(*t as i32);
            let c2 = T::one() - b2.powi(*t as i32);
            let step = AdamWStep {
                lr: lr.as_f64(),
                beta1: b1.as_f64(),
                beta2: b2.as_f64(),
                eps: eps.as_f64(),
                weight_decay: wd.as_f64(),
                bias_correction1: c1.as_f64(),
                bias_correction2: c2.as_f64(),
            };
            p.local.adamw_step(&g, m, v, &step)?;
        }
        Ok(())
    }
}
