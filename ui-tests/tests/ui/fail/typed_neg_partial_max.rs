// `neg` keeps Partial<Sum|Avg> but not Partial<Max> (-max(a, b) is not max(-a, -b)).
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Max, Partial, Replicate};

fn f(x: &Dt<f32, (dp, tp), (Replicate, Partial<Max>), 2>) -> dtensor::Result<()> {
    let _ = x.neg()?;
    Ok(())
}

fn main() {}
