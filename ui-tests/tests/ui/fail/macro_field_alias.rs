// A tensor field written through a type alias: the macro cannot see it is a tensor, and the
// field must not silently drop out of the parameters.
use dtensor::{distribute, DTensor};

type Weight = DTensor<f32>;

#[distribute(mesh = "dp,tp", placements = [Replicate, Shard(0)])]
pub struct Layer {
    pub w1: DTensor<f32>,
    pub w2: Weight,
}

fn main() {}
