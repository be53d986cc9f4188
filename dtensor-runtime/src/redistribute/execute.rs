//! The executor: a plan's steps run on this rank's local shard, each by its [`Transition`].

use super::transition::Transition;
use super::{RedistributePlan, RedistributeStep};
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::placement::fmt_placements;
use crate::storage::Storage;
use std::borrow::Cow;

/// Executes a redistribution plan (made for this rank: see [`plan_redistribute`]) on this
/// rank's local shard: the collectives each step needs and their pack/unpack copies. A pure
/// function of (shard, mesh, plan); the autograd wrapper is [`DTensor::redistribute`].
///
/// [`plan_redistribute`]: super::plan_redistribute
/// [`DTensor::redistribute`]: crate::DTensor::redistribute
pub fn redistribute_local<T: Scalar>(
    local: &Storage<T>,
    mesh: &DeviceMesh,
    plan: &RedistributePlan,
) -> Result<Storage<T>> {
    // The first step reads the caller's shard in place; later steps own their input.
    let mut cur = Cow::Borrowed(local);
    for step in &plan.steps {
        cur = Cow::Owned(execute_step(mesh, cur, step)?);
    }
    Ok(cur.into_owned())
}

/// Runs one step on this rank's local shard.
fn execute_step<T: Scalar>(
    mesh: &DeviceMesh,
    local: Cow<'_, Storage<T>>,
    step: &RedistributeStep,
) -> Result<Storage<T>> {
    let i = step.mesh_dim;
    let Some(t) = Transition::of(step.from, step.to) else {
        return Err(Error::InvalidRedistribute {
            mesh_dim: i,
            from: step.from,
            to: step.to,
            reason: format!("no direct step (placements {})", fmt_placements(&[step.from, step.to])),
        });
    };
    t.on(mesh.size(i)).run(mesh, i, local, &step.logical_shape)
}
