// A result written through an alias would be untyped.
use dtensor::{distribute, DTensor, Result};

type Act = DTensor<f32>;

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn forward(x: &DTensor<f32>) -> Result<Act> {
    Ok(x.clone().into())
}

fn main() {}
