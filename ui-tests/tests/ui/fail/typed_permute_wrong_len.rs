// A rank-4 tensor permuted by a 3-dim order.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Replicate, Shard};

fn f(x: &Dt<f32, (dp, tp), (Replicate, Shard<1>), 4>) {
    let _ = x.permute((Dim::<0>, Dim::<2>, Dim::<1>));
}

fn main() {}
