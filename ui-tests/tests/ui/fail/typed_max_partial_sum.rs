// The max of a partial sum is not the partial of a max: reduce first.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Partial, Replicate, Sum};

fn f(x: &Dt<f32, (dp, tp), (Replicate, Partial<Sum>), 2>) -> dtensor::Result<()> {
    let _ = x.max(Dim::<0>)?;
    Ok(())
}

fn main() {}
