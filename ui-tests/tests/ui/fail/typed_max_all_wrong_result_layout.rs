// The max of a sharded tensor is a Partial<Max>, not a Partial<Sum>: the declared result
// layout does not match.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Partial, Replicate, Shard, Sum};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>) -> dtensor::Result<Dt<f32, (dp, tp), (Partial<Sum>, Replicate), 0>> {
    x.max_all()
}

fn main() {}
