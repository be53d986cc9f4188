// `clamp` is not linear: a Partial<Sum> input must be reduced first (call .redistribute()).
use dtensor::typed::dims::{dp, tp};
use dtensor::{Sum, Dt, Partial, Shard};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2>) -> dtensor::Result<()> {
    let _ = x.clamp(Some(0.0), None)?;
    Ok(())
}

fn main() {}
