// expand (and so repeat_interleave) does not keep a partial product: reduce first.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Partial, Product, Shard};

fn f(kv: &Dt<f32, (dp, tp), (Shard<0>, Partial<Product>), 4>) -> dtensor::Result<()> {
    let _ = kv.repeat_interleave(2, Dim::<1>)?;
    Ok(())
}

fn main() {}
