// Shard → Partial is not a legal redistribution (the runtime's table): a compile error at the call.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Partial, Replicate, Shard, Avg};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>) -> dtensor::Result<()> {
    let _y = x.redistribute::<(Partial<Avg>, Replicate)>()?;
    Ok(())
}

fn main() {}
