// A sum over a Partial<Max> tensor has no partial form.
use dtensor::typed::dims::tp;
use dtensor::typed::Dim;
use dtensor::{Dt, Max, Partial};

fn f(x: &Dt<f32, (tp,), (Partial<Max>,), 2>) {
    let _ = x.sum(Dim::<1>);
}

fn main() {}
