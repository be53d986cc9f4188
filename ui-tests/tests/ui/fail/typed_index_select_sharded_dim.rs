// index_select along the vocab dim that tp shards: the ids address the whole dim.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Replicate, Shard};

fn f(w: &Dt<f32, (dp, tp), (Replicate, Shard<0>), 2>, ids: &Dt<f32, (dp, tp), (Replicate, Replicate), 1>) -> dtensor::Result<()> {
    let _ = w.index_select(Dim::<0>, ids)?;
    Ok(())
}

fn main() {}
