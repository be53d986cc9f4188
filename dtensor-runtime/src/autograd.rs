//! Autograd bookkeeping attached to every DTensor.
//!
//! (Filled in by the ops/autograd work; the runtime core only needs these hooks.)

use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::Result;
use crate::placement::Placement;

/// Per-tensor autograd state.
#[derive(Clone)]
#[allow(dead_code)] // read once the autograd engine lands
pub struct AutogradMeta<T: Element> {
    _marker: std::marker::PhantomData<T>,
}

impl<T: Element> Default for AutogradMeta<T> {
    fn default() -> Self {
        AutogradMeta { _marker: std::marker::PhantomData }
    }
}

/// Called by `from_local` with the user's `grad_placements`.
pub(crate) fn on_from_local<T: Element>(_dt: &mut DTensor<T>, _grad_placements: Option<Vec<Placement>>) -> Result<()> {
    Ok(())
}

/// `redistribute` with its backward recorded.
pub(crate) fn redistribute_with_grad<T: Element>(x: &DTensor<T>, to: &[Placement]) -> Result<DTensor<T>> {
    x.redistribute_raw(to)
}

/// Sets `requires_grad` on a freshly built tensor.
pub(crate) fn set_requires_grad<T: Element>(dt: DTensor<T>, _requires_grad: bool) -> Result<DTensor<T>> {
    Ok(dt)
}
