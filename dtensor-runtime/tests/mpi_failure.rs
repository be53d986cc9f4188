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
//!   background (`MPI_Iallreduce`, completed by `MPI_Wait` under the watchdog).
//!
//! Without the variable (plain `cargo test --features mpi`) it only explains itself.

use dtensor_runtime::{launch, Along, Error, Launch, ReduceOp};
use std::time::Duration;

fn main() {
    let Ok(mode) = std::env::var("DTENSOR_MPI_FAILURE_MODE") else {
        println!(
            "mpi_failure: set DTENSOR_MPI_FAILURE_MODE=error|panic|hang|hang-started and run under mpirun (scripts/mpi-tests.sh)"
        );
        return;
    };
    let r = launch(Launch::Mpi, 0, |ctx| {
        let world: Vec<usize> = (0..ctx.world_size()).collect();
        let mesh = ctx.init_device_mesh(&[ctx.world_size()], &["dp"])?;
        ctx.comm().barrier(&world)?;
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
