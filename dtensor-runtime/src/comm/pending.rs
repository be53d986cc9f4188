//! Collectives that complete in the background: [`PendingAllReduce`], the handle
//! [`Communicator::all_reduce_start`](super::Communicator::all_reduce_start) returns, and
//! [`HostBytes`], the owned buffer such a collective works on.
//!
//! The buffer is owned by the collective until it completes, so the caller cannot touch (or
//! free) memory a peer or the network still reads or writes; [`PendingAllReduce::wait`] gives
//! it back, reduced.

use crate::element::Scalar;
use crate::error::{Error, Result};
use std::any::Any;
use std::fmt;
use std::sync::mpsc;

/// An owned host buffer of plain elements that a background collective reduces in place.
///
/// Implemented for `Vec<T>` of every [`Scalar`]; its heap block does not move while the
/// handle moves, so a backend may hand its address to the network.
pub trait HostBytes: Send + 'static {
    /// The elements as bytes.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// Back to a concrete type (for the typed layer to downcast).
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<T: Scalar + 'static> HostBytes for Vec<T> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(self.as_mut_slice())
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// How a backend completes a started collective.
pub trait Completion: Send {
    /// Blocks until the collective completed on this rank; the reduced buffer, or why it failed.
    fn wait(self: Box<Self>) -> Result<Box<dyn HostBytes>>;
}

/// A started all-reduce (see
/// [`Communicator::all_reduce_start`](super::Communicator::all_reduce_start)).
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
    Done(Result<Box<dyn HostBytes>>),
    Running(Box<dyn Completion>),
}

impl PendingAllReduce {
    /// A collective that already completed (backends without background progress run it
    /// at once).
    pub fn done(result: Result<Box<dyn HostBytes>>) -> Self {
        PendingAllReduce { inner: Inner::Done(result) }
    }

    /// A collective that completes when `completion` says.
    pub fn running(completion: Box<dyn Completion>) -> Self {
        PendingAllReduce { inner: Inner::Running(completion) }
    }

    /// A collective a worker thread runs: its result arrives on `rx`. A worker that dies
    /// before it answers (it panicked) is an [`Error::Backend`] of `backend`.
    pub fn from_channel(backend: &'static str, rx: mpsc::Receiver<Result<Box<dyn HostBytes>>>) -> Self {
        PendingAllReduce::running(Box::new(Channel { backend, rx }))
    }

    /// Blocks until the all-reduce completed; returns the reduced buffer.
    pub fn wait(self) -> Result<Box<dyn HostBytes>> {
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
    rx: mpsc::Receiver<Result<Box<dyn HostBytes>>>,
}

impl Completion for Channel {
    fn wait(self: Box<Self>) -> Result<Box<dyn HostBytes>> {
        self.rx.recv().unwrap_or_else(|_| {
            Err(Error::Backend {
                backend: self.backend.into(),
                message: "the background collective thread stopped before it answered (it panicked)".into(),
            })
        })
    }
}
