// `crate = ".."` must be a path.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp", placements = [Shard(0)], crate = "not a path")]
pub struct Layer {
    pub w: DTensor<f32>,
}

fn main() {}
