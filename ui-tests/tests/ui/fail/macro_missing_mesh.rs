// No mesh.
use dtensor::{distribute, DTensor};

#[distribute(placements = [Replicate, Shard(1)])]
pub struct Layer {
    pub w: DTensor<f32>,
}

fn main() {}
