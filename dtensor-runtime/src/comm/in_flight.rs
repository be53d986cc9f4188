//! The background collectives this thread started and has not waited for yet, and
//! [`PendingReduce`], the typed handle on one.
//!
//! A collective a rank starts in the background must meet its peers' in the same order as
//! the rank's other collectives on that group. So before any collective on a group (every
//! typed collective of [`DeviceMesh`](crate::DeviceMesh) calls [`settle`]), this thread first
//! completes what it started on that group, in start order; the results wait here for their
//! handles. Collectives on other groups run alongside.

use super::pending::{GatherBatch, OwnedBytes, PendingAllReduce};
use crate::element::Scalar;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;

enum State {
    Running(PendingAllReduce),
    Done(Result<Box<dyn OwnedBytes>>),
    Taken,
}

struct Entry {
    group: Vec<usize>,
    state: RefCell<State>,
}

impl Entry {
    fn complete(&self) {
        let mut s = self.state.borrow_mut();
        if let State::Running(_) = &*s {
            let State::Running(p) = std::mem::replace(&mut *s, State::Taken) else { unreachable!("matched above") };
            *s = State::Done(p.wait());
        }
    }
}

thread_local! {
    static IN_FLIGHT: RefCell<Vec<Rc<Entry>>> = const { RefCell::new(Vec::new()) };
}

/// Completes every background collective this thread started on `group`, oldest first
/// (their results wait for their handles). Called before every collective on `group`.
pub(crate) fn settle(group: &[usize]) {
    let mine: Vec<Rc<Entry>> = IN_FLIGHT.with(|f| f.borrow().iter().filter(|e| e.group == group).cloned().collect());
    for e in mine {
        e.complete();
    }
}

/// A started all-reduce of a `Vec<T>` (from
/// [`DeviceMesh::all_reduce_start`](crate::DeviceMesh::all_reduce_start)), or of another owned
/// buffer `B` of elements `T` (the crate's started reductions of a `Storage`).
///
/// Dropping it without [`wait`](Self::wait) waits for the transfer (so that this rank's next
/// collective on the group cannot overtake it) and discards the result.
pub struct PendingReduce<T, B = Vec<T>> {
    entry: Rc<Entry>,
    _elem: PhantomData<(Vec<T>, B)>,
}

impl<T: Scalar, B: 'static> PendingReduce<T, B> {
    /// Registers `pending`, an all-reduce over `group` of a `B` this thread just started.
    pub(crate) fn register(group: &[usize], pending: PendingAllReduce) -> Self {
        let entry = Rc::new(Entry { group: group.to_vec(), state: RefCell::new(State::Running(pending)) });
        IN_FLIGHT.with(|f| f.borrow_mut().push(Rc::clone(&entry)));
        PendingReduce { entry, _elem: PhantomData }
    }

    /// Blocks until the all-reduce completed on this rank; returns the reduced elements.
    pub fn wait(self) -> Result<B> {
        self.entry.complete();
        let state = std::mem::replace(&mut *self.entry.state.borrow_mut(), State::Taken);
        let State::Done(r) = state else {
            return Err(Error::Backend { backend: "in_flight".into(), message: "result taken twice".into() });
        };
        r?.into_any().downcast::<B>().map(|v| *v).map_err(|_| Error::Backend {
            backend: "in_flight".into(),
            message: "a background all-reduce returned a buffer of another type".into(),
        })
    }
}

impl<T, B> Drop for PendingReduce<T, B> {
    fn drop(&mut self) {
        self.entry.complete();
        // `try_with`: a handle dropped while the thread's locals are torn down has no registry.
        let _ = IN_FLIGHT.try_with(|f| f.borrow_mut().retain(|e| !Rc::ptr_eq(e, &self.entry)));
    }
}

impl<T, B> std::fmt::Debug for PendingReduce<T, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingReduce(group {:?})", self.entry.group)
    }
}

/// A started batch of all-gathers of elements `T` over one group (from
/// [`DeviceMesh::all_gather_v_start`](crate::DeviceMesh::all_gather_v_start); FSDP starts a
/// unit's parameters as one batch). Ordered like [`PendingReduce`]; dropping it waits.
pub struct PendingGather<T> {
    inner: PendingReduce<T, GatherBatch>,
    len: usize,
}

impl<T: Scalar> PendingGather<T> {
    /// Registers `pending`, a batch of `len` all-gathers over `group` this thread just started.
    pub(crate) fn register(group: &[usize], pending: PendingAllReduce, len: usize) -> Self {
        PendingGather { inner: PendingReduce::register(group, pending), len }
    }

    /// Blocks until the batch completed; every gather's elements (every member's, back to back
    /// in group order), in the order they were started.
    pub fn wait_all(self) -> Result<Vec<Vec<T>>> {
        let wrong = || Error::Backend {
            backend: "in_flight".into(),
            message: "a background all-gather returned buffers of another type or number".into(),
        };
        let len = self.len;
        let batch = self.inner.wait()?;
        if batch.0.len() != len {
            return Err(wrong());
        }
        batch.0.into_iter().map(|b| b.into_any().downcast::<Vec<T>>().map(|v| *v).map_err(|_| wrong())).collect()
    }

    /// [`PendingGather::wait_all`] of a batch of one: its elements.
    pub fn wait(self) -> Result<Vec<T>> {
        self.wait_all()?.pop().ok_or_else(|| Error::Backend {
            backend: "in_flight".into(),
            message: "an empty batch of all-gathers has no result".into(),
        })
    }
}

impl<T> std::fmt::Debug for PendingGather<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingGather({} on group {:?})", self.len, self.inner.entry.group)
    }
}
