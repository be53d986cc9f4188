// A Partial cannot change its reduce op by redistribution.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Avg, Dt, Partial, Replicate, Sum};

fn f(x: &Dt<f32, (dp, tp), (Replicate, Partial<Sum>), 2>) -> dtensor::Result<()> {
    let _y: Dt<f32, (dp, tp), (Replicate, Partial<Avg>), 2> = x.redistribute()?;
    Ok(())
}

fn main() {}
