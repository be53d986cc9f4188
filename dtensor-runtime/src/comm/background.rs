//! A per-rank worker thread that runs started collectives (all-reduces, the all-gathers of
//! FSDP's prefetch) in the order they were started,
//! for backends whose blocking collectives may run on a second thread of the same rank while
//! the first runs collectives on other groups (the thread backend: one rendezvous per group).
//!
//! Every rank starts its background collectives in the same order (program order), and the
//! worker runs them first-in first-out, so they meet their peers' in the same order as
//! blocking calls would. The worker exits when its communicator is dropped.

use super::pending::{self, OwnedBytes, PendingAllReduce};
use super::Communicator;
use crate::element::DType;
use crate::error::{Error, Result};
use crate::placement::ReduceOp;
use std::fmt;
use std::sync::mpsc;

type Reply = mpsc::Sender<Result<Box<dyn OwnedBytes>>>;

/// A started collective: run on the worker's communicator, it returns the owned buffer its
/// result is in.
pub(crate) type Work = Box<dyn FnOnce(&dyn Communicator) -> Result<Box<dyn OwnedBytes>> + Send>;

struct Job {
    work: Work,
    reply: Reply,
}

/// The worker of one rank: a queue of started collectives and the thread that runs them.
pub(crate) struct Background {
    backend: &'static str,
    queue: mpsc::Sender<Job>,
}

impl fmt::Debug for Background {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Background({})", self.backend)
    }
}

impl Background {
    /// Spawns the worker; it runs every job on `comm` (a handle of the same rank that holds
    /// no `Background` itself, so that dropping the rank's handles ends the thread).
    pub(crate) fn spawn(comm: Box<dyn Communicator>) -> Result<Background> {
        let backend = comm.backend();
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(format!("dtensor-comm-{}", comm.rank()))
            .spawn(move || {
                for job in rx {
                    let r = (job.work)(comm.as_ref());
                    // The caller may have dropped its handle: then nobody wants the result.
                    let _ = job.reply.send(r);
                }
            })
            .map_err(|e| Error::Backend {
                backend: backend.into(),
                message: format!("cannot start the background collective thread: {e}"),
            })?;
        Ok(Background { backend, queue: tx })
    }

    /// Queues an in-place all-reduce of `buf` over `group`.
    pub(crate) fn all_reduce(
        &self,
        group: &[usize],
        mut buf: Box<dyn OwnedBytes>,
        dtype: DType,
        op: ReduceOp,
    ) -> PendingAllReduce {
        let group = group.to_vec();
        self.start(Box::new(move |c| pending::reduce_now(c, &group, buf.as_mut(), dtype, op).map(|()| buf)))
    }

    /// Queues `work`.
    pub(crate) fn start(&self, work: Work) -> PendingAllReduce {
        let (reply, rx) = mpsc::channel();
        if let Err(mpsc::SendError(job)) = self.queue.send(Job { work, reply }) {
            // The worker is gone (it panicked): say so, and hand nothing back half-done.
            drop(job);
            return PendingAllReduce::done(Err(Error::Backend {
                backend: self.backend.into(),
                message: "the background collective thread is gone (it panicked)".into(),
            }));
        }
        PendingAllReduce::from_channel(self.backend, rx)
    }
}
