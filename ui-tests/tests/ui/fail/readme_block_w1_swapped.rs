// The README's DSL example with `w1` swapped to `[Replicate, Shard(1)]`: the error it quotes.
use dtensor::prelude::*;
use dtensor::{distribute, typed::dims::{dp, tp}, Dt, Sum};

#[distribute(mesh = "dp,tp")]
pub struct Block {
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f32>,
    #[placements = [Replicate, Shard(1)]]
    pub w2: DTensor<f32>,
}

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
pub fn block_forward(x: &DTensor<f32>, b: &Block) -> Result<DTensor<f32>> {
    let h: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = x.linear(&b.w1)?.gelu()?;
    let y: Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2> = h.linear(&b.w2)?;
    let y: Dt<f32, (dp, tp), (Shard<0>, Replicate), 2> = y.redistribute()?;
    x.add(&y)
}

fn main() {}
