// Softmax over a dim that a mesh dim shards needs two all-reduces: plain `softmax` runs none,
// so the call must say it (`softmax_across_shards`).
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Shard};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2>) -> dtensor::Result<()> {
    let _ = x.softmax(Dim::<1>)?;
    Ok(())
}

fn main() {
    let _ = f;
}
