// A #[distribute] function called with a tensor of another layout.
use dtensor::typed::dims::{dp, tp};
use dtensor::{distribute, DTensor, Dt, Replicate, Shard};

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn scale(x: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
    x.add(x)
}

fn caller(y: &Dt<f32, (dp, tp), (Replicate, Shard<1>), 2>) {
    let _ = scale(y);
}

fn main() {}
