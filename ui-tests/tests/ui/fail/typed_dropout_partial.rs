// `dropout` is not linear: a Partial<Avg> input must be reduced first (call .redistribute()).
use dtensor::typed::dims::{dp, tp};
use dtensor::{Avg, Dt, Partial, Shard};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Partial<Avg>), 2>) -> dtensor::Result<()> {
    let _ = x.dropout(0.1, true)?;
    Ok(())
}

fn main() {}
