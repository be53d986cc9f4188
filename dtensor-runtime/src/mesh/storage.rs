//! Collectives on [`Storage`]: what redistribution and `from_local` call with local shards.
//!
//! One path for host and device storage: a shard is handed to the communicator's collectives
//! as a [`Buf`] (host bytes, borrowed when row-major, or device bytes), and the output is a
//! fresh flat storage on the input's device that the collective writes through a [`BufMut`]
//! (host memory is not zero-filled first) or, for all-reduce and broadcast, the shard itself
//! through a [`BufInOut`]. NCCL and `cuda-threads` run device buffers on the device, the other
//! backends stage them through the host. Results are flat (`[n]`) storages on the input's
//! device; callers reshape or unpack them with a pack plan.

use crate::comm::debug::CollectiveKind;
use crate::comm::{filled, Buf, BufInOut, BufMut, OwnedBytes, PendingGather, PendingReduce};
use crate::element::Scalar;
use crate::error::Result;
use crate::mesh::Along;
use crate::mesh::DeviceMesh;
use crate::placement::ReduceOp;
use crate::storage::Storage;
use std::any::Any;
use std::sync::Arc;

/// `send`'s elements as a collective's input: host bytes (borrowed when row-major) or the
/// device bytes of a device shard.
fn with_send<T: Scalar, R>(send: &Storage<T>, run: impl FnOnce(Buf<'_>) -> Result<R>) -> Result<R> {
    #[cfg(feature = "cuda")]
    if let Storage::Cuda(c) = send {
        return run(Buf::of_cuda(c));
    }
    let data = send.host_data()?;
    run(Buf::Host(bytemuck::cast_slice(&data)))
}

/// A fresh storage of `shape` on `like`'s device, every element of which `fill` writes
/// through a [`BufMut`] (host memory is not zero-filled first).
fn fresh<T: Scalar>(
    like: &Storage<T>,
    context: &str,
    shape: &[usize],
    fill: impl FnOnce(BufMut<'_>) -> Result<()>,
) -> Result<Storage<T>> {
    #[cfg(feature = "cuda")]
    if let Storage::Cuda(c) = like {
        let mut out = crate::storage::CudaStorage::<T>::zeros(c.device(), shape)?;
        fill(BufMut::of_cuda(&mut out)?)?;
        return Ok(Storage::Cuda(out));
    }
    // SAFETY (of `filled`): a `Communicator` writes all of its receive buffer on `Ok`.
    let out = unsafe { filled::<T>(context, shape.iter().product(), |r| fill(r.into())) }?;
    like.with_host_data(shape, out)
}

/// `buf` overwritten in place by `run` (through a [`BufInOut`] of its own memory: a device
/// shard's bytes, copied first when shared; a host shard's one row-major block, or a row-major
/// copy of it).
fn in_place<T: Scalar>(mut buf: Storage<T>, run: impl FnOnce(BufInOut<'_>) -> Result<()>) -> Result<Storage<T>> {
    #[cfg(feature = "cuda")]
    if let Storage::Cuda(c) = &mut buf {
        run(BufInOut::of_cuda(c)?)?;
        return Ok(buf);
    }
    if let Some(data) = buf.host_data_mut() {
        run(BufInOut::Host(bytemuck::cast_slice_mut(data)))?;
        return Ok(buf);
    }
    let mut v = buf.host_data()?.into_owned();
    run(BufInOut::Host(bytemuck::cast_slice_mut(&mut v)))?;
    buf.with_host_data(buf.shape(), v)
}

/// [`all_gather`](DeviceMesh::all_gather) of a shard: every member's data, in group order.
pub(crate) fn all_gather<T: Scalar>(mesh: &DeviceMesh, along: Along, send: &Storage<T>) -> Result<Storage<T>> {
    let (l, bytes) = (send.len(), send.len() * std::mem::size_of::<T>());
    with_send(send, |s| {
        mesh.collective(CollectiveKind::AllGather, along, Some(T::DTYPE), l, None, None, bytes, |c, g| {
            fresh(send, "all_gather", &[l * g.len()], |r| c.all_gather(g, s, r))
        })
    })
}

/// [`all_reduce`](DeviceMesh::all_reduce) of a shard, in place.
pub(crate) fn all_reduce<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    buf: Storage<T>,
    op: ReduceOp,
) -> Result<Storage<T>> {
    let (l, bytes) = (buf.len(), buf.len() * std::mem::size_of::<T>());
    mesh.collective(CollectiveKind::AllReduce, along, Some(T::DTYPE), l, None, Some(op), bytes, |c, g| {
        in_place(buf, |b| c.all_reduce(g, b, T::DTYPE, op))
    })
}

/// [`all_reduce_into`](DeviceMesh::all_reduce_into) of a shard: the reduction in a fresh
/// storage of the same shape (the input is read, not copied).
pub(crate) fn all_reduce_into<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    send: &Storage<T>,
    op: ReduceOp,
) -> Result<Storage<T>> {
    let (l, bytes) = (send.len(), send.len() * std::mem::size_of::<T>());
    with_send(send, |s| {
        mesh.collective(CollectiveKind::AllReduce, along, Some(T::DTYPE), l, None, Some(op), bytes, |c, g| {
            fresh(send, "all_reduce", send.shape(), |r| c.all_reduce_into(g, s, r, T::DTYPE, op))
        })
    })
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
        run(Buf::Host(bytemuck::cast_slice(&send)), bytemuck::cast_slice_mut::<T, u8>(&mut out).into())?;
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
    let (l, bytes) = (send.len(), send.len() * std::mem::size_of::<T>());
    with_send(send, |s| {
        mesh.collective(CollectiveKind::ReduceScatter, along, Some(T::DTYPE), l, None, Some(op), bytes, |c, g| {
            fresh(send, "reduce_scatter", &[l / g.len().max(1)], |r| c.reduce_scatter(g, s, r, T::DTYPE, op))
        })
    })
}

/// [`all_to_all`](DeviceMesh::all_to_all) of `n` equal blocks.
pub(crate) fn all_to_all<T: Scalar>(mesh: &DeviceMesh, along: Along, send: &Storage<T>) -> Result<Storage<T>> {
    let (l, bytes) = (send.len(), send.len() * std::mem::size_of::<T>());
    with_send(send, |s| {
        mesh.collective(CollectiveKind::AllToAll, along, Some(T::DTYPE), l, None, None, bytes, |c, g| {
            fresh(send, "all_to_all", &[l], |r| c.all_to_all(g, s, r))
        })
    })
}

/// [`broadcast`](DeviceMesh::broadcast) of a shard from group member `root`, in place.
pub(crate) fn broadcast<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    buf: Storage<T>,
    root: usize,
) -> Result<Storage<T>> {
    let (l, bytes) = (buf.len(), buf.len() * std::mem::size_of::<T>());
    mesh.collective(CollectiveKind::Broadcast, along, Some(T::DTYPE), l, Some(root), None, bytes, |c, g| {
        in_place(buf, |b| c.broadcast(g, b, root))
    })
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

/// A shard as the send buffer of a started collective: shared, not copied on the caller's
/// thread; the row-major copy the communicator reads is made when it first asks, on the
/// thread that runs the collective (the rank's worker on the thread backend), which also
/// frees it.
struct SharedSend<T: Scalar> {
    shard: Arc<Storage<T>>,
    copy: Option<Vec<T>>,
}

impl<T: Scalar> OwnedBytes for SharedSend<T> {
    fn host_mut(&mut self) -> Option<&mut [u8]> {
        if self.copy.is_none() {
            self.copy = Some(self.shard.host_data().ok()?.into_owned());
        }
        self.copy.as_mut().map(|v| bytemuck::cast_slice_mut(v.as_mut_slice()))
    }
    fn replace_by(&mut self, _run: &mut dyn FnMut(Buf<'_>, BufMut<'_>) -> Result<()>) -> Result<()> {
        Err(crate::error::Error::Backend {
            backend: "storage".into(),
            message: "a shared send buffer is read, never replaced".into(),
        })
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// A batch of started all-gathers of shards ([`DeviceMesh::all_gather_v_start`], one job): for
/// each `(shard, counts)` (host or device: its elements are read as host bytes), member `i`'s
/// `counts[i]` elements, back to back in group order, when the returned handle is waited for.
pub(crate) fn all_gather_v_start<T: Scalar>(
    mesh: &DeviceMesh,
    along: Along,
    shards: Vec<(Arc<Storage<T>>, Vec<usize>)>,
) -> Result<PendingGather<T>> {
    let items = shards
        .into_iter()
        .map(|(shard, counts)| {
            let bytes = shard.len() * std::mem::size_of::<T>();
            let send: Box<dyn OwnedBytes> = Box::new(SharedSend { shard, copy: None });
            (send, bytes, counts)
        })
        .collect();
    mesh.all_gather_v_start_batch::<T>(along, items)
}
