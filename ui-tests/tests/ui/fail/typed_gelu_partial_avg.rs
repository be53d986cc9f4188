// `gelu` of a Partial<Avg> input needs the average first.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Avg, Dt, Partial, Shard};

fn f(x: &Dt<f32, (dp, tp), (Partial<Avg>, Shard<1>), 2>) -> dtensor::Result<()> {
    let _ = x.gelu()?;
    Ok(())
}

fn main() {}
