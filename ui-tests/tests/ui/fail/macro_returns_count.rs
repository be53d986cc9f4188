// `returns` with one list per tensor needs as many lists as the result has tensors.
use dtensor::{distribute, DTensor, Result};

#[distribute(mesh = "tp", placements = [Shard(0)], returns = [[Replicate], [Shard(0)], [Replicate]])]
fn split(x: &DTensor<f32>) -> Result<(DTensor<f32>, DTensor<f32>)> {
    Ok((x.clone(), x.clone()))
}

fn main() {}
