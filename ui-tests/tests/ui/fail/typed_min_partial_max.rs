// min does not commute with a partial max: reduce first.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Max, Partial, Replicate};

fn f(x: &Dt<f32, (dp, tp), (Replicate, Partial<Max>), 2>) -> dtensor::Result<()> {
    let _ = x.min(Dim::<0>)?;
    Ok(())
}

fn main() {}
