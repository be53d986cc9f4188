// A slice argument of a #[distribute] function is typed: a slice of another layout does not
// compile.
use dtensor::typed::dims::{dp, tp};
use dtensor::{distribute, DTensor, Dt, Replicate};

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn first(xs: &[DTensor<f32>]) -> dtensor::Result<DTensor<f32>> {
    Ok(xs[0].clone())
}

fn caller(ys: &[Dt<f32, (dp, tp), (Replicate, Replicate), 2>]) {
    let _ = first(ys);
}

fn main() {}
