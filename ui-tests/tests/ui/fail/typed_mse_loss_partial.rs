// The mean squared error of a partial sum: the square is not linear.
use dtensor::typed::dims::tp;
use dtensor::{Dt, Partial, Sum};

fn f(x: &Dt<f32, (tp,), (Partial<Sum>,), 2>, y: &Dt<f32, (tp,), (Partial<Sum>,), 2>) {
    let _ = x.mse_loss(y);
}

fn main() {}
