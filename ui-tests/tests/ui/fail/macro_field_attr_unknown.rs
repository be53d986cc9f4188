// On a field, `#[distribute]` takes `skip` (a field without parameters) or `buffer`.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp", placements = [Shard(0)])]
pub struct Layer {
    pub w: DTensor<f32>,
    #[distribute(ignore)]
    pub steps: usize,
}

fn main() {}
