// An empty mesh string.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "", placements = [Replicate])]
pub struct Layer {
    pub w: DTensor<f32>,
}

fn main() {}
