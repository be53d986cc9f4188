//! Dynamic loss scaling for f16 training, with PyTorch `torch.amp.GradScaler`'s semantics.

use super::Optimizer;
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::mesh::Along;
use crate::module::Module;
use crate::placement::ReduceOp;

/// The smallest scale [`GradScaler::update`] backs off to: `1 / MIN_SCALE` is finite in f32.
const MIN_SCALE: f64 = f32::MIN_POSITIVE as f64;

/// A [`GradScaler`]'s state: its configuration, current scale and growth count.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GradScalerState {
    /// The current scale.
    pub scale: f64,
    /// Factor of growth after `growth_interval` good steps.
    pub growth_factor: f64,
    /// Factor of backoff after an inf/NaN gradient.
    pub backoff_factor: f64,
    /// Good steps in a row before the scale grows.
    pub growth_interval: usize,
    /// Good steps in a row so far.
    pub good_steps: usize,
    /// Whether the last step found an inf/NaN (`None` when `update` ran since).
    pub found_inf: Option<bool>,
}

/// Multiplies the loss by a scale so that small f16 gradients do not underflow, divides the
/// gradients by it again inside the optimizer step (in f32 with master weights), skips a step
/// whose gradients hold an inf or NaN and then halves the scale, and doubles the scale after
/// `growth_interval` steps in a row without one. All ranks of the parameters' mesh agree on
/// skipping (the inf/NaN flag is all-reduced), so replicas never diverge.
///
/// Per step: `scaler.scale(&loss)?.backward()?; scaler.step(&mut opt, &mut model)?;
/// scaler.update();`. A scale the loss's dtype cannot hold (above 65504 in f16) overflows the
/// scaled loss; that step is skipped and the scale lowered, as for any overflow.
///
/// ```
/// use dtensor_runtime::optim::{GradScaler, Sgd};
/// use dtensor_runtime::module::{Forward, Linear, Module};
/// use dtensor_runtime::{f16, manual_seed, DTensor, ndarray::ArrayD};
/// manual_seed(0);
/// let mut lin = Linear::<f16>::new(3, 1, true)?;
/// let x = DTensor::local_tensor(ArrayD::from_elem(vec![4, 3], f16::ONE));
/// let y = DTensor::local_tensor(ArrayD::from_elem(vec![4, 1], f16::ZERO));
/// let mut opt = Sgd::<f16>::new(0.1).master_weights(true);
/// let mut scaler = GradScaler::new().init_scale(1024.0);
/// lin.zero_grad();
/// scaler.scale(&lin.forward(&x)?.mse_loss(&y)?)?.backward()?;
/// assert!(scaler.step(&mut opt, &mut lin)?);
/// scaler.update();
/// assert_eq!(scaler.get_scale(), 1024.0);
/// # Ok::<(), dtensor_runtime::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct GradScaler {
    scale: f64,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: usize,
    good_steps: usize,
    /// Whether the last `step` found an inf/NaN gradient (`None` before any step).
    found_inf: Option<bool>,
}

impl Default for GradScaler {
    fn default() -> Self {
        Self::new()
    }
}

impl GradScaler {
    /// PyTorch's defaults: scale 2¹⁶, growth ×2 every 2000 good steps, backoff ×0.5.
    pub fn new() -> Self {
        GradScaler {
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            good_steps: 0,
            found_inf: None,
        }
    }
    /// Sets the initial scale.
    pub fn init_scale(mut self, s: f64) -> Self {
        self.scale = s;
        self
    }
    /// Sets the factor the scale grows by after `growth_interval` good steps.
    pub fn growth_factor(mut self, f: f64) -> Self {
        self.growth_factor = f;
        self
    }
    /// Sets the factor the scale shrinks by after a step with an inf/NaN gradient.
    pub fn backoff_factor(mut self, f: f64) -> Self {
        self.backoff_factor = f;
        self
    }
    /// Sets the number of consecutive good steps before the scale grows.
    pub fn growth_interval(mut self, n: usize) -> Self {
        self.growth_interval = n;
        self
    }

    /// The current scale.
    pub fn get_scale(&self) -> f64 {
        self.scale
    }

    /// Checks the configuration (PyTorch asserts the same factors): the scale finite and
    /// positive, `growth_factor` > 1, `backoff_factor` in (0, 1), `growth_interval` ≥ 1.
    /// [`scale`](Self::scale) and [`step`](Self::step) call it, so a bad builder value is an
    /// [`Error::InvalidArgument`] naming it before any gradient or weight is touched.
    pub fn validate(&self) -> Result<()> {
        let bad = |name: &str, value: String, rule: &str| Error::InvalidArgument {
            context: format!("GradScaler: `{name}`"),
            reason: format!("{value} is invalid: it must be {rule}"),
        };
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(bad("init_scale", self.scale.to_string(), "finite and > 0"));
        }
        if !(self.growth_factor.is_finite() && self.growth_factor > 1.0) {
            return Err(bad("growth_factor", self.growth_factor.to_string(), "finite and > 1"));
        }
        if !(self.backoff_factor > 0.0 && self.backoff_factor < 1.0) {
            return Err(bad("backoff_factor", self.backoff_factor.to_string(), "in (0, 1)"));
        }
        if self.growth_interval == 0 {
            return Err(bad("growth_interval", "0".into(), ">= 1"));
        }
        Ok(())
    }

    /// The scaler's state (PyTorch's `GradScaler.state_dict()`), for a training checkpoint.
    pub fn state(&self) -> GradScalerState {
        GradScalerState {
            scale: self.scale,
            growth_factor: self.growth_factor,
            backoff_factor: self.backoff_factor,
            growth_interval: self.growth_interval,
            good_steps: self.good_steps,
            found_inf: self.found_inf,
        }
    }

    /// Restores a state from [`state`](Self::state); a state this scaler would refuse (see
    /// [`validate`](Self::validate)) is an error and changes nothing.
    pub fn load_state(&mut self, s: &GradScalerState) -> Result<()> {
        let next = GradScaler {
            scale: s.scale,
            growth_factor: s.growth_factor,
            backoff_factor: s.backoff_factor,
            growth_interval: s.growth_interval,
            good_steps: s.good_steps,
            found_inf: s.found_inf,
        };
        next.validate()?;
        *self = next;
        Ok(())
    }

    /// `loss × scale` (differentiable): call `backward` on the result.
    pub fn scale<T: Element>(&self, loss: &DTensor<T>) -> Result<DTensor<T>> {
        self.validate()?;
        loss.mul_scalar(T::of_f64(self.scale))
    }

    /// Unscales the gradients and runs `opt`'s step unless an unscaled gradient holds an inf
    /// or NaN on any rank of the parameters' mesh; returns whether the step ran. Call
    /// [`update`](Self::update) afterwards.
    ///
    /// As PyTorch's `unscale_` + `step`: the check reads the gradients as the optimizer will
    /// apply them (times `1 / scale`, in f32 with master weights), so a step whose unscaling
    /// overflows is skipped too, and a skipped step writes nothing.
    pub fn step<T: Element, O: Optimizer<T>, M: Module<T> + ?Sized>(
        &mut self,
        opt: &mut O,
        module: &mut M,
    ) -> Result<bool> {
        self.validate()?;
        let Some((_, first)) = module.named_parameters().into_iter().next() else {
            return Err(Error::InvalidArgument {
                context: "GradScaler::step".into(),
                reason: "the module has no parameters".into(),
            });
        };
        let mesh = first.device_mesh().clone();
        let factor = 1.0 / self.scale;
        let bad = !opt.unscaled_grads_finite(module, factor)?;
        let mut flag = [if bad { 1.0f32 } else { 0.0 }];
        mesh.all_reduce(Along::All, &mut flag, ReduceOp::Max)?;
        let found = flag[0] != 0.0;
        self.found_inf = Some(found);
        if !found {
            opt.step_with_grad_factor(module, factor)?;
        }
        Ok(!found)
    }

    /// Adjusts the scale after a [`step`](Self::step): backs off after an inf/NaN, grows after
    /// `growth_interval` good steps in a row. Does nothing without a step since the last call.
    pub fn update(&mut self) {
        match self.found_inf.take() {
            Some(true) => {
                // Never down to 0 (whose inverse would unscale to inf): the floor keeps
                // `1 / scale` finite in f32.
                self.scale = (self.scale * self.backoff_factor).max(MIN_SCALE);
                self.good_steps = 0;
            }
            Some(false) => {
                self.good_steps += 1;
                if self.good_steps >= self.growth_interval {
                    // Grows only to a finite scale (PyTorch's `_amp_update_scale_`).
                    let grown = self.scale * self.growth_factor;
                    if grown.is_finite() {
                        self.scale = grown;
                    }
                    self.good_steps = 0;
                }
            }
            None => {}
        }
    }
}
