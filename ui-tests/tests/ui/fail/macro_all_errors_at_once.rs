// Every problem of one item is reported, each on its own token.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp")]
pub struct Layer {
    #[placements = [Replicate]]
    pub w1: DTensor<f32>,
    #[placements = [Partial(Avg), Shard(5)]]
    pub w2: DTensor<f32>,
    #[placements = [tp = Replicate, tp = Shard(0)]]
    pub w3: DTensor<f32>,
}

fn main() {}
