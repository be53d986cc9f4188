// An op whose output layout would mix two Partial reduce ops does not compile.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Avg, Dt, Partial, Replicate, Sum};

fn f(
    a: &Dt<f32, (dp, tp), (Partial<Sum>, Replicate), 2>,
    b: &Dt<f32, (dp, tp), (Replicate, Partial<Avg>), 2>,
) -> dtensor::Result<()> {
    let _ = a.add(b)?;
    Ok(())
}

fn main() {}
