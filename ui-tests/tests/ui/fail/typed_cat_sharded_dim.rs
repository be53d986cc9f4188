// Concatenating batch-sharded tensors along the batch dim: the runtime would gather it.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Replicate, Shard};

fn f(a: &Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>, b: &Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>) {
    let _ = Dt::cat(&[a, b], Dim::<0>);
}

fn main() {}
