// `implicit` governs the ops of a function body; a struct has none.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp", placements = [Shard(0)], implicit = "allow")]
pub struct Layer {
    pub w: DTensor<f32>,
}

fn main() {}
