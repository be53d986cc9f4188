// Dividing by a partial value is not linear in it.
use dtensor::typed::dims::tp;
use dtensor::{Dt, Partial, Replicate, Sum};

fn f(a: &Dt<f32, (tp,), (Replicate,), 2>, b: &Dt<f32, (tp,), (Partial<Sum>,), 2>) {
    let _ = a.div(b);
}

fn main() {}
