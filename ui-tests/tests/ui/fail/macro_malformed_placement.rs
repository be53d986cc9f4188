// Placements that are not `Shard(d)`, `Replicate` or `Partial(op)`.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp")]
pub struct Layer {
    #[placements = [Replicate, Shard(x)]]
    pub w1: DTensor<f32>,
    #[placements = [Sharded(0), Replicate]]
    pub w2: DTensor<f32>,
}

fn main() {}
