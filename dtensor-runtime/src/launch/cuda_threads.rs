//! [`Launch::CudaThreads`](super::Launch::CudaThreads): `world_size` ranks as threads of this
//! process with their shards on the visible GPUs, round-robin (every rank on device 0 when
//! there is one GPU), collectives through the thread backend's rendezvous
//! ([`CudaThreadsComm`]).

use super::{LocalWorld, RankCtx};
use crate::comm::cuda_threads::CudaThreadsComm;
use crate::comm::Communicator;
use crate::cuda::{self, CudaDevice};
use crate::error::Result;
use std::sync::Arc;

/// The GPU of `rank` among `device_count` visible ones.
pub fn device_of(rank: usize, device_count: usize) -> usize {
    rank % device_count.max(1)
}

/// Runs `f` on `world_size` thread ranks on the GPUs (errors: [`Error::Unavailable`](crate::Error::Unavailable)
/// without the `cuda` feature, a driver or a device; otherwise as [`LocalWorld::run`]).
pub(super) fn launch<R, F>(world_size: usize, f: F) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(RankCtx) -> Result<R> + Sync,
{
    let count = cuda::device_count()?;
    LocalWorld::new(world_size).run_wrapped(
        |rank, comm| {
            let device = CudaDevice::new(device_of(rank, count))?;
            Ok(Arc::new(CudaThreadsComm::new(comm, device)) as Arc<dyn Communicator>)
        },
        f,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_go_round_robin_over_the_gpus() {
        let on = |n: usize, count: usize| (0..n).map(|r| device_of(r, count)).collect::<Vec<_>>();
        assert_eq!(on(4, 1), [0, 0, 0, 0]);
        assert_eq!(on(5, 2), [0, 1, 0, 1, 0]);
        assert_eq!(on(3, 8), [0, 1, 2]);
    }
}
