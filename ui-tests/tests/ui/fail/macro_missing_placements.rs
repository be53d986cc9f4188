// A tensor field with no placements and no struct-level default.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp")]
pub struct Layer {
    #[placements = [Replicate, Shard(1)]]
    pub w: DTensor<f32>,
    pub b: DTensor<f32>,
}

fn main() {}
