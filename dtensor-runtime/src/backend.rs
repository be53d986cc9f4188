//! Choosing a communication backend at run time: one program, several ways to run it.
//!
//! ```
//! use dtensor_runtime::{launch, Backend};
//! let backend: Backend = "threads".parse().unwrap();
//! let ranks = launch(backend, 2, |ctx| Ok(ctx.rank())).unwrap();
//! assert_eq!(ranks, vec![0, 1]);
//! ```
//!
//! * [`Backend::Threads`]: `world_size` ranks as threads of this process ([`LocalWorld`]);
//!   the result vector holds every rank's result, in rank order.
//! * [`Backend::Mpi`] (cargo feature `mpi`): start the program with
//!   `mpirun -np N prog`; every process runs `f` once as its MPI rank and gets a one-element
//!   vector with its own result. `world_size` must be `N` (or 0 for "whatever mpirun gave").
//!   A rank whose closure fails aborts the MPI job (see [`comm::mpi`](crate::comm)).

use crate::error::{Error, Result};
use crate::launcher::{LocalWorld, RankCtx};
use std::fmt;
use std::str::FromStr;

/// Where the ranks of a program run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// One OS thread per rank in this process (always available).
    #[default]
    Threads,
    /// One process per rank under `mpirun` (cargo feature `mpi`).
    Mpi,
}

impl Backend {
    /// Every backend name [`FromStr`] accepts.
    pub const NAMES: [&'static str; 2] = ["threads", "mpi"];

    /// Whether this build can run the backend (`Mpi` needs the `mpi` feature).
    pub fn is_available(self) -> bool {
        match self {
            Backend::Threads => true,
            Backend::Mpi => cfg!(feature = "mpi"),
        }
    }

    /// Whether each rank runs in its own process (results of other ranks are not returned).
    pub fn is_multiprocess(self) -> bool {
        self == Backend::Mpi
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Threads => "threads",
            Backend::Mpi => "mpi",
        })
    }
}

impl FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "threads" | "thread" | "local" => Ok(Backend::Threads),
            "mpi" => Ok(Backend::Mpi),
            other => Err(Error::InvalidArgument {
                context: "backend".into(),
                reason: format!("unknown backend `{other}`; expected one of {:?}", Backend::NAMES),
            }),
        }
    }
}

/// Runs the SPMD closure `f` on `world_size` ranks of `backend`; see the [module docs](self)
/// for what the result vector holds on each backend.
///
/// Errors: [`Error::Unavailable`] for `Mpi` in a build without the `mpi` feature; otherwise
/// what [`LocalWorld::run`] or the MPI launcher return.
pub fn launch<R, F>(backend: Backend, world_size: usize, f: F) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(RankCtx) -> Result<R> + Sync,
{
    match backend {
        Backend::Threads => LocalWorld::new(world_size).run(f),
        #[cfg(feature = "mpi")]
        Backend::Mpi => crate::comm::mpi::launch(world_size, f),
        #[cfg(not(feature = "mpi"))]
        Backend::Mpi => Err(Error::Unavailable {
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
        assert_eq!("threads".parse::<Backend>().unwrap(), Backend::Threads);
        assert_eq!(" MPI ".parse::<Backend>().unwrap(), Backend::Mpi);
        let e = "nccl".parse::<Backend>().unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        for n in Backend::NAMES {
            assert_eq!(n.parse::<Backend>().unwrap().to_string(), n);
        }
    }

    #[test]
    fn threads_launch_returns_every_rank() {
        let r = launch(Backend::Threads, 3, |ctx| Ok(ctx.rank() * 2)).unwrap();
        assert_eq!(r, vec![0, 2, 4]);
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn mpi_without_feature_is_unavailable() {
        let e = launch(Backend::Mpi, 1, |ctx| Ok(ctx.rank())).unwrap_err();
        assert!(matches!(e, Error::Unavailable { .. }), "{e}");
    }
}
