// A bias sharded where the activation is sharded: the broadcast operand must be Replicate there.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Replicate, Shard};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>, bias: &Dt<f32, (dp, tp), (Shard<1>, Replicate), 2>) {
    let _ = x.add_broadcast(bias);
}

fn main() {}
