//! [`Launch::Nccl`](super::Launch::Nccl): one rank per GPU, collectives through NCCL.
//!
//! * **Process mode**, when a launcher set the rank variables: torchrun's `RANK`, `WORLD_SIZE`,
//!   `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`, or an MPI launcher's (`OMPI_COMM_WORLD_RANK`,
//!   `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK` from Open MPI; `PMI_RANK`, `PMI_SIZE`,
//!   `MPI_LOCALRANKID` from MPICH / Intel MPI). The process runs `f` once as its rank on GPU
//!   `LOCAL_RANK` and gets a one-element result vector. Rank 0 creates the NCCL unique id and
//!   serves it over TCP on `MASTER_ADDR:MASTER_PORT` ([`Rendezvous`]), so an MPI launch of
//!   more than one rank needs those two variables too (`mpirun -x MASTER_ADDR=.. -x MASTER_PORT=..`).
//! * **Thread mode**, otherwise: `world_size` threads of this process, rank `r` on GPU `r`,
//!   whose communicators are created together by `ncclCommInitAll` (no id to exchange, and no
//!   rank can hang in initialisation waiting for a peer that failed to start).
//!
//! Both modes check that the world fits the visible GPUs ([`Error::TooFewDevices`]) before
//! NCCL is touched. A rank whose closure fails aborts its communicators; its peers' pending
//! collectives then end in [`Error::CollectiveTimeout`] (after `DTENSOR_TIMEOUT_MS`) or an NCCL
//! error, never a hang.

use crate::comm::bootstrap::Rendezvous;
use crate::error::{Error, Result};

/// Where one process of an NCCL job sits: its rendezvous and the GPU it drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclProcess {
    /// Rank, world size and (for more than one rank) the rank-0 address.
    pub rendezvous: Rendezvous,
    /// The rank's index on its node, which is its GPU ordinal.
    pub local_rank: usize,
}

/// The variable names one launcher sets: rank, world size, local rank.
const LAUNCHERS: [[&str; 3]; 3] = [
    ["RANK", "WORLD_SIZE", "LOCAL_RANK"],
    ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"],
    ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"],
];

/// Reads this process' place in an NCCL job through `get` (the environment when
/// [`Launch::Nccl`](super::Launch::Nccl) starts), given the number of visible GPUs.
///
/// `Ok(None)`: no launcher's rank variable is set (thread mode). Errors: a missing or
/// non-numeric variable, `WORLD_SIZE` 0 or a bad `MASTER_*` are [`Error::InvalidArgument`];
/// a rank outside the world is [`Error::RankOutOfRange`]; a local rank without a GPU of that
/// ordinal is [`Error::TooFewDevices`]. `LOCAL_RANK` may be left out only in a world of one.
pub fn process_from_lookup(get: impl Fn(&str) -> Option<String>, device_count: usize) -> Result<Option<NcclProcess>> {
    let Some([rank, size, local]) = LAUNCHERS.into_iter().find(|names| get(names[0]).is_some()) else {
        return Ok(None);
    };
    // The rendezvous reads torchrun's names; an MPI launcher's are read in their place.
    let rendezvous = Rendezvous::from_lookup(|k| match k {
        "RANK" => get(rank),
        "WORLD_SIZE" => get(size),
        other => get(other),
    })
    .map_err(|e| match e {
        Error::InvalidArgument { context, reason } if rank != "RANK" => {
            Error::InvalidArgument { context, reason: format!("{reason} (rank variables {rank}, {size})") }
        }
        e => e,
    })?;
    let local_rank = match get(local) {
        Some(v) => v.trim().parse::<usize>().map_err(|_| Error::InvalidArgument {
            context: "launch(Launch::Nccl)".into(),
            reason: format!("{local}={v} is not a non-negative integer"),
        })?,
        None if rendezvous.world_size == 1 => 0,
        None => {
            return Err(Error::InvalidArgument {
                context: "launch(Launch::Nccl)".into(),
                reason: format!("environment variable {local} is not set: it picks the rank's GPU"),
            })
        }
    };
    if local_rank >= device_count {
        return Err(Error::TooFewDevices {
            context: format!("launch(Launch::Nccl), {local}={local_rank}"),
            wanted: local_rank + 1,
            available: device_count,
        });
    }
    Ok(Some(NcclProcess { rendezvous, local_rank }))
}

/// Whether a launcher's rank variable is set in this process (then
/// [`Launch::Nccl`](super::Launch::Nccl) runs in process mode).
pub fn launched_by_env() -> bool {
    LAUNCHERS.iter().any(|names| std::env::var_os(names[0]).is_some())
}

/// `Ok` when a thread-mode world of `world_size` ranks fits `device_count` GPUs.
pub fn check_thread_world(world_size: usize, device_count: usize) -> Result<()> {
    if world_size == 0 {
        return Err(Error::InvalidArgument {
            context: "launch(Launch::Nccl)".into(),
            reason: "world size must be at least 1".into(),
        });
    }
    super::threads::check_world_size("launch(Launch::Nccl)", world_size)?;
    if world_size > device_count {
        return Err(Error::TooFewDevices {
            context: "launch(Launch::Nccl) in thread mode (one GPU per rank; use Launch::CudaThreads to share GPUs)"
                .into(),
            wanted: world_size,
            available: device_count,
        });
    }
    Ok(())
}

#[cfg(feature = "cuda")]
pub(super) use run::launch;

#[cfg(feature = "cuda")]
mod run {
    use super::super::threads::{spawn_ranks, RankHooks, DEFAULT_STACK_SIZE};
    use super::super::{panic_message, set_current_mesh, RankCtx};
    use super::{check_thread_world, process_from_lookup};
    use crate::comm::nccl::{unique_id, NcclComm};
    use crate::comm::Communicator;
    use crate::cuda::{self, CudaDevice};
    use crate::error::{Error, Result};
    use std::sync::{Arc, Mutex};

    /// Runs `f` on the NCCL ranks of this job; see the [module docs](super).
    pub(crate) fn launch<R, F>(world_size: usize, f: F) -> Result<Vec<R>>
    where
        R: Send,
        F: Fn(RankCtx) -> Result<R> + Sync,
    {
        crate::env::check()?;
        let count = cuda::device_count()?;
        // A launcher's variable that is not UTF-8 is an error, not "unset".
        for name in super::LAUNCHERS.iter().flatten().chain(&["MASTER_ADDR", "MASTER_PORT"]) {
            crate::env::var(name)?;
        }
        match process_from_lookup(|k| crate::env::var(k).ok().flatten(), count)? {
            Some(p) => {
                let rv = &p.rendezvous;
                if world_size != 0 && world_size != rv.world_size {
                    return Err(Error::InvalidArgument {
                        context: "launch(Launch::Nccl)".into(),
                        reason: format!(
                            "the program wants {world_size} ranks but the launcher set a world of {}",
                            rv.world_size
                        ),
                    });
                }
                let device = CudaDevice::new(p.local_rank)?;
                let id = rv.share_from_rank0(crate::env::timeout()?, unique_id)?;
                let comm = Arc::new(NcclComm::with_id(&device, rv.rank, rv.world_size, &id)?);
                let dyn_comm: Arc<dyn Communicator> = comm.clone();
                let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(RankCtx::new(dyn_comm))));
                set_current_mesh(None);
                let out =
                    out.unwrap_or_else(|p| Err(Error::RankPanicked { rank: rv.rank, message: panic_message(&p) }));
                if let Err(e) = &out {
                    comm.abort(&e.to_string());
                }
                out.map(|v| vec![v])
            }
            None => {
                check_thread_world(world_size, count)?;
                let devices = (0..world_size).map(CudaDevice::new).collect::<Result<Vec<_>>>()?;
                let comms: Vec<Mutex<Option<Arc<NcclComm>>>> =
                    NcclComm::init_all(&devices)?.into_iter().map(|c| Mutex::new(Some(Arc::new(c)))).collect();
                let take = |rank: usize| comms[rank].lock().unwrap_or_else(|e| e.into_inner()).clone();
                let hooks = RankHooks {
                    make: &|rank| {
                        let c = take(rank).ok_or(Error::RankOutOfRange { rank, world_size })?;
                        Ok(c as Arc<dyn Communicator>)
                    },
                    exit: &|_| {},
                    fail: &|rank, why| {
                        if let Some(c) = take(rank) {
                            c.abort(&why);
                        }
                    },
                };
                spawn_ranks(world_size, DEFAULT_STACK_SIZE, &hooks, &f)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    const MASTER: [(&str, &str); 2] = [("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")];

    #[test]
    fn no_launcher_variables_means_thread_mode() {
        assert_eq!(process_from_lookup(env(&[("LOCAL_RANK", "0")]), 8).unwrap(), None);
    }

    #[test]
    fn reads_torchrun_and_mpi_variables() {
        let torchrun = [("RANK", "5"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), MASTER[0], MASTER[1]];
        let p = process_from_lookup(env(&torchrun), 4).unwrap().unwrap();
        assert_eq!((p.rendezvous.rank, p.rendezvous.world_size, p.local_rank), (5, 8, 1));
        assert_eq!(p.rendezvous.master, Some(("10.0.0.1".into(), 29500)));
        let ompi = [
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            MASTER[0],
            MASTER[1],
        ];
        let p = process_from_lookup(env(&ompi), 4).unwrap().unwrap();
        assert_eq!((p.rendezvous.rank, p.rendezvous.world_size, p.local_rank), (3, 4, 3));
        let pmi = [("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("MPI_LOCALRANKID", "0"), MASTER[0], MASTER[1]];
        let p = process_from_lookup(env(&pmi), 1).unwrap().unwrap();
        assert_eq!((p.rendezvous.rank, p.rendezvous.world_size, p.local_rank), (1, 2, 0));
        // A world of one needs neither LOCAL_RANK nor a master.
        let p = process_from_lookup(env(&[("RANK", "0"), ("WORLD_SIZE", "1")]), 1).unwrap().unwrap();
        assert_eq!((p.rendezvous.master.clone(), p.local_rank), (None, 0));
    }

    #[test]
    fn bad_variables_are_typed_errors() {
        let invalid: [&[(&str, &str)]; 6] = [
            &[("RANK", "0")],
            &[("RANK", "zero"), ("WORLD_SIZE", "2")],
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")],
            &[("RANK", "0"), ("WORLD_SIZE", "2"), MASTER[0], MASTER[1]],
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "-1"), MASTER[0], MASTER[1]],
            &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "x")],
        ];
        for vars in invalid {
            let e = process_from_lookup(env(vars), 8).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{vars:?}: {e:?}");
        }
        let e = process_from_lookup(env(&[("RANK", "2"), ("WORLD_SIZE", "2")]), 8).unwrap_err();
        assert!(matches!(e, Error::RankOutOfRange { rank: 2, world_size: 2 }), "{e:?}");
        let e = process_from_lookup(
            env(&[("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "2"), MASTER[0], MASTER[1]]),
            2,
        )
        .unwrap_err();
        assert!(matches!(e, Error::TooFewDevices { wanted: 3, available: 2, .. }), "{e:?}");
    }

    #[test]
    fn a_thread_world_must_fit_the_gpus() {
        check_thread_world(2, 2).unwrap();
        let e = check_thread_world(3, 2).unwrap_err();
        assert!(matches!(e, Error::TooFewDevices { wanted: 3, available: 2, .. }), "{e:?}");
        assert!(matches!(check_thread_world(0, 2), Err(Error::InvalidArgument { .. })));
    }
}
