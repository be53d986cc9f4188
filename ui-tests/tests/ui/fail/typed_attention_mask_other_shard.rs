// Heads are sharded over tp but the mask is sharded on the query dim: it must follow the output.
use dtensor::typed::attention::scaled_dot_product_attention_masked;
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Replicate, Shard};

type Q = Dt<f32, (dp, tp), (Replicate, Shard<1>), 4>;

fn f(q: &Q, k: &Q, v: &Q, mask: &Dt<f32, (dp, tp), (Replicate, Shard<2>), 4>) -> dtensor::Result<()> {
    let _ = scaled_dot_product_attention_masked(q, k, v, mask, None)?;
    Ok(())
}

fn main() {}
