// A struct on a mesh dim name that is neither predefined nor declared with `mesh_dim!`: one
// error, at the mesh string (not one more per generated impl).
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tpp", placements = [Replicate, Shard(0)])]
pub struct Layer {
    pub w1: DTensor<f32>,
    pub w2: Vec<DTensor<f32>>,
}

fn main() {}
