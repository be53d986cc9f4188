// A tensor argument written through a type alias would be untyped.
use dtensor::{distribute, DTensor, Result};

type Act = DTensor<f32>;

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn forward(x: &DTensor<f32>, residual: &Act) -> Result<DTensor<f32>> {
    let _ = residual;
    Ok(x.clone())
}

fn main() {}
