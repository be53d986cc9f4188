//! Gradient clipping by the global norm of every gradient of a module, over every mesh.

use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::module::Module;
use crate::placement::Placement;

/// Scales every gradient of `module` so that their joint `norm_type`-norm is at most
/// `max_norm`, and returns the norm before clipping (PyTorch
/// `torch.nn.utils.clip_grad_norm_`, with `norm_type` 2 or infinity).
///
/// The norm is the **global** one: the norm of the full gradients, whatever their layouts
/// (sharded by FSDP or tensor parallelism, replicated) and meshes — every rank returns the
/// same value, the value one rank would compute on the unsharded model. (PyTorch's returns
/// a DTensor whose local value is only this rank's part when the gradients are sharded:
/// pytorch#170862.) Each gradient's sum of squares (or maximum) is computed in f64 on its
/// shard; sums of squares of the same layout are added locally, so each layout costs one
/// reduction (the infinity norm: one per gradient).
///
/// Gradients are scaled by `max_norm / (norm + 1e-6)` when that is below 1, as PyTorch does
/// (a NaN norm, from a NaN or infinite gradient, makes every gradient NaN, as there).
/// An [`Error::InvalidArgument`] for a `max_norm` that is negative or not finite, or another
/// `norm_type`.
///
/// ```
/// use dtensor_runtime::optim::clip_grad_norm;
/// use dtensor_runtime::module::{Forward, Linear, Module};
/// use dtensor_runtime::{ndarray::ArrayD, run, DTensor};
/// run(1, |ctx| {
///     ctx.init_device_mesh(&[1], &["x"])?;
///     // a module as built (local tensors) and a local input
///     let lin = Linear::<f64>::new(2, 2, false)?;
///     let x = DTensor::local_tensor(ArrayD::<f64>::ones(vec![1, 2]));
///     lin.forward(&x)?.sum()?.mul_scalar(100.0)?.backward()?;
///     let before = clip_grad_norm(&lin, 1.0, 2.0)?;
///     assert!((before - 200.0).abs() < 1e-9); // four entries of 100
///     assert!((clip_grad_norm(&lin, 1.0, 2.0)? - 1.0).abs() < 1e-5);
///     Ok(())
/// }).unwrap();
/// ```
pub fn clip_grad_norm<T: Element, M: Module<T> + ?Sized>(module: &M, max_norm: f64, norm_type: f64) -> Result<f64> {
    let bad = |reason: String| Error::InvalidArgument { context: "clip_grad_norm".into(), reason };
    if !(max_norm.is_finite() && max_norm >= 0.0) {
        return Err(bad(format!("max_norm must be finite and non-negative, got {max_norm}")));
    }
    let infinity = if norm_type == 2.0 {
        false
    } else if norm_type == f64::INFINITY {
        true
    } else {
        return Err(bad(format!("norm_type {norm_type} is not supported (2 or infinity)")));
    };
    let params = module.named_parameters();
    let grads: Vec<(&DTensor<T>, DTensor<T>)> = params.iter().filter_map(|(_, p)| p.grad().map(|g| (*p, g))).collect();
    // One term per layout: terms on the same mesh with the same placements add locally.
    let mut terms: Vec<(DTensor<f64>, Vec<Placement>)> = Vec::new();
    for (_, g) in &grads {
        if g.numel() == 0 {
            continue; // nothing to add, and no maximum to take
        }
        let g = g.cast::<f64>()?;
        let t = if infinity { g.abs()?.max()? } else { g.mul(&g)?.sum()? };
        // (maxima are reduced one by one: there is no element-wise maximum to add them with)
        let same = |(u, pl): &&mut (DTensor<f64>, Vec<Placement>)| {
            !infinity && *pl == t.placements() && u.device_mesh().same_as(t.device_mesh())
        };
        match terms.iter_mut().find(|x| same(x)) {
            Some((u, _)) => *u = u.add(&t)?,
            None => {
                let pl = t.placements().to_vec();
                terms.push((t, pl));
            }
        }
    }
    let mut total = 0.0f64;
    for (t, _) in &terms {
        let v = t.full_tensor()?.iter().copied().next().unwrap_or(0.0);
        // a NaN stays NaN (f64::max would drop it), as in PyTorch
        total = if !infinity {
            total + v
        } else if v.is_nan() || v > total {
            v
        } else {
            total
        };
    }
    let norm = if infinity { total } else { total.sqrt() };
    let coef = max_norm / (norm + 1e-6);
    // PyTorch clamps the coefficient to 1 and multiplies: a NaN norm makes every gradient NaN.
    if coef.is_nan() || coef < 1.0 {
        for (p, g) in &grads {
            p.set_grad(&g.mul_scalar(T::of_f64(coef))?)?;
        }
    }
    Ok(norm)
}
