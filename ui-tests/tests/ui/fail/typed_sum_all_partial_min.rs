// The sum of every element of a Partial<Min> needs the minimum first.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Min, Partial, Replicate};

fn f(x: &Dt<f32, (dp, tp), (Partial<Min>, Replicate), 2>) -> dtensor::Result<()> {
    let _ = x.sum_all()?;
    Ok(())
}

fn main() {}
