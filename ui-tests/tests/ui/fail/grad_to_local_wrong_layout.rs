// A `Shard<0>` value's local gradient is its `Shard<0>` piece: declaring it `Replicate`
// (every rank holding the whole gradient) would silently count it n times.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Replicate, Shard};

fn f(x: &Dt<f32, (dp, tp), (Replicate, Shard<0>), 2>) -> dtensor::Result<()> {
    let _local = x.to_local_grad::<(Replicate, Replicate)>()?;
    Ok(())
}

fn main() {
    let _ = f;
}
