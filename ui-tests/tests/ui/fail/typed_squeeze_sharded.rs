// Squeezing the size-1 dim that tp shards: the dim would vanish with its shards.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Replicate, Shard};

fn f(x: &Dt<f32, (dp, tp), (Replicate, Shard<1>), 3>) {
    let _ = x.squeeze(Dim::<1>);
}

fn main() {}
