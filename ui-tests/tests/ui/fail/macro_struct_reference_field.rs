// A `#[distribute]` struct owns its parameters.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp", placements = [Shard(0)])]
pub struct Layer<'a> {
    pub w: &'a DTensor<f32>,
}

fn main() {}
