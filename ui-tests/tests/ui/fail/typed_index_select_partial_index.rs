// A Partial index has no meaning: ids must be whole numbers on every rank.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Partial, Replicate, Sum};

fn f(x: &Dt<f32, (dp, tp), (Replicate, Replicate), 2>, ids: &Dt<f32, (dp, tp), (Replicate, Partial<Sum>), 1>) -> dtensor::Result<()> {
    let _ = x.index_select(Dim::<1>, ids)?;
    Ok(())
}

fn main() {}
