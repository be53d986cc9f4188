// A parameter holds real values: it cannot be Partial.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp")]
pub struct Layer {
    #[placements = [Replicate, Partial(Sum)]]
    pub w: DTensor<f32>,
}

fn main() {}
