// `named_parameters` lists every parameter with one element type.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp", placements = [Shard(0)])]
pub struct Layer {
    pub w: DTensor<f32>,
    pub v: DTensor<f64>,
}

fn main() {}
