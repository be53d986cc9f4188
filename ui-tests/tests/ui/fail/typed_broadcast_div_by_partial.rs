// Division by a partial broadcast operand is not linear.
use dtensor::typed::dims::tp;
use dtensor::{Dt, Partial, Replicate, Sum};

fn f(x: &Dt<f32, (tp,), (Replicate,), 2>, d: &Dt<f32, (tp,), (Partial<Sum>,), 2>) {
    let _ = x.div_broadcast(d);
}

fn main() {}
