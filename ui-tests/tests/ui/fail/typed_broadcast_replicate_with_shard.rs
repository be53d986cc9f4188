// A replicated activation with a sharded broadcast operand: the runtime would redistribute.
use dtensor::typed::dims::tp;
use dtensor::{Dt, Replicate, Shard};

fn f(x: &Dt<f32, (tp,), (Replicate,), 2>, scale: &Dt<f32, (tp,), (Shard<0>,), 1>) {
    let _ = x.mul_broadcast(scale);
}

fn main() {}
