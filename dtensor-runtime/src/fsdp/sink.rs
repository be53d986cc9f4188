//! Gradient sinks: where a nested backward (the recomputation of a resharding unit, a
//! mixed-precision unit's own graph) leaves the gradients of its inputs, for the outer node
//! to hand on in its own dtype and with its own reduction.

use crate::autograd::record;
use crate::dtensor::DTensor;
use crate::element::Element;
use std::sync::{Arc, Mutex};

/// Where a sink leaves its gradient.
pub(super) type Sink<T> = Option<Arc<Mutex<Option<DTensor<T>>>>>;

/// `t` (no history) as an op output whose backward keeps the gradient it receives and passes
/// nothing on.
pub(super) fn sink<T: Element>(t: &DTensor<T>) -> (DTensor<T>, Sink<T>) {
    let cell: Arc<Mutex<Option<DTensor<T>>>> = Arc::new(Mutex::new(None));
    let keep = Arc::clone(&cell);
    let leaf = t.detach().requires_grad_(true);
    let out = record("fsdp_sink", leaf.detach(), &[&leaf], move |g| {
        let mut c = keep.lock().unwrap_or_else(|e| e.into_inner());
        *c = Some(match c.take() {
            Some(prev) => prev.add(g)?,
            None => g.detach(),
        });
        Ok(vec![None])
    });
    (out, Some(cell))
}

/// Takes what a sink kept (`None`: nothing reached it, or no sink).
pub(super) fn take<T: Element>(s: &Sink<T>) -> Option<DTensor<T>> {
    s.as_ref().and_then(|c| c.lock().unwrap_or_else(|e| e.into_inner()).take())
}
