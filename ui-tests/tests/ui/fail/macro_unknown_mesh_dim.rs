// A placement for a mesh dim the mesh does not have.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp")]
pub struct Layer {
    #[placements = [pp = Shard(0)]]
    pub w: DTensor<f32>,
}

fn main() {}
