// `Fsdp::shards` gives the parameters at rest with their resting layouts as types: a shard
// passed where the gathered (in-use) parameter is expected does not compile.
use dtensor::prelude::*;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::{Dt, Fsdp};
use dtensor::{distribute, Replicate, Shard};

#[distribute(mesh = "dp,tp", fsdp = "dp")]
#[derive(Clone)]
pub struct Block {
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f64>,
}

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate], returns = [Shard(0), Shard(1)])]
fn project(x: &DTensor<f64>, #[placements(Replicate, Shard(1))] w: &DTensor<f64>) -> Result<DTensor<f64>> {
    x.matmul(w)
}

fn f(x: &Dt<f64, (dp, tp), (Shard<0>, Replicate), 2>, b: &Fsdp<f64, Block, dp>) -> Result<()> {
    let shards = b.shards()?;
    let _ = project(x, &shards.w1)?; // a shard: (Shard<0>, Shard<1>), not (Replicate, Shard<1>)
    let _ = b.call(|b| project(x, &b.w1))?; // gathered: fine
    Ok(())
}

fn main() {
    let _ = f;
}
