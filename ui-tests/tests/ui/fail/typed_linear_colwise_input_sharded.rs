// Column-parallel weight (`[out, in]` sharded on its output rows) with an input sharded on its
// features: the features would have to be gathered first.
use dtensor::typed::dims::tp;
use dtensor::{Dt, Shard};

fn f(x: &Dt<f32, (tp,), (Shard<1>,), 2>, w: &Dt<f32, (tp,), (Shard<0>,), 2>) {
    let _ = x.linear(w);
}

fn main() {}
