// A Partial attention mask: masking is not linear, reduce it first.
use dtensor::typed::attention::scaled_dot_product_attention_masked;
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Partial, Replicate, Shard, Sum};

type Q = Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 4>;

fn f(q: &Q, k: &Q, v: &Q, mask: &Dt<f32, (dp, tp), (Replicate, Partial<Sum>), 2>) -> dtensor::Result<()> {
    let _ = scaled_dot_product_attention_masked(q, k, v, mask, None)?;
    Ok(())
}

fn main() {}
