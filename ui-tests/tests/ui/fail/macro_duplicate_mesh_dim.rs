// The same mesh dim name twice.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp,tp", placements = [Replicate, Shard(0)])]
pub struct Layer {
    pub w: DTensor<f32>,
}

fn main() {}
