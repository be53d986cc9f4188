// Scaling keeps sums and averages, not a Partial<Max> (a negative factor swaps max and min).
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Max, Partial, Replicate};

fn f(x: &Dt<f32, (dp, tp), (Partial<Max>, Replicate), 2>) -> dtensor::Result<()> {
    let _ = x.mul_scalar(2.0)?;
    Ok(())
}

fn main() {}
