//! A user's ops on layouts their typed rules do not allow: each one error, with the user's
//! message, naming the mesh dim.

use dtensor::typed::dims::{dp, tp};
use dtensor::typed::{Dt, Replicate, Shard};
use dtensor_user_ops::{Linear, RmsNormLinear, SwiGlu};

type T2<L> = Dt<f32, (dp, tp), L, 2>;

// gate and up laid out differently on tp
fn swiglu(a: &T2<(Shard<0>, Shard<1>)>, b: &T2<(Shard<0>, Replicate)>) {
    let _: dtensor::Result<T2<(Shard<0>, Shard<1>)>> = a.apply_op2(&SwiGlu, b);
}

// x sharded on `in` but W replicated: half a dot product per rank
fn linear(x: &T2<(Shard<1>, Replicate)>, w: &T2<(Replicate, Replicate)>) {
    let _: dtensor::Result<T2<(Replicate, Replicate)>> = x.apply_op2(&Linear, w);
}

// three inputs: x split on its last dim, which the norm reads whole
fn norm_linear(
    x: &T2<(Replicate, Shard<1>)>,
    g: &Dt<f32, (dp, tp), (Replicate, Replicate), 1>,
    w: &T2<(Replicate, Replicate)>,
) {
    let _: dtensor::Result<T2<(Replicate, Replicate)>> = x.apply_op3(&RmsNormLinear { eps: 1e-6 }, g, w);
}

fn main() {}
