// A mean keeps Partial<Sum|Avg>, not Partial<Max>.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Max, Partial, Shard};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Partial<Max>), 2>) -> dtensor::Result<()> {
    let _ = x.mean(Dim::<1>)?;
    Ok(())
}

fn main() {}
