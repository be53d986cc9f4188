// A parameter field written directly as a `Partial` typed tensor: parameters hold real values.
use dtensor::typed::dims::tp;
use dtensor::{distribute, Dt, Partial, Sum};

#[distribute(mesh = "tp")]
struct Layer {
    w: Dt<f32, (tp,), (Partial<Sum>,), 2>,
}

fn main() {}
