// Comparing a partial sum: a comparison is not linear.
use dtensor::typed::dims::tp;
use dtensor::{Dt, Partial, Replicate, Sum};

fn f(a: &Dt<f32, (tp,), (Partial<Sum>,), 2>, b: &Dt<f32, (tp,), (Replicate,), 2>) {
    let _ = a.lt_mask(b);
}

fn main() {}
