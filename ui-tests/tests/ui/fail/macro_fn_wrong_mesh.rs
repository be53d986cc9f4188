// A #[distribute] function called with a tensor laid out on another mesh: the error names both
// meshes in the types.
use dtensor::typed::dims::{dp, sp};
use dtensor::{distribute, DTensor, Dt, Replicate, Shard};

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn scale(x: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
    x.add(x)
}

fn caller(y: &Dt<f32, (dp, sp), (Shard<0>, Replicate), 2>) {
    let _ = scale(y);
}

fn main() {}
