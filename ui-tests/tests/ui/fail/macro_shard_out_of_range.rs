// Shard dims past the rank the type gives (2 by default, 3 when written).
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp")]
pub struct Layer {
    #[placements = [Replicate, Shard(2)]]
    pub w: DTensor<f32>,
    #[placements = [Shard(3), Replicate]]
    pub experts: DTensor<f32, 3>,
}

fn main() {}
