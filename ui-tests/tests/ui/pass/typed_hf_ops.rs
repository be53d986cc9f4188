// The typed ops a Hugging Face checkpoint needs: `linear` with `[out, in]` weights
// (column- then row-parallel), rotary embeddings on head-sharded queries, and the
// ignore-index loss whose mean's collectives are written out.
use dtensor::ops::rotary::RotaryStyle;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::rotary::{rotary_tables, RotaryTable};
use dtensor::{Dt, Partial, Replicate, Shard, Sum};

type M = (dp, tp);

fn mlp(
    x: &Dt<f32, M, (Shard<0>, Replicate), 3>,
    up: &Dt<f32, M, (Replicate, Shard<0>), 2>,
    down: &Dt<f32, M, (Replicate, Shard<1>), 2>,
) -> dtensor::Result<Dt<f32, M, (Shard<0>, Partial<Sum>), 3>> {
    let h: Dt<f32, M, (Shard<0>, Shard<2>), 3> = x.linear(up)?;
    h.silu()?.linear(down)
}

fn rope(
    q: &Dt<f32, M, (Shard<0>, Shard<1>), 4>,
    cos: &RotaryTable<f32, M>,
    sin: &RotaryTable<f32, M>,
) -> dtensor::Result<Dt<f32, M, (Shard<0>, Shard<1>), 4>> {
    q.apply_rotary(cos, sin, RotaryStyle::Interleaved)
}

fn loss(
    logits: &Dt<f32, M, (Shard<0>, Shard<2>), 3>,
    labels: &Dt<i64, M, (Shard<0>, Replicate), 2>,
) -> dtensor::Result<Dt<f32, M, (Replicate, Replicate), 0>> {
    let total: Dt<f32, M, (Partial<Sum>, Partial<Sum>), 0> = logits.cross_entropy_sum_loss_parallel(labels, Some(-100))?;
    let n: Dt<f32, M, (Partial<Sum>, Replicate), 0> = labels.count_ne(-100)?;
    let total: Dt<f32, M, (Replicate, Replicate), 0> = total.redistribute()?;
    let n: Dt<f32, M, (Replicate, Replicate), 0> = n.redistribute()?;
    total.div(&n)
}

fn main() {
    let _ = (mlp, rope, loss, rotary_tables::<f32, M>);
}
