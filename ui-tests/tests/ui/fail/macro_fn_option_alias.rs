// `Option<&Alias>` of a tensor would be untyped.
use dtensor::{distribute, DTensor, Result};

type Act = DTensor<f32>;

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn forward(x: &DTensor<f32>, mask: Option<&Act>) -> Result<DTensor<f32>> {
    let _ = mask;
    Ok(x.clone())
}

fn main() {}
