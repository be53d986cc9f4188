//! A typed `local_map` whose declared gradient layout is wrong for the input's layout.

use dtensor::typed::dims::tp;
use dtensor::typed::{Dt, Partial, Replicate, Shard, Sum};

fn f(x: &Dt<f32, (tp,), (Shard<0>,), 2>, p: &Dt<f32, (tp,), (Partial<Sum>,), 2>) {
    // a Shard<0> value's gradient is Shard<0>
    let _: dtensor::Result<Dt<f32, (tp,), (Shard<0>,), 2>> = x.local_map::<(Replicate,), _, _>("f", None, |l| Ok(l.clone()));
    // a Partial value's gradient is the whole gradient
    let _: dtensor::Result<Dt<f32, (tp,), (Replicate,), 2>> =
        p.local_map::<(Partial<Sum>,), _, _>("g", None, |l| Ok(l.clone()));
}

fn main() {}
