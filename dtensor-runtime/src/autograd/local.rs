//! Local tensors in autograd: `to_local_grad` / `from_local_grad` / `full_tensor_grad`.
//!
//! A *local tensor* (PyTorch's plain `torch.Tensor`) is a DTensor on [`local_mesh`]: a
//! one-rank mesh of this rank alone, whose collectives are copies. Ops on it are purely
//! local and are recorded like any other op, so gradients flow between a DTensor and its
//! local shard. Mixing a local tensor with a DTensor of a real mesh is a `MeshMismatch`,
//! as mixing `torch.Tensor` and `DTensor` is an error in PyTorch.

use super::{record, redistribute_grad};
use crate::comm::self_comm::SelfComm;
use crate::device::Target;
use crate::dtensor::{from_local, DTensor, FromLocal};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::mesh::DeviceMesh;
use crate::op::UnaryOp;
use crate::placement::{fmt_placements, normalize_placements, without_partials, Placement, ReduceOp};
use crate::storage::Storage;
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    /// This thread's local meshes, one per device target (a handful at most).
    static LOCAL_MESHES: RefCell<Vec<DeviceMesh>> = const { RefCell::new(Vec::new()) };
}

/// The one-rank host mesh local tensors live on (one per thread, dimension name `local`).
pub fn local_mesh() -> DeviceMesh {
    local_mesh_on(Target::Cpu)
}

/// The one-rank mesh of local tensors whose data lives on `target` (one per thread and target).
fn local_mesh_on(target: Target) -> DeviceMesh {
    let same = |m: &DeviceMesh, t: &Target| match (m.target(), t) {
        (Target::Cpu, Target::Cpu) => true,
        (Target::Cuda(a), Target::Cuda(b)) => Arc::ptr_eq(a, b),
        _ => false,
    };
    LOCAL_MESHES.with(|ms| {
        let mut ms = ms.borrow_mut();
        if let Some(m) = ms.iter().find(|m| same(m, &target)) {
            return m.clone();
        }
        let m = DeviceMesh::new(Arc::new(SelfComm::new(target)), &[1], &["local"])
            .expect("a 1-rank mesh over a 1-rank world with its device handle");
        ms.push(m.clone());
        m
    })
}

/// The gradient layouts a value may declare for its local shard, on one mesh dim (the
/// dynamic twin of the typed `LocalGradRule` in `typed/grad.rs`, for `local_map`): a
/// `Shard(d)` value's gradient is `Shard(d)`; a `Partial(Sum)` or `Partial(Avg)` value's is the
/// whole gradient, `Replicate`; a `Replicate` value's is `Replicate` when every rank uses its
/// copy the same way, `Partial(Sum)` when ranks use it differently.
pub(crate) fn local_grad_allowed(value: Placement, grad: Placement) -> bool {
    use Placement::{Partial, Replicate, Shard};
    match (value, grad) {
        (Shard(a), Shard(b)) => a == b,
        (Replicate, Replicate) | (Replicate, Partial(ReduceOp::Sum)) => true,
        (Partial(ReduceOp::Sum | ReduceOp::Avg), Replicate) => true,
        _ => false,
    }
}

/// [`local_grad_allowed`] in words, for errors.
pub(crate) const LOCAL_GRAD_RULE: &str = "the gradient of a Shard(d) value is Shard(d); of a Partial(sum) or Partial(avg) value, Replicate; of a Replicate value, Replicate when every rank uses its copy the same way or Partial(sum) when ranks use it differently";

/// Is `mesh` a [`local_mesh`] (the home of plain local tensors)?
pub fn is_local_mesh(mesh: &DeviceMesh) -> bool {
    mesh.comm().backend() == SelfComm::BACKEND
}

fn expect_local<T: Element>(x: &DTensor<T>, context: &str) -> Result<()> {
    if is_local_mesh(&x.mesh) {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            context: context.into(),
            reason: format!("expected a local tensor (see DTensor::local_tensor), got a DTensor on {}", x.mesh),
        })
    }
}

/// Wraps this rank's local tensor as a DTensor on `mesh` with autograd: the gradient of the
/// result flows back into `local` (PyTorch `DTensor.from_local` on a tensor that requires
/// grad). The backward redistributes the incoming gradient to `opts.grad_placements`
/// (default: `placements`, Partial → Replicate) and hands back its local shard, scaled by
/// `1/n` on mesh dims that are Partial(avg) (each local term counts `1/n`). For
/// Partial(max/min) every rank gets the whole gradient, as in PyTorch.
///
/// ```
/// use dtensor_runtime::{run, from_local_grad, DTensor, FromLocal, Shard, ndarray::ArrayD};
/// run(2, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
///     let l = DTensor::local_tensor(ArrayD::<f64>::ones(vec![2, 3])).requires_grad_(true);
///     let x = from_local_grad(&l, &mesh, &[Shard(0)], FromLocal::default())?;
///     x.sum()?.backward()?;
///     assert_eq!(l.grad().unwrap().local().shape(), &[2, 3]);
///     Ok(())
/// }).unwrap();
/// ```
pub fn from_local_grad<T: Element>(
    local: &DTensor<T>,
    mesh: &DeviceMesh,
    placements: &[Placement],
    opts: FromLocal,
) -> Result<DTensor<T>> {
    expect_local(local, "from_local_grad")?;
    let gp = opts.grad_placements.clone();
    let out = from_local(local.to_local(), mesh, placements, opts)?;
    let gp = match gp {
        Some(g) => normalize_placements(&g, out.ndim(), mesh.ndim())?,
        None => out.placements.clone(),
    };
    let target = without_partials(&gp);
    // Each local term of a Partial(avg) counts 1/n in the logical value.
    let avg_scale: f64 = gp
        .iter()
        .enumerate()
        .filter(|(_, p)| **p == Placement::Partial(ReduceOp::Avg))
        .map(|(i, _)| 1.0 / mesh.size(i) as f64)
        .product();
    Ok(record("from_local_backward", out, &[local], move |g| {
        let g = redistribute_grad(g, &target, None, "from_local_backward")?;
        let l = if avg_scale != 1.0 { g.local.unary(UnaryOp::MulScalar(avg_scale))? } else { g.into_local() };
        Ok(vec![Some(DTensor::local_tensor(l))])
    }))
}

impl<T: Element> DTensor<T> {
    /// A plain local tensor (this rank only, on [`local_mesh`]), e.g. module parameters
    /// before `distribute_module`, or the input of [`from_local_grad`]. It stays on the device
    /// of its data (a host array: the host).
    pub fn local_tensor(data: impl Into<Storage<T>>) -> DTensor<T> {
        let data = data.into();
        let shape = data.shape().to_vec();
        let mesh = local_mesh_on(data.target());
        DTensor::new_unchecked(data, mesh, vec![Placement::Replicate], shape, None)
    }

    /// Is this a plain local tensor (see [`DTensor::local_tensor`])?
    pub fn is_local_tensor(&self) -> bool {
        is_local_mesh(&self.mesh)
    }

    /// The local shard as a local tensor with autograd (PyTorch `to_local(grad_placements=..)`).
    /// The gradient of the result is taken as the local shard of a DTensor laid out as
    /// `grad_placements` (default: this tensor's placements).
    pub fn to_local_grad(&self, grad_placements: Option<&[Placement]>) -> Result<DTensor<T>> {
        self.to_local_grad_named(grad_placements, "to_local_backward", "to_local backward".into())
    }

    /// [`DTensor::to_local_grad`] recorded on the tape as `tape`; a local gradient of the wrong
    /// shape is an error naming `context` (the caller: `local_map` names the user's function
    /// and the input).
    pub(crate) fn to_local_grad_named(
        &self,
        grad_placements: Option<&[Placement]>,
        tape: &'static str,
        context: String,
    ) -> Result<DTensor<T>> {
        let gp = match grad_placements {
            Some(g) => normalize_placements(g, self.ndim(), self.mesh.ndim())?,
            None => self.placements.clone(),
        };
        let out = DTensor::local_tensor(self.to_local());
        let (mesh, shape) = (self.mesh.clone(), self.shape.clone());
        Ok(record(tape, out, &[self], move |g| {
            let (expected, _) = local_shape_and_offset(&shape, mesh.shape(), mesh.coordinate(), &gp);
            if g.local.shape() != expected.as_slice() {
                return Err(Error::ShapeMismatch {
                    context: format!("{context}: local gradient for grad_placements {}", fmt_placements(&gp)),
                    expected,
                    actual: g.local.shape().to_vec(),
                });
            }
            Ok(vec![Some(DTensor::new_unchecked(g.local.clone(), mesh.clone(), gp.clone(), shape.clone(), None))])
        }))
    }

    /// The global tensor as a local tensor with autograd (PyTorch `full_tensor(grad_placements=..)`):
    /// redistribute to Replicate, then [`DTensor::to_local_grad`].
    pub fn full_tensor_grad(&self, grad_placements: Option<&[Placement]>) -> Result<DTensor<T>> {
        let r = vec![Placement::Replicate; self.mesh.ndim()];
        if let Some(g) = grad_placements {
            normalize_placements(g, self.ndim(), self.mesh.ndim())?;
        }
        self.redistribute(&r)?.to_local_grad(grad_placements)
    }
}
