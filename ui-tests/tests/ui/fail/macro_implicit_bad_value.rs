// `implicit` takes "allow" or "deny".
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp", placements = [Shard(0)], implicit = "sometimes")]
fn scale(x: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
    x.add(x)
}

fn main() {}
