// relu is nonlinear: a partial sum must be reduced first.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Partial, Shard, Sum};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2>) {
    let _ = x.relu();
}

fn main() {}
