// Logits sharded on the class dim (loss parallelism) need collectives: plain `cross_entropy`
// runs none, so the call must say it (`cross_entropy_loss_parallel`).
use dtensor::typed::dims::tp;
use dtensor::{Dt, Partial, Replicate, Shard, Sum};

fn f(logits: &Dt<f32, (tp,), (Shard<1>,), 2>, ids: &Dt<i64, (tp,), (Replicate,), 1>) -> dtensor::Result<()> {
    let _: Dt<f32, (tp,), (Partial<Sum>,), 0> = logits.cross_entropy(ids)?;
    Ok(())
}

fn main() {
    let _ = f;
}
