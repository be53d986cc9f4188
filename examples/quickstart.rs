//! dtensor in 30 lines: `cargo run --example quickstart`.
//! Four in-process ranks on a 2×2 mesh; every rank runs the closure (SPMD).
use dtensor::prelude::*;
use dtensor::{manual_seed, randn, CommDebugMode};

fn main() -> Result<()> {
    dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        // A global 6×5 tensor, rows split over dp, columns over tp (uneven: torch.chunk sizes).
        let global = ndarray::ArrayD::from_shape_fn(vec![6, 5], |ix| (ix[0] * 5 + ix[1]) as f32);
        let x = distribute_tensor(&global, &mesh, &[Shard(0), Shard(1)], Some(0))?;
        // Shard(1) -> Replicate on tp is one all-gather; CommDebugMode counts it.
        let comm = CommDebugMode::new();
        let rows = comm.scope(|| x.redistribute(&[Shard(0), Replicate]))?;
        assert_eq!(rows.full_tensor()?, global, "every layout holds the same global tensor");
        // Factories build only the local shard; randn is placement-invariant (same values on any mesh).
        manual_seed(42);
        let w = randn::<f32>(&[8, 4], &TensorOptions::new().mesh(&mesh).placements(&[Replicate, Shard(1)]))?;
        manual_seed(42);
        let w_rep = randn::<f32>(&[8, 4], &TensorOptions::new().mesh(&mesh))?;
        assert_eq!(w.full_tensor()?, w_rep.full_tensor()?);
        if ctx.rank() == 0 {
            println!("x      {x:?}\nrows   {rows:?}\nw      {w:?}");
            print!("collectives of the redistribute on rank 0:\n{}", comm.summary());
        }
        Ok(())
    })?;
    println!("quickstart OK");
    Ok(())
}
