// Log-softmax of a Partial<Avg> input needs the average first.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Avg, Dt, Partial, Replicate};

fn f(x: &Dt<f32, (dp, tp), (Partial<Avg>, Replicate), 2>) -> dtensor::Result<()> {
    let _ = x.log_softmax(Dim::<0>)?;
    Ok(())
}

fn main() {}
