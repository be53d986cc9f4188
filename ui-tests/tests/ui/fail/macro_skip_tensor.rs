// A tensor field cannot be skipped: it would silently not be a parameter.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp", placements = [Shard(0)])]
pub struct Layer {
    pub w: DTensor<f32>,
    #[distribute(skip)]
    pub frozen: DTensor<f32>,
}

fn main() {}
