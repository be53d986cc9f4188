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
//! * [`Launch::Nccl`] (cargo feature `cuda`): one rank per GPU, collectives through NCCL;
//!   one process per rank under `torchrun` or `mpirun` (the result vector holds this
//!   process' result), else `world_size` threads of this process, one per GPU (see [`nccl`]).
//! * [`Launch::CudaThreads`] (cargo feature `cuda`): `world_size` ranks as threads, their
//!   shards on the visible GPUs round-robin (all on one GPU if there is one), collectives
//!   through the thread backend (see [`cuda_threads`]).
//!
//! Without a GPU (or the feature) `Nccl` and `CudaThreads` fail with [`Error::Unavailable`];
//! a world that needs more GPUs than are visible fails with [`Error::TooFewDevices`] before
//! NCCL is touched.

pub mod cuda_threads;
#[cfg(feature = "mpi")]
mod mpi;
pub mod nccl;
mod threads;

pub use threads::{run, LocalWorld, DEFAULT_STACK_SIZE, MAX_WORLD_SIZE};

use crate::comm::Communicator;
use crate::device::Device;
pub use crate::env::DEFAULT_TIMEOUT;
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The old name of [`Launch`].
#[deprecated(since = "0.2.0", note = "renamed to `Launch`")]
pub type Backend = Launch;

pub use crate::mesh::current::{current_mesh, set_current_mesh};

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
    /// The communicator (a direct collective bypasses the ordering of background collectives:
    /// see [`DeviceMesh::comm`]).
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
    /// One rank per GPU with NCCL collectives (cargo feature `cuda`): processes under
    /// torchrun / mpirun, else one thread per GPU.
    Nccl,
    /// Ranks as threads with their shards on the GPUs, several per GPU allowed (cargo
    /// feature `cuda`).
    CudaThreads,
}

impl Launch {
    /// Every backend name [`FromStr`] accepts.
    pub const NAMES: [&'static str; 4] = ["threads", "mpi", "nccl", "cuda-threads"];

    /// Whether this build can run the mode (`Mpi` needs the `mpi` feature, `Nccl` and
    /// `CudaThreads` the `cuda` feature; a GPU is checked only when launching).
    pub fn is_available(self) -> bool {
        match self {
            Launch::Threads => true,
            Launch::Mpi => cfg!(feature = "mpi"),
            Launch::Nccl | Launch::CudaThreads => cfg!(feature = "cuda"),
        }
    }

    /// Whether each rank runs in its own process (results of other ranks are not returned):
    /// `Mpi`, and `Nccl` when a launcher set the rank variables ([`nccl::launched_by_env`]).
    pub fn is_multiprocess(self) -> bool {
        match self {
            Launch::Mpi => true,
            Launch::Nccl => nccl::launched_by_env(),
            Launch::Threads | Launch::CudaThreads => false,
        }
    }
}

impl fmt::Display for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launch::Threads => "threads",
            Launch::Mpi => "mpi",
            Launch::Nccl => "nccl",
            Launch::CudaThreads => "cuda-threads",
        })
    }
}

impl FromStr for Launch {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "threads" | "thread" | "local" => Ok(Launch::Threads),
            "mpi" => Ok(Launch::Mpi),
            "nccl" => Ok(Launch::Nccl),
            "cuda-threads" | "cuda_threads" => Ok(Launch::CudaThreads),
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
/// Errors: [`Error::Unavailable`] for a mode this build or machine cannot run (feature off,
/// no GPU or library), [`Error::TooFewDevices`] for an NCCL world larger than the visible
/// GPUs; otherwise what [`LocalWorld::run`] or the mode's launcher return.
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
        #[cfg(feature = "cuda")]
        Launch::Nccl => nccl::launch(world_size, f),
        #[cfg(not(feature = "cuda"))]
        Launch::Nccl => Err(Error::Unavailable {
            what: "the NCCL launch mode".into(),
            reason: "dtensor-runtime was built without the `cuda` cargo feature (build with `--features cuda`)".into(),
        }),
        Launch::CudaThreads => cuda_threads::launch(world_size, f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_rejects_unknown() {
        assert_eq!("threads".parse::<Launch>().unwrap(), Launch::Threads);
        assert_eq!(" MPI ".parse::<Launch>().unwrap(), Launch::Mpi);
        assert_eq!("nccl".parse::<Launch>().unwrap(), Launch::Nccl);
        assert_eq!("cuda-threads".parse::<Launch>().unwrap(), Launch::CudaThreads);
        let e = "gloo".parse::<Launch>().unwrap_err();
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

    #[test]
    fn gpu_modes_are_available_with_the_feature_and_fail_typed_without_a_gpu() {
        for mode in [Launch::Nccl, Launch::CudaThreads] {
            assert_eq!(mode.is_available(), cfg!(feature = "cuda"), "{mode}");
            if crate::cuda::device_count().is_ok() {
                continue; // a GPU machine runs these modes in tests/cuda_gpu.rs
            }
            let e = launch(mode, 1, |ctx| Ok(ctx.rank())).unwrap_err();
            assert!(matches!(e, Error::Unavailable { .. }), "{mode}: {e}");
        }
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn mpi_without_feature_is_unavailable() {
        let e = launch(Launch::Mpi, 1, |ctx| Ok(ctx.rank())).unwrap_err();
        assert!(matches!(e, Error::Unavailable { .. }), "{e}");
    }
}
