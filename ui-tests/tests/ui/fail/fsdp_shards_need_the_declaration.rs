// `Fsdp::shards` needs the module's resting layouts as types: `fsdp = "dp"` on its struct.
use dtensor::prelude::*;
use dtensor::typed::dims::dp;
use dtensor::typed::Fsdp;
use dtensor::distribute;

#[distribute(mesh = "dp,tp")]
#[derive(Clone)]
pub struct Block {
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f64>,
}

fn f(b: &Fsdp<f64, Block, dp>) -> Result<()> {
    let _ = b.shards()?;
    Ok(())
}

fn main() {
    let _ = f;
}
