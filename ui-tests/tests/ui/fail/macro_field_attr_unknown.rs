// On a field, `#[distribute]` only takes `skip`.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp", placements = [Shard(0)])]
pub struct Layer {
    pub w: DTensor<f32>,
    #[distribute(ignore)]
    pub steps: usize,
}

fn main() {}
