//! [`Launch::Mpi`](super::Launch::Mpi): one process per rank, started by `mpirun -np N`.

use super::{set_current_mesh, RankCtx};
use crate::comm::mpi::MpiComm;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Runs `f` once in this process, as the rank `mpirun` gave it, and returns its result as a
/// one-element vector (the other ranks' results live in their own processes).
///
/// `world_size` 0 accepts whatever `mpirun -np N` started; any other value must equal `N`
/// (every process gets the same error otherwise, before any collective).
///
/// When `f` fails or panics on a world of more than one rank, this prints the error and calls
/// `MPI_Abort`: the peers may be blocked in a collective this rank will never enter, and
/// aborting is the only way MPI offers to release them. With one rank the error is returned.
pub fn launch<R, F>(world_size: usize, f: F) -> Result<Vec<R>>
where
    F: Fn(RankCtx) -> Result<R>,
{
    crate::env::check()?;
    let comm = MpiComm::world()?;
    if world_size != 0 && world_size != comm.world_size() {
        return Err(Error::InvalidArgument {
            context: "launch(Launch::Mpi)".into(),
            reason: format!(
                "the program wants {world_size} ranks but mpirun started {} processes (use `mpirun -np {world_size}`)",
                comm.world_size()
            ),
        });
    }
    let dyn_comm: Arc<dyn Communicator> = comm.clone();
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(RankCtx::new(dyn_comm))));
    set_current_mesh(None);
    let out = match out {
        Ok(r) => r,
        Err(p) => Err(Error::RankPanicked { rank: comm.rank(), message: super::panic_message(&p) }),
    };
    match out {
        Ok(v) => {
            comm.close();
            Ok(vec![v])
        }
        Err(e) if comm.world_size() > 1 => {
            eprintln!(
                "dtensor[mpi]: rank {} failed: {e}\ndtensor[mpi]: calling MPI_Abort so that no peer waits forever",
                comm.rank()
            );
            comm.abort(1)
        }
        Err(e) => {
            comm.close();
            Err(e)
        }
    }
}
