// A block under FSDP rests sharded over dp while its fields' types declare the in-use layout:
// so typed code cannot reach the fields at rest, only inside `call` (gathered).
use dtensor::prelude::*;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::{Dt, Fsdp};
use dtensor::{distribute, Replicate, Shard};

#[distribute(mesh = "dp,tp")]
#[derive(Clone)]
pub struct Block {
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f64>,
}

fn f(x: &Dt<f64, (dp, tp), (Shard<0>, Replicate), 2>, b: &Fsdp<f64, Block, dp>) -> Result<()> {
    let _ = x.matmul(&b.w1)?; // the shard: no such field
    let _ = b.call(|b| x.matmul(&b.w1))?; // gathered: fine
    Ok(())
}

fn main() {
    let _ = f;
}
