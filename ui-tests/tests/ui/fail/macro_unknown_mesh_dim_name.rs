// A mesh dim name that is neither predefined nor declared with `mesh_dim!`.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tpp", placements = [Shard(0), Replicate])]
fn scale(x: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
    x.add(x)
}

fn main() {}
