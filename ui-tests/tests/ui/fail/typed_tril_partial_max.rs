// `tril` keeps only the Partials of the runtime's table (sum, average).
use dtensor::typed::dims::tp;
use dtensor::{Dt, Max, Partial};

fn f(x: &Dt<f32, (tp,), (Partial<Max>,), 2>) {
    let _ = x.tril(0);
}

fn main() {}
