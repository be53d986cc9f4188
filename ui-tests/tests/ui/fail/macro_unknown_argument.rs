// A misspelt macro argument.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp", placement = [Replicate, Shard(1)])]
pub struct Layer {
    pub w: DTensor<f32>,
}

fn main() {}
