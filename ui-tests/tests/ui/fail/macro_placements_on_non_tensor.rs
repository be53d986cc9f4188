// `#[placements]` on a field that is not a DTensor.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp")]
pub struct Layer {
    #[placements = [Shard(0)]]
    pub w: DTensor<f32>,
    #[placements = [Replicate]]
    pub hidden: usize,
}

fn main() {}
