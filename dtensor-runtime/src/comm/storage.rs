//! Collectives on [`Storage`]: what redistribution and `from_local` call with local shards.
//!
//! The [`Communicator`](super::Communicator) trait moves host bytes, so host storage goes
//! through the mesh's typed collectives directly (borrowed when row-major) and device
//! storage is staged through the host: copied out, reduced or exchanged, copied back to the
//! same device. Results are flat (`[n]`) storages on the input's device; callers reshape or
//! unpack them with a pack plan.

use crate::element::Scalar;
use crate::error::Result;
use crate::mesh::Along;
use crate::mesh::DeviceMesh;
use crate::placement::ReduceOp;
use crate::storage::Storage;

/// [`all_gather`](DeviceMesh::all_gather) of a shard: every member's data, in group order.
pub(crate) fn all_gather<T: Scalar>(mesh: &DeviceMesh, along: Along, send: &Storage<T>) -> Result<Storage<T>> {
    let out = mesh.all_gather(along, &send.host_data()?)?;
    send.with_host_data(&[out.len()], out)
}

/// [`all_reduce`](DeviceMesh::all_reduce) of a shard, in place on host storage.
pub(crate) fn all_reduce<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    mut buf: Storage<T>,
    op: ReduceOp,
) -> Result<Storage<T>> {
    if let Some(data) = buf.host_data_mut() {
        mesh.all_reduce(along, data, op)?;
        return Ok(buf);
    }
    let mut v = buf.host_data()?.into_owned();
    mesh.all_reduce(along, &mut v, op)?;
    buf.with_host_data(buf.shape(), v)
}

/// [`all_reduce_into`](DeviceMesh::all_reduce_into) of a shard: the reduction in a fresh
/// storage of the same shape (the input is read, not copied).
pub(crate) fn all_reduce_into<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    send: &Storage<T>,
    op: ReduceOp,
) -> Result<Storage<T>> {
    let out = mesh.all_reduce_into(along, &send.host_data()?, op)?;
    send.with_host_data(send.shape(), out)
}

/// [`reduce_scatter`](DeviceMesh::reduce_scatter) of `n` equal blocks: this member's block.
pub(crate) fn reduce_scatter<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    send: &Storage<T>,
    op: ReduceOp,
) -> Result<Storage<T>> {
    let out = mesh.reduce_scatter(along, &send.host_data()?, op)?;
    send.with_host_data(&[out.len()], out)
}

/// [`all_to_all`](DeviceMesh::all_to_all) of `n` equal blocks.
pub(crate) fn all_to_all<T: Scalar>(mesh: &DeviceMesh, along: Along, send: &Storage<T>) -> Result<Storage<T>> {
    let out = mesh.all_to_all(along, &send.host_data()?)?;
    send.with_host_data(&[out.len()], out)
}

/// [`broadcast`](DeviceMesh::broadcast) of a shard from group member `root`, in place on
/// host storage.
pub(crate) fn broadcast<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    mut buf: Storage<T>,
    root: usize,
) -> Result<Storage<T>> {
    if let Some(data) = buf.host_data_mut() {
        mesh.broadcast(along, data, root)?;
        return Ok(buf);
    }
    let mut v = buf.host_data()?.into_owned();
    mesh.broadcast(along, &mut v, root)?;
    buf.with_host_data(buf.shape(), v)
}

/// [`all_to_all_strided`](DeviceMesh::all_to_all_strided) of a shard viewed as `rows`
/// rows of `n` runs of `run` elements.
pub(crate) fn all_to_all_strided<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    send: &Storage<T>,
    rows: usize,
    run: usize,
) -> Result<Storage<T>> {
    let out = mesh.all_to_all_strided(along, &send.host_data()?, rows, run)?;
    send.with_host_data(&[out.len()], out)
}
