//! Collectives on [`Storage`]: what redistribution and `from_local` call with local shards.
//!
//! Host storage goes through the mesh's typed collectives directly (borrowed when row-major).
//! Device storage goes through the `*_buf` collectives of the communicator on device buffers
//! (module `device`): NCCL and `cuda-threads` run on them directly, the other backends stage
//! them through the host. Results are flat (`[n]`) storages on the input's device; callers reshape or unpack
//! them with a pack plan.

use crate::comm::{Buf, BufMut, OwnedBytes, PendingReduce};
use crate::element::Scalar;
use crate::error::Result;
use crate::mesh::Along;
use crate::mesh::DeviceMesh;
use crate::placement::ReduceOp;
use crate::storage::Storage;
use std::any::Any;

/// [`all_gather`](DeviceMesh::all_gather) of a shard: every member's data, in group order.
pub(crate) fn all_gather<T: Scalar>(mesh: &DeviceMesh, along: Along, send: &Storage<T>) -> Result<Storage<T>> {
    #[cfg(feature = "cuda")]
    if let Storage::Cuda(c) = send {
        return device::all_gather(mesh, along, c);
    }
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
    #[cfg(feature = "cuda")]
    if let Storage::Cuda(c) = &buf {
        return device::all_reduce_into(mesh, along, c, op);
    }
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
    #[cfg(feature = "cuda")]
    if let Storage::Cuda(c) = send {
        return device::all_reduce_into(mesh, along, c, op);
    }
    let out = mesh.all_reduce_into(along, &send.host_data()?, op)?;
    send.with_host_data(send.shape(), out)
}

/// [`all_reduce_start`](DeviceMesh::all_reduce_start) of a shard, on its own memory: a device
/// shard is reduced on the device by backends with a device path (NCCL, `cuda-threads`),
/// never copied to the host here. `detail` joins the fingerprint (what a gradient bucket
/// holds); [`PendingReduce::wait`] returns the reduced shard.
pub(crate) fn all_reduce_start<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    buf: Storage<T>,
    op: ReduceOp,
    detail: u64,
) -> Result<PendingReduce<T, Storage<T>>> {
    let (count, bytes) = (buf.len(), buf.len() * std::mem::size_of::<T>());
    mesh.all_reduce_start_of::<T, Storage<T>>(along, Box::new(buf), count, bytes, op, detail)
}

/// A shard as the owned buffer of a started collective: host storage by its one row-major
/// block (its heap block stays put while the box moves), device storage by its device bytes.
impl<T: Scalar + 'static> OwnedBytes for Storage<T> {
    fn host_mut(&mut self) -> Option<&mut [u8]> {
        self.host_data_mut().map(|d| bytemuck::cast_slice_mut(d))
    }

    fn replace_by(&mut self, run: &mut dyn FnMut(Buf<'_>, BufMut<'_>) -> Result<()>) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Storage::Cuda(c) = self {
            let mut out = crate::storage::CudaStorage::<T>::zeros(c.device(), c.shape())?;
            run(Buf::of_cuda(c), BufMut::of_cuda(&mut out)?)?;
            *c = out;
            return Ok(());
        }
        let send = self.host_data()?.into_owned();
        let mut out = send.clone();
        run(Buf::Host(bytemuck::cast_slice(&send)), BufMut::Host(bytemuck::cast_slice_mut(&mut out)))?;
        *self = self.with_host_data(self.shape(), out)?;
        Ok(())
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// [`reduce_scatter`](DeviceMesh::reduce_scatter) of `n` equal blocks: this member's block.
pub(crate) fn reduce_scatter<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    send: &Storage<T>,
    op: ReduceOp,
) -> Result<Storage<T>> {
    #[cfg(feature = "cuda")]
    if let Storage::Cuda(c) = send {
        return device::reduce_scatter(mesh, along, c, op);
    }
    let out = mesh.reduce_scatter(along, &send.host_data()?, op)?;
    send.with_host_data(&[out.len()], out)
}

/// [`all_to_all`](DeviceMesh::all_to_all) of `n` equal blocks.
pub(crate) fn all_to_all<T: Scalar>(mesh: &DeviceMesh, along: Along, send: &Storage<T>) -> Result<Storage<T>> {
    #[cfg(feature = "cuda")]
    if let Storage::Cuda(c) = send {
        return device::all_to_all(mesh, along, c);
    }
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
    #[cfg(feature = "cuda")]
    if let Storage::Cuda(c) = &buf {
        return device::broadcast(mesh, along, c, root);
    }
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

// The variable-size collectives (uneven shards) take host storage only: device shards are
// padded to equal blocks on the device instead, so that the collectives move device buffers.

/// [`all_gather_v`](DeviceMesh::all_gather_v) of a host shard: member `i`'s `counts[i]`
/// elements, back to back in group order.
pub(crate) fn all_gather_v<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    send: &Storage<T>,
    counts: &[usize],
) -> Result<Storage<T>> {
    let out = mesh.all_gather_v(along, &send.host_data()?, counts)?;
    send.with_host_data(&[out.len()], out)
}

/// [`reduce_scatter_v`](DeviceMesh::reduce_scatter_v) of a host shard holding one block per
/// member, back to back: this member's reduced block.
pub(crate) fn reduce_scatter_v<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    send: &Storage<T>,
    counts: &[usize],
    op: ReduceOp,
) -> Result<Storage<T>> {
    let out = mesh.reduce_scatter_v(along, &send.host_data()?, counts, op)?;
    send.with_host_data(&[out.len()], out)
}

/// [`all_to_all_v`](DeviceMesh::all_to_all_v) of a host shard viewed as `rows` rows of one
/// run per member.
pub(crate) fn all_to_all_v<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    send: &Storage<T>,
    rows: usize,
    runs: &[usize],
    recv_counts: &[usize],
) -> Result<Storage<T>> {
    let out = mesh.all_to_all_v(along, &send.host_data()?, rows, runs, recv_counts)?;
    send.with_host_data(&[out.len()], out)
}

/// The device path: flat device outputs written by the communicator's `*_buf` collectives.
#[cfg(feature = "cuda")]
mod device {
    use crate::comm::debug::CollectiveKind;
    use crate::comm::{Buf, BufMut, Communicator};
    use crate::element::Scalar;
    use crate::error::Result;
    use crate::mesh::{Along, DeviceMesh};
    use crate::placement::ReduceOp;
    use crate::storage::{CudaStorage, Storage};

    fn len<T: Scalar>(c: &CudaStorage<T>) -> usize {
        c.shape().iter().product()
    }

    /// Collective `kind` of `c`'s elements (recorded and fingerprinted by
    /// [`DeviceMesh::run_buf`], with its `root` and `op`) into a fresh flat device shard of `n`
    /// elements, all of which `call` writes: it runs the communicator's `*_buf` method on the
    /// group, `c` the send buffer.
    #[allow(clippy::too_many_arguments)]
    fn collective<T: Scalar>(
        mesh: &DeviceMesh,
        along: Along,
        c: &CudaStorage<T>,
        kind: CollectiveKind,
        root: Option<usize>,
        op: Option<ReduceOp>,
        n: usize,
        call: impl FnOnce(&dyn Communicator, &[usize], Buf<'_>, BufMut<'_>) -> Result<()>,
    ) -> Result<Storage<T>> {
        let mut out = CudaStorage::<T>::zeros(c.device(), &[n])?;
        let recv = BufMut::of_cuda(&mut out)?;
        let l = len(c);
        let bytes = l * std::mem::size_of::<T>();
        mesh.run_buf(kind, along, T::DTYPE, l, root, op, bytes, |comm, g| call(comm, g, Buf::of_cuda(c), recv))?;
        Ok(Storage::Cuda(out))
    }

    pub(super) fn all_gather<T: Scalar>(mesh: &DeviceMesh, along: Along, c: &CudaStorage<T>) -> Result<Storage<T>> {
        let n = len(c) * mesh.group_len(along)?;
        collective(mesh, along, c, CollectiveKind::AllGather, None, None, n, |comm, g, send, recv| {
            comm.all_gather_buf(g, send, recv)
        })
    }

    pub(super) fn all_reduce_into<T: Scalar>(
        mesh: &DeviceMesh,
        along: Along,
        c: &CudaStorage<T>,
        op: ReduceOp,
    ) -> Result<Storage<T>> {
        let out =
            collective(mesh, along, c, CollectiveKind::AllReduce, None, Some(op), len(c), |comm, g, send, recv| {
                comm.all_reduce_buf(g, send, recv, T::DTYPE, op)
            })?;
        out.reshape(c.shape())
    }

    pub(super) fn reduce_scatter<T: Scalar>(
        mesh: &DeviceMesh,
        along: Along,
        c: &CudaStorage<T>,
        op: ReduceOp,
    ) -> Result<Storage<T>> {
        let n = len(c) / mesh.group_len(along)?.max(1);
        collective(mesh, along, c, CollectiveKind::ReduceScatter, None, Some(op), n, |comm, g, send, recv| {
            comm.reduce_scatter_buf(g, send, recv, T::DTYPE, op)
        })
    }

    pub(super) fn all_to_all<T: Scalar>(mesh: &DeviceMesh, along: Along, c: &CudaStorage<T>) -> Result<Storage<T>> {
        collective(mesh, along, c, CollectiveKind::AllToAll, None, None, len(c), |comm, g, send, recv| {
            comm.all_to_all_buf(g, send, recv)
        })
    }

    pub(super) fn broadcast<T: Scalar>(
        mesh: &DeviceMesh,
        along: Along,
        c: &CudaStorage<T>,
        root: usize,
    ) -> Result<Storage<T>> {
        let out =
            collective(mesh, along, c, CollectiveKind::Broadcast, Some(root), None, len(c), |comm, g, send, recv| {
                comm.broadcast_buf(g, send, recv, root)
            })?;
        out.reshape(c.shape())
    }
}
