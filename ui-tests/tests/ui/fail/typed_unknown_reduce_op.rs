// `Partial<Op>` only takes the reduce-op markers.
use dtensor::typed::dims::tp;
use dtensor::{Dt, Partial};

pub enum Median {}

fn f(_x: &Dt<f32, (tp,), (Partial<Median>,), 2>) {}

fn main() {}
