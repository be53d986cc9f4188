// `sqrt` does not commute with a sum: a Partial<Sum> input must be reduced first.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Partial, Shard, Sum};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2>) -> dtensor::Result<()> {
    let _ = x.sqrt()?;
    Ok(())
}

fn main() {}
