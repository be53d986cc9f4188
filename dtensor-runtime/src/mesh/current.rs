//! This thread's current mesh (PyTorch's "current mesh"): the one factories use when none is
//! given, and the rank that `#[distribute]` scopes on this thread belong to.

use super::DeviceMesh;
use std::cell::RefCell;

thread_local! {
    static CURRENT_MESH: RefCell<Option<DeviceMesh>> = const { RefCell::new(None) };
}

/// Sets the mesh that factories use when none is given (PyTorch's "current mesh").
pub fn set_current_mesh(mesh: Option<DeviceMesh>) {
    CURRENT_MESH.with(|m| *m.borrow_mut() = mesh);
}

/// The mesh set by the latest [`RankCtx::init_device_mesh`](crate::RankCtx::init_device_mesh)
/// (or [`set_current_mesh`]) on this rank.
pub fn current_mesh() -> Option<DeviceMesh> {
    CURRENT_MESH.with(|m| m.borrow().clone())
}

/// `f` of the current mesh, without cloning it.
pub(crate) fn with_current_mesh<R>(f: impl FnOnce(Option<&DeviceMesh>) -> R) -> R {
    CURRENT_MESH.with(|m| f(m.borrow().as_ref()))
}
