// An order that names dim 1 twice is not a permutation.
use dtensor::typed::dims::tp;
use dtensor::typed::Dim;
use dtensor::{Dt, Replicate};

fn f(x: &Dt<f32, (tp,), (Replicate,), 3>) {
    let _ = x.permute((Dim::<0>, Dim::<1>, Dim::<1>));
}

fn main() {}
