// Three placements for a 2-d mesh.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp")]
pub struct Layer {
    #[placements = [Replicate, Shard(1), Replicate]]
    pub w: DTensor<f32>,
}

fn main() {}
