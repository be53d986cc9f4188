// Inside a #[distribute] function the typed rules apply: x (S0, R) @ w (S0, R) is illegal.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn project(x: &DTensor<f32>, w: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
    x.matmul(w)
}

fn main() {}
