//! Collectives that complete in the background: [`PendingAllReduce`], the handle
//! [`Communicator::all_reduce_start`] returns, and
//! [`OwnedBytes`], the owned buffer (host or device memory) such a collective works on.
//!
//! The buffer is owned by the collective until it completes, so the caller cannot touch (or
//! free) memory a peer or the network still reads or writes; [`PendingAllReduce::wait`] gives
//! it back, reduced.

use super::buf::{Buf, BufInOut, BufMut};
use super::Communicator;
use crate::element::{DType, Scalar};
use crate::error::{Error, Result};
use crate::placement::ReduceOp;
use std::any::Any;
use std::fmt;
use std::sync::mpsc;

/// An owned buffer of plain elements, in host memory or on the rank's device, that a started
/// collective reduces in place.
///
/// Implemented for `Vec<T>` of every [`Scalar`] (host memory) and for a
/// [`Storage`](crate::storage::Storage) (host or device; in `mesh/storage.rs`). A host buffer's heap
/// block does not move while the handle moves, so a backend may hand its address to the
/// network.
pub trait OwnedBytes: Send + 'static {
    /// The elements as host bytes, or `None` when they are not one host block (device memory).
    /// Every call returns the same memory.
    fn host_mut(&mut self) -> Option<&mut [u8]>;
    /// Runs the out-of-place collective `run` from these bytes into a fresh buffer of the same
    /// length in the same memory (host or the same device), which then replaces them: how a
    /// collective on [`Buf`]/[`BufMut`] reduces an owned buffer "in place".
    fn replace_by(&mut self, run: &mut dyn FnMut(Buf<'_>, BufMut<'_>) -> Result<()>) -> Result<()>;
    /// Back to a concrete type (for the typed layer to downcast).
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<T: Scalar + 'static> OwnedBytes for Vec<T> {
    fn host_mut(&mut self) -> Option<&mut [u8]> {
        Some(bytemuck::cast_slice_mut(self.as_mut_slice()))
    }
    fn replace_by(&mut self, run: &mut dyn FnMut(Buf<'_>, BufMut<'_>) -> Result<()>) -> Result<()> {
        let mut out = vec![<T as bytemuck::Zeroable>::zeroed(); self.len()];
        run(Buf::Host(bytemuck::cast_slice(self.as_slice())), bytemuck::cast_slice_mut::<T, u8>(&mut out).into())?;
        *self = out;
        Ok(())
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// The default [`Communicator::all_reduce_start`]: the blocking all-reduce, at once. A host
/// buffer is reduced in place by [`all_reduce`](Communicator::all_reduce); any other (device
/// memory) by [`all_reduce_into`](Communicator::all_reduce_into) into a fresh buffer in the
/// same memory, so backends with a device path (NCCL, `cuda-threads`) reduce it on the device
/// and the others stage it through the host (`buf::staged`).
pub fn reduce_now<C: Communicator + ?Sized>(
    c: &C,
    group: &[usize],
    buf: &mut dyn OwnedBytes,
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    match buf.host_mut() {
        Some(bytes) => c.all_reduce(group, BufInOut::Host(bytes), dtype, op),
        None => buf.replace_by(&mut |send, recv| c.all_reduce_into(group, send, recv, dtype, op)),
    }
}

/// [`reduce_now`] as a started collective that already completed.
pub fn run_now<C: Communicator + ?Sized>(
    c: &C,
    group: &[usize],
    mut buf: Box<dyn OwnedBytes>,
    dtype: DType,
    op: ReduceOp,
) -> Result<PendingAllReduce> {
    reduce_now(c, group, buf.as_mut(), dtype, op)?;
    Ok(PendingAllReduce::done(Ok(buf)))
}

/// One all-gather of a batch started by [`Communicator::all_gather_v_start`]: this member's
/// `send` bytes (`counts[me]` of them), every member's `counts`, and `recv` (`Σ counts`
/// bytes) to receive them, back to back in group order. Host buffers.
pub struct Gather {
    /// This member's bytes.
    pub send: Box<dyn OwnedBytes>,
    /// Bytes per member.
    pub counts: Vec<usize>,
    /// Every member's bytes, filled when the batch completes.
    pub recv: Box<dyn OwnedBytes>,
}

/// What a started batch of all-gathers hands back: each [`Gather::recv`], filled, in order.
pub struct GatherBatch(pub Vec<Box<dyn OwnedBytes>>);

impl OwnedBytes for GatherBatch {
    fn host_mut(&mut self) -> Option<&mut [u8]> {
        None
    }
    fn replace_by(&mut self, _run: &mut dyn FnMut(Buf<'_>, BufMut<'_>) -> Result<()>) -> Result<()> {
        Err(Error::Backend { backend: "pending".into(), message: "a batch of all-gathers is not one buffer".into() })
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// The default [`Communicator::all_gather_v_start`]: each blocking
/// [`all_gather_v`](Communicator::all_gather_v) of the batch, at once.
pub fn gather_now<C: Communicator + ?Sized>(c: &C, group: &[usize], gathers: Vec<Gather>) -> Result<PendingAllReduce> {
    Ok(PendingAllReduce::done(run_gathers(c, group, gathers)))
}

/// Runs a batch of all-gathers in order; the filled receive buffers.
pub(crate) fn run_gathers<C: Communicator + ?Sized>(
    c: &C,
    group: &[usize],
    gathers: Vec<Gather>,
) -> Result<Box<dyn OwnedBytes>> {
    let mut out = Vec::with_capacity(gathers.len());
    for Gather { mut send, counts, mut recv } in gathers {
        let (Some(s), Some(r)) = (send.host_mut(), recv.host_mut()) else {
            return Err(Error::Backend {
                backend: c.backend().into(),
                message: "a started all-gather takes host buffers only".into(),
            });
        };
        c.all_gather_v(group, Buf::Host(s), &counts, r.into())?;
        drop(send); // on the thread that ran it (a lazily made copy is freed where it was made)
        out.push(recv);
    }
    Ok(Box::new(GatherBatch(out)))
}

/// How a backend completes a started collective.
pub trait Completion: Send {
    /// Blocks until the collective completed on this rank; the reduced buffer, or why it failed.
    fn wait(self: Box<Self>) -> Result<Box<dyn OwnedBytes>>;
}

/// A started all-reduce (see
/// [`Communicator::all_reduce_start`]).
///
/// Dropping it without [`wait`](Self::wait) is memory-safe (the collective owns the buffer; a
/// backend whose transfer still uses it, MPI, waits for it in its own `Drop`), but the result
/// is lost, and on the thread backend the worker may still be in the collective: a blocking
/// collective of this rank on the same group right after could then meet its peers' started
/// one. [`DeviceMesh::all_reduce_start`](crate::DeviceMesh::all_reduce_start)'s handle orders
/// that for you.
pub struct PendingAllReduce {
    inner: Inner,
}

enum Inner {
    Done(Result<Box<dyn OwnedBytes>>),
    Running(Box<dyn Completion>),
}

impl PendingAllReduce {
    /// A collective that already completed (backends without background progress run it
    /// at once).
    pub fn done(result: Result<Box<dyn OwnedBytes>>) -> Self {
        PendingAllReduce { inner: Inner::Done(result) }
    }

    /// A collective that completes when `completion` says.
    pub fn running(completion: Box<dyn Completion>) -> Self {
        PendingAllReduce { inner: Inner::Running(completion) }
    }

    /// A collective a worker thread runs: its result arrives on `rx`. A worker that dies
    /// before it answers (it panicked) is an [`Error::Backend`] of `backend`.
    pub fn from_channel(backend: &'static str, rx: mpsc::Receiver<Result<Box<dyn OwnedBytes>>>) -> Self {
        PendingAllReduce::running(Box::new(Channel { backend, rx }))
    }

    /// Blocks until the all-reduce completed; returns the reduced buffer.
    pub fn wait(self) -> Result<Box<dyn OwnedBytes>> {
        match self.inner {
            Inner::Done(r) => r,
            Inner::Running(c) => c.wait(),
        }
    }
}

impl fmt::Debug for PendingAllReduce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.inner {
            Inner::Done(_) => "PendingAllReduce(done)",
            Inner::Running(_) => "PendingAllReduce(running)",
        })
    }
}

struct Channel {
    backend: &'static str,
    rx: mpsc::Receiver<Result<Box<dyn OwnedBytes>>>,
}

impl Completion for Channel {
    fn wait(self: Box<Self>) -> Result<Box<dyn OwnedBytes>> {
        self.rx.recv().unwrap_or_else(|_| {
            Err(Error::Backend {
                backend: self.backend.into(),
                message: "the background collective thread stopped before it answered (it panicked)".into(),
            })
        })
    }
}
