// A nested module with another element type than the container's parameters.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp", placements = [Shard(0)])]
pub struct Inner {
    pub w: DTensor<f64>,
}

#[distribute(mesh = "tp", placements = [Shard(0)])]
pub struct Outer {
    pub w: DTensor<f32>,
    pub inner: Vec<Inner>,
}

fn main() {}
