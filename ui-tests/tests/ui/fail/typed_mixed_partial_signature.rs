// A mixed-Partial layout in a signature is an error that `cargo check` reports at the type.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Max, Partial, Sum};

fn f(_x: &Dt<f32, (dp, tp), (Partial<Sum>, Partial<Max>), 2>) {}

fn main() {}
