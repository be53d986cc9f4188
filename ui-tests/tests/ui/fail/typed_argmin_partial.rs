// argmin of a partial sum is not the partial of an argmin: reduce first.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Partial, Shard, Sum};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2>) -> dtensor::Result<()> {
    let _ = x.argmin(Dim::<1>)?;
    Ok(())
}

fn main() {}
