// Tensors in a container that has no parameter order (`HashMap`).
use dtensor::{distribute, DTensor};
use std::collections::HashMap;

#[distribute(mesh = "tp", placements = [Shard(0)])]
pub struct Layer {
    pub experts: HashMap<String, DTensor<f32>>,
}

fn main() {}
