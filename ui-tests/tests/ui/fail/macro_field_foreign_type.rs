// A field of a type that is neither a tensor, a `#[distribute]` struct nor plain data.
use dtensor::{distribute, DTensor};
use std::collections::HashMap;

#[distribute(mesh = "tp", placements = [Shard(0)])]
pub struct Layer {
    pub w: DTensor<f32>,
    pub names: HashMap<String, usize>,
}

fn main() {}
