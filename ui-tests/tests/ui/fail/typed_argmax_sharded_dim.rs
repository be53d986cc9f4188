// argmax over the dim that tp shards: per-shard indices do not combine (not linear).
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Replicate, Shard};

fn f(x: &Dt<f32, (dp, tp), (Replicate, Shard<1>), 2>) -> dtensor::Result<()> {
    let _ = x.argmax(Dim::<1>)?;
    Ok(())
}

fn main() {}
