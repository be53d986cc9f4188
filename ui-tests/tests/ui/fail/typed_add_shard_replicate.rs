// Pointwise ops need the same layout on both sides (the dynamic op would redistribute).
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Replicate, Shard};

fn f(a: &Dt<f64, (dp, tp), (Shard<0>, Replicate), 2>, b: &Dt<f64, (dp, tp), (Replicate, Replicate), 2>) {
    let _ = a.add(b);
}

fn main() {}
