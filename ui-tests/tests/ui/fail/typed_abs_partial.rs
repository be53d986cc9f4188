// `abs` is not linear: a Partial<Max> input must be reduced first (call .redistribute()).
use dtensor::typed::dims::{dp, tp};
use dtensor::{Max, Dt, Partial, Shard};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Partial<Max>), 2>) -> dtensor::Result<()> {
    let _ = x.abs()?;
    Ok(())
}

fn main() {}
