// `x.add(&y.redistribute()?)` in a #[distribute] body asks for `y` in `x`'s layout: where that
// is no legal redistribution (a shard into a `Partial<Avg>`), the error is the redistribute's,
// at the user's `redistribute`.
use dtensor::typed::dims::{dp, tp};
use dtensor::{distribute, Avg, DTensor, Dt, Partial, Shard};

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn f(x: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
    let a: Dt<f32, (dp, tp), (Shard<0>, Partial<Avg>), 2> = x.redistribute()?;
    let ys: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = x.redistribute()?;
    a.add(&ys.redistribute()?)?.redistribute()
}

fn main() {}
