// Cross-entropy of partial-sum logits (an LM head's row-parallel output before its
// all-reduce): log-softmax is not linear.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Partial, Replicate, Shard, Sum};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2>, t: &Dt<f32, (dp, tp), (Shard<0>, Replicate), 1>) {
    let _ = x.cross_entropy(t);
}

fn main() {}
