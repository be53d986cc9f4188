// gather along the dim that tp shards: the index addresses the whole dim.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Replicate, Shard};

fn f(x: &Dt<f32, (dp, tp), (Replicate, Shard<1>), 2>, idx: &Dt<f32, (dp, tp), (Replicate, Shard<1>), 2>) -> dtensor::Result<()> {
    let _ = x.gather(Dim::<1>, idx)?;
    Ok(())
}

fn main() {}
