// Adding a constant to a Partial<Sum> would add it once per rank.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Partial, Replicate, Sum};

fn f(x: &Dt<f32, (dp, tp), (Replicate, Partial<Sum>), 2>) -> dtensor::Result<()> {
    let _ = x.add_scalar(1.0)?;
    Ok(())
}

fn main() {}
