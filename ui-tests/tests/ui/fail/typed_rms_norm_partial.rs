// RMS norm of a partial sum (a row-parallel output before its all-reduce).
use dtensor::typed::dims::tp;
use dtensor::{Dt, Partial, Sum};

fn f(x: &Dt<f32, (tp,), (Partial<Sum>,), 2>) {
    let _ = x.rms_norm([8], None, 1e-5);
}

fn main() {}
