//! MPI suite 3: a failing rank must not leave its peers blocked in a collective.
//!
//! Driven by scripts/mpi-tests.sh, which runs this binary under `mpirun -np 4` once per mode
//! (`DTENSOR_MPI_FAILURE_MODE`) and checks that the job ends quickly with a non-zero status
//! and the expected message:
//! * `error`: rank 1 returns an error while ranks 0, 2, 3 wait in a barrier → the launcher
//!   prints the error and calls `MPI_Abort`;
//! * `panic`: the same with a panic;
//! * `hang`: rank 1 stays alive but never enters the barrier → the watchdog aborts the job
//!   after `DTENSOR_TIMEOUT_MS`;
//! * `hang-started`: the same, while ranks 0, 2, 3 wait for an all-reduce started in the
//!   background (`MPI_Iallreduce`, completed by `MPI_Wait` under the watchdog);
//! * `fsdp-error` / `fsdp-hang`: a fully sharded module; rank 1 fails (or stalls) after the
//!   forward while ranks 0, 2, 3 reduce-scatter their gradients in the backward;
//! * `fsdp-prefetch-error` / `fsdp-prefetch-hang`: every rank starts prefetching the module's
//!   parameters (`unshard_async`: `MPI_Iallgatherv`), then rank 1 fails (or stalls) while ranks
//!   0, 2, 3 wait for the gathers in the forward (and beyond, if they complete without it).
//!
//! Without the variable (plain `cargo test --features mpi`) it only explains itself.

use dtensor_runtime::fsdp::{fully_shard, FullyShardOptions};
use dtensor_runtime::module::{Forward, Linear};
use dtensor_runtime::{distribute_tensor, launch, Along, DeviceMesh, Error, Launch, ReduceOp, Shard};
use std::time::Duration;

fn main() {
    let Ok(mode) = std::env::var("DTENSOR_MPI_FAILURE_MODE") else {
        println!(
            "mpi_failure: set DTENSOR_MPI_FAILURE_MODE=error|panic|hang|hang-started|fsdp-error|fsdp-hang|fsdp-prefetch-error|fsdp-prefetch-hang and run under mpirun (scripts/mpi-tests.sh)"
        );
        return;
    };
    let r = launch(Launch::Mpi, 0, |ctx| {
        let world: Vec<usize> = (0..ctx.world_size()).collect();
        let mesh = ctx.init_device_mesh(&[ctx.world_size()], &["dp"])?;
        ctx.comm().barrier(&world)?;
        if let Some(how) = mode.strip_prefix("fsdp-") {
            return fsdp_step_failing_on_rank_1(&mesh, ctx.rank(), how);
        }
        if mode == "hang-started" && ctx.rank() != 1 {
            mesh.all_reduce_start(Along::Dim(0), vec![1.0f32; 1000], ReduceOp::Sum)?.wait()?;
        }
        if ctx.rank() == 1 {
            match mode.as_str() {
                "error" => {
                    return Err(Error::InvalidArgument {
                        context: "mpi_failure".into(),
                        reason: "injected failure".into(),
                    })
                }
                "panic" => panic!("injected panic"),
                _ => std::thread::sleep(Duration::from_secs(60)),
            }
        }
        ctx.comm().barrier(&world)?;
        Ok(())
    });
    // Only reachable with one rank (errors are returned) or when nothing failed.
    println!("mpi_failure: launch returned {r:?}");
    std::process::exit(if r.is_ok() { 0 } else { 2 });
}

/// A fully sharded linear layer's step; rank 1 fails (`error`) or stalls (`hang`) between the
/// forward and the backward, whose reduce-scatter the other ranks then wait in.
fn fsdp_step_failing_on_rank_1(mesh: &DeviceMesh, rank: usize, how: &str) -> dtensor_runtime::Result<()> {
    dtensor_runtime::manual_seed(0);
    let lin = fully_shard(Linear::<f32>::new(16, 16, false)?, mesh, &FullyShardOptions::on("dp").named("proj"))?;
    let x = ndarray::ArrayD::from_elem(vec![mesh.size(0), 16], 1.0f32);
    if let Some(how) = how.strip_prefix("prefetch-") {
        // every rank starts the gathers (MPI_Iallgatherv); rank 1 then fails or stalls while
        // its peers wait for them in the forward
        lin.unshard_async()?;
        if rank == 1 {
            if how == "error" {
                return Err(Error::InvalidArgument {
                    context: "mpi_failure".into(),
                    reason: "injected failure".into(),
                });
            }
            std::thread::sleep(Duration::from_secs(60));
        }
        return lin.forward(&distribute_tensor(x, mesh, &[Shard(0)], None)?)?.sum()?.backward();
    }
    let y = lin.forward(&distribute_tensor(x, mesh, &[Shard(0)], None)?)?.sum()?;
    if rank == 1 {
        if how == "error" {
            return Err(Error::InvalidArgument { context: "mpi_failure".into(), reason: "injected failure".into() });
        }
        std::thread::sleep(Duration::from_secs(60));
    }
    y.backward()
}
