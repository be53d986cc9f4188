// The product of two partial sums is not the partial sum of products.
use dtensor::typed::dims::tp;
use dtensor::{Dt, Partial, Sum};

fn f(a: &Dt<f32, (tp,), (Partial<Sum>,), 2>, b: &Dt<f32, (tp,), (Partial<Sum>,), 2>) {
    let _ = a.mul(b);
}

fn main() {}
