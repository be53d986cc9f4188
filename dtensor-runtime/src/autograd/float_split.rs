//! The float/integer split of autograd: only float tensors carry gradients, so ops written
//! once for every [`Scalar`] (views, slices, `where`, indexing, redistribution) ask here
//! whether to record (the float-only kernels their backward rules need are the ops' own
//! `ops::grad_kernels`).
//!
//! The split is made on the element type's identity (`TypeId`), inside autograd, so the
//! element vocabulary (`element.rs`) knows nothing of autograd and integer tensors never
//! meet a float op (as burn keeps its float and integer tensor ops apart).

use crate::dtensor::DTensor;
use crate::element::{bf16, f16, same_type, Scalar};
use crate::error::{Error, Result};
use crate::placement::Placement;
use std::any::Any;

/// Runs `$body` with `$f` bound to the `&DTensor<T>` `$x` seen as the float tensor it is, and
/// gives back `Some(result)` typed for `T` again; `None` when `T` is an integer type.
macro_rules! on_float {
    ($x:expr, |$f:ident| $body:expr) => {{
        on_float!(@try $x, $f, $body, f32, f64, bf16, f16)
    }};
    (@try $x:expr, $f:ident, $body:expr, $($F:ty),*) => {{
        let any: &dyn Any = $x;
        let mut out = None;
        $(
            if out.is_none() {
                if let Some($f) = any.downcast_ref::<DTensor<$F>>() {
                    out = same_type($body);
                }
            }
        )*
        out
    }};
}

/// A redistribution of `x`, recorded on the autograd tape for floats; integers carry no
/// gradient and redistribute unrecorded.
pub(crate) fn redistribute_recorded<T: Scalar>(
    x: &DTensor<T>,
    to: &[Placement],
    label: &'static str,
) -> Result<DTensor<T>> {
    match on_float!(x, |f| super::redistribute_op(f, to, label, None)) {
        Some(recorded) => recorded,
        None => x.redistribute_scoped(to, label),
    }
}

/// `out`, a redistribution of `x` already run (the op dispatcher plans it once), recorded on
/// the autograd tape for floats; integers carry no gradient and pass unrecorded.
pub(crate) fn recorded_redistribution<T: Scalar>(x: &DTensor<T>, out: DTensor<T>) -> DTensor<T> {
    let mut slot = Some(out);
    let recorded: Option<Option<DTensor<T>>> =
        on_float!(x, |f| slot.take().and_then(same_type).map(|o| super::record_redistribution(f, o)));
    match recorded.flatten() {
        Some(r) => r,
        // Integers: no history. (A float always downcasts: `f` is `x`, so `out` is its type.)
        None => slot.take().unwrap_or_else(|| x.detach()),
    }
}

/// `x.requires_grad_(requires_grad)` for floats; for integers `false` is a no-op and `true`
/// an [`Error::Unsupported`] (only floats have gradients).
pub(crate) fn with_requires_grad<T: Scalar>(x: DTensor<T>, requires_grad: bool) -> Result<DTensor<T>> {
    if !requires_grad {
        return Ok(x);
    }
    match on_float!(&x, |f| f.clone().requires_grad_(true)) {
        Some(tracked) => Ok(tracked),
        None => Err(Error::Unsupported {
            op: "requires_grad".into(),
            reason: format!("dtype {} has no gradients (only floating point tensors do)", T::DTYPE),
        }),
    }
}
