//! [`Launch::Threads`](super::Launch::Threads): every rank is an OS thread of this process.

use super::{panic_message, set_current_mesh, RankCtx};
use crate::comm::threads::{ThreadComm, ThreadWorld};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::Duration;

/// Default stack size of a rank's thread.
pub const DEFAULT_STACK_SIZE: usize = 16 << 20;

/// The largest world of thread ranks (one OS thread each): 65 536, far more threads than one
/// process usefully runs. A larger world is an [`Error::InvalidArgument`] before anything is
/// allocated or spawned (rather than an abort allocating per-rank state, or minutes of
/// spawning threads until the system refuses).
pub const MAX_WORLD_SIZE: usize = 1 << 16;

/// `size` is a world of thread ranks that can be started: 1 to [`MAX_WORLD_SIZE`].
pub(crate) fn check_world_size(context: &str, size: usize) -> Result<()> {
    if size == 0 {
        return Err(world_of_zero());
    }
    if size > MAX_WORLD_SIZE {
        return Err(Error::InvalidArgument {
            context: context.into(),
            reason: format!(
                "a world of {size} ranks is more than the {MAX_WORLD_SIZE} thread ranks one process can run"
            ),
        });
    }
    Ok(())
}

/// The embedded in-process world: one OS thread per rank.
///
/// ```
/// let sums = dtensor_runtime::LocalWorld::new(3).run(|ctx| Ok(ctx.rank() * 10)).unwrap();
/// assert_eq!(sums, vec![0, 10, 20]);
/// ```
#[derive(Debug, Clone)]
pub struct LocalWorld {
    size: usize,
    /// `None`: `DTENSOR_TIMEOUT_MS` or the default, read by `run`.
    timeout: Option<Duration>,
    stack_size: usize,
}

impl LocalWorld {
    /// A world of `size` ranks whose collective timeout is `DTENSOR_TIMEOUT_MS` (read by
    /// [`run`](Self::run)), else [`DEFAULT_TIMEOUT`](super::DEFAULT_TIMEOUT).
    pub fn new(size: usize) -> Self {
        LocalWorld { size, timeout: None, stack_size: DEFAULT_STACK_SIZE }
    }

    /// How long a collective waits for its peers before failing with `CollectiveTimeout`
    /// (overrides `DTENSOR_TIMEOUT_MS`; zero makes [`run`](Self::run) fail with
    /// [`Error::InvalidArgument`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Stack size of each rank's thread (default [`DEFAULT_STACK_SIZE`]).
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = bytes;
        self
    }

    /// Runs `f` on every rank and returns each rank's result, or the first failure.
    ///
    /// A rank that returns an error or panics poisons the world: every other rank's pending
    /// or future collective fails with [`Error::PeerFailed`] instead of hanging. A rank whose
    /// thread cannot be started (thread or memory limits) poisons it the same way, and `run`
    /// returns [`Error::ThreadSpawn`]. A zero or malformed timeout (API or `DTENSOR_TIMEOUT_MS`)
    /// is an [`Error::InvalidArgument`] before any rank starts, and so are a world of 0 or of
    /// more than [`MAX_WORLD_SIZE`] ranks and a bad value of any environment variable the
    /// runtime reads ([`env`](crate::env)). Any positive timeout is valid, however long
    /// ([`Duration::MAX`]: no limit).
    pub fn run<R, F>(&self, f: F) -> Result<Vec<R>>
    where
        R: Send,
        F: Fn(RankCtx) -> Result<R> + Sync,
    {
        self.run_wrapped(|_, comm| Ok(Arc::new(comm)), f)
    }

    /// [`run`](Self::run) whose ranks get `wrap(rank, thread_comm)` as their communicator
    /// (called on the rank's own thread): how [`Launch::CudaThreads`](super::Launch::CudaThreads)
    /// puts a device under the thread backend's rendezvous.
    pub(crate) fn run_wrapped<R, F, W>(&self, wrap: W, f: F) -> Result<Vec<R>>
    where
        R: Send,
        F: Fn(RankCtx) -> Result<R> + Sync,
        W: Fn(usize, ThreadComm) -> Result<Arc<dyn Communicator>> + Sync,
    {
        check_world_size("run", self.size)?;
        crate::env::check()?;
        let timeout = match self.timeout {
            Some(t) => crate::env::check_timeout(t)?,
            None => crate::env::timeout()?,
        };
        let world = ThreadWorld::new(self.size, timeout);
        let hooks = RankHooks {
            make: &|rank| wrap(rank, world.communicator(rank)?),
            exit: &|rank| world.exit(rank),
            fail: &|rank, why| world.fail(rank, why),
        };
        spawn_ranks(self.size, self.stack_size, &hooks, &f)
    }
}

fn world_of_zero() -> Error {
    Error::InvalidArgument { context: "run".into(), reason: "world size must be at least 1".into() }
}

/// How [`spawn_ranks`] builds a rank's communicator and tells the world that a rank finished
/// or failed (so that its peers stop waiting for it).
pub(crate) struct RankHooks<'a> {
    /// The communicator of a rank, built on that rank's thread.
    pub make: &'a (dyn Fn(usize) -> Result<Arc<dyn Communicator>> + Sync),
    /// The rank returned from its closure.
    pub exit: &'a (dyn Fn(usize) + Sync),
    /// The rank failed (error, panic, or its thread could not start), with the reason.
    pub fail: &'a (dyn Fn(usize, String) + Sync),
}

/// Runs `f` on `size` scoped threads, one per rank, and returns every rank's result in rank
/// order, or the first root-cause failure (a rank's own error before the `PeerFailed` errors
/// it caused). Shared by every thread-based launch mode.
pub(crate) fn spawn_ranks<R, F>(size: usize, stack_size: usize, hooks: &RankHooks<'_>, f: &F) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(RankCtx) -> Result<R> + Sync,
{
    check_world_size("run", size)?;
    let (spawn_error, results) = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(size);
        let mut spawn_error = None;
        for rank in 0..size {
            let spawned = std::thread::Builder::new()
                .name(format!("dtensor-rank-{rank}"))
                .stack_size(stack_size)
                .spawn_scoped(s, move || {
                    let comm = match (hooks.make)(rank) {
                        Ok(c) => c,
                        Err(e) => {
                            (hooks.fail)(rank, e.to_string());
                            return Err(e);
                        }
                    };
                    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(RankCtx::new(comm))));
                    set_current_mesh(None);
                    match out {
                        Ok(Ok(v)) => {
                            (hooks.exit)(rank);
                            Ok(v)
                        }
                        Ok(Err(e)) => {
                            (hooks.fail)(rank, e.to_string());
                            Err(e)
                        }
                        Err(p) => {
                            let message = panic_message(&p);
                            (hooks.fail)(rank, format!("panicked: {message}"));
                            Err(Error::RankPanicked { rank, message })
                        }
                    }
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The ranks already running must not wait for this one.
                    (hooks.fail)(rank, format!("its thread could not be started: {e}"));
                    let reason = e.to_string();
                    spawn_error = Some(Error::ThreadSpawn { rank, world_size: size, reason });
                    break;
                }
            }
        }
        let results: Vec<Result<R>> = handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| h.join().unwrap_or_else(|p| Err(Error::RankPanicked { rank, message: panic_message(&p) })))
            .collect();
        (spawn_error, results)
    });
    if let Some(e) = spawn_error {
        return Err(e);
    }
    let mut first_peer_failed = None;
    let mut out = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Ok(v) => out.push(v),
            Err(e @ Error::PeerFailed { .. }) => {
                first_peer_failed.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    match first_peer_failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Runs `f` on `world_size` in-process ranks (threads); see [`LocalWorld::run`].
pub fn run<R, F>(world_size: usize, f: F) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(RankCtx) -> Result<R> + Sync,
{
    LocalWorld::new(world_size).run(f)
}
