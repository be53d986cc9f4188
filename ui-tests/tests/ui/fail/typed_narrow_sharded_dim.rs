// Narrowing the sequence dim that tp shards: the runtime would gather it first.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Replicate, Shard};

fn f(x: &Dt<f32, (dp, tp), (Replicate, Shard<1>), 3>) {
    let _ = x.narrow(Dim::<1>, 0, 4);
}

fn main() {}
