//! Launching SPMD programs: one closure runs on every rank, and the [`Launch`] mode chosen at
//! run time decides where the ranks live.
//!
//! ```
//! use dtensor_runtime::{launch, Launch};
//! let backend: Launch = "threads".parse().unwrap();
//! let ranks = launch(backend, 2, |ctx| Ok(ctx.rank())).unwrap();
//! assert_eq!(ranks, vec![0, 1]);
//! ```
//!
//! * [`Launch::Threads`]: `world_size` ranks as threads of this process ([`LocalWorld`]);
//!   the result vector holds every rank's result, in rank order.
//! * [`Launch::Mpi`] (cargo feature `mpi`): start the program with
//!   `mpirun -np N prog`; every process runs `f` once as its MPI rank and gets a one-element
//!   vector with its own result. `world_size` must be `N` (or 0 for "whatever mpirun gave").
//!   A rank whose closure fails aborts the MPI job (see [`comm::mpi`](crate::comm)).

#[cfg(feature = "mpi")]
mod mpi;
mod threads;

pub use threads::{run, LocalWorld, DEFAULT_STACK_SIZE};

pub use crate::comm::timeout::DEFAULT_TIMEOUT;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::storage::Device;
use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The old name of [`Launch`].
#[deprecated(since = "0.2.0", note = "renamed to `Launch`")]
pub type Backend = Launch;

thread_local! {
    static CURRENT_MESH: RefCell<Option<DeviceMesh>> = const { RefCell::new(None) };
}

/// Sets the mesh that factories use when none is given (PyTorch's "current mesh").
pub fn set_current_mesh(mesh: Option<DeviceMesh>) {
    CURRENT_MESH.with(|m| *m.borrow_mut() = mesh);
}

/// The mesh set by the latest [`RankCtx::init_device_mesh`] (or [`set_current_mesh`]) on this rank.
pub fn current_mesh() -> Option<DeviceMesh> {
    CURRENT_MESH.with(|m| m.borrow().clone())
}

/// What every rank's closure receives: its rank and the communicator of its world.
#[derive(Clone, Debug)]
pub struct RankCtx {
    comm: Arc<dyn Communicator>,
}

impl RankCtx {
    /// Wraps any communicator (used by the launchers; the rank's device is the communicator's).
    pub fn new(comm: Arc<dyn Communicator>) -> Self {
        RankCtx { comm }
    }
    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }
    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }
    /// The device this rank's shards live on (the communicator's [`Communicator::device`]).
    pub fn device(&self) -> Device {
        self.comm.device()
    }
    /// The communicator.
    pub fn comm(&self) -> &Arc<dyn Communicator> {
        &self.comm
    }
    /// Builds a mesh over the whole world (like `init_device_mesh("cpu", shape, mesh_dim_names)`)
    /// and makes it this rank's current mesh.
    pub fn init_device_mesh(&self, shape: &[usize], names: &[&str]) -> Result<DeviceMesh> {
        let mesh = DeviceMesh::new(Arc::clone(&self.comm), shape, names)?;
        set_current_mesh(Some(mesh.clone()));
        Ok(mesh)
    }
}

pub(crate) fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}

/// Where the ranks of a program run (formerly `Backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Launch {
    /// One OS thread per rank in this process (always available).
    #[default]
    Threads,
    /// One process per rank under `mpirun` (cargo feature `mpi`).
    Mpi,
}

impl Launch {
    /// Every backend name [`FromStr`] accepts.
    pub const NAMES: [&'static str; 2] = ["threads", "mpi"];

    /// Whether this build can run the backend (`Mpi` needs the `mpi` feature).
    pub fn is_available(self) -> bool {
        match self {
            Launch::Threads => true,
            Launch::Mpi => cfg!(feature = "mpi"),
        }
    }

    /// Whether each rank runs in its own process (results of other ranks are not returned).
    pub fn is_multiprocess(self) -> bool {
        self == Launch::Mpi
    }
}

impl fmt::Display for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launch::Threads => "threads",
            Launch::Mpi => "mpi",
        })
    }
}

impl FromStr for Launch {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "threads" | "thread" | "local" => Ok(Launch::Threads),
            "mpi" => Ok(Launch::Mpi),
            other => Err(Error::InvalidArgument {
                context: "launch".into(),
                reason: format!("unknown launch mode `{other}`; expected one of {:?}", Launch::NAMES),
            }),
        }
    }
}

/// Runs the SPMD closure `f` on `world_size` ranks of `backend`; see the [module docs](self)
/// for what the result vector holds on each backend.
///
/// Errors: [`Error::Unavailable`] for `Mpi` in a build without the `mpi` feature; otherwise
/// what [`LocalWorld::run`] or the MPI launcher return.
pub fn launch<R, F>(backend: Launch, world_size: usize, f: F) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(RankCtx) -> Result<R> + Sync,
{
    match backend {
        Launch::Threads => LocalWorld::new(world_size).run(f),
        #[cfg(feature = "mpi")]
        Launch::Mpi => mpi::launch(world_size, f),
        #[cfg(not(feature = "mpi"))]
        Launch::Mpi => Err(Error::Unavailable {
            what: "the MPI backend".into(),
            reason: "dtensor-runtime was built without the `mpi` cargo feature (build with `--features mpi`)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_rejects_unknown() {
        assert_eq!("threads".parse::<Launch>().unwrap(), Launch::Threads);
        assert_eq!(" MPI ".parse::<Launch>().unwrap(), Launch::Mpi);
        let e = "nccl".parse::<Launch>().unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        for n in Launch::NAMES {
            assert_eq!(n.parse::<Launch>().unwrap().to_string(), n);
        }
    }

    #[test]
    fn threads_launch_returns_every_rank() {
        let r = launch(Launch::Threads, 3, |ctx| Ok(ctx.rank() * 2)).unwrap();
        assert_eq!(r, vec![0, 2, 4]);
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn mpi_without_feature_is_unavailable() {
        let e = launch(Launch::Mpi, 1, |ctx| Ok(ctx.rank())).unwrap_err();
        assert!(matches!(e, Error::Unavailable { .. }), "{e}");
    }
}
