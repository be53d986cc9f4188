// Softmax of a Partial<Sum> input needs the sum first.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Partial, Shard, Sum};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2>) -> dtensor::Result<()> {
    let _ = x.softmax(Dim::<1>)?;
    Ok(())
}

fn main() {}
