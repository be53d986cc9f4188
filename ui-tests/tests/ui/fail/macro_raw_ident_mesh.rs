// A raw identifier as a mesh dim name is an error at the mesh string, not a panic.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "r#dp,tp", placements = [Shard(0), Replicate])]
pub struct Layer {
    pub w: DTensor<f32>,
}

fn main() {}
