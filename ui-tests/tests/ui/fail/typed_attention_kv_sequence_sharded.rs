// Keys and values sharded on the sequence dim: each rank would need every key (ring
// attention is not a typed rule), so the typed op asks for a `.redistribute()`.
use dtensor::typed::attention::scaled_dot_product_attention;
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Shard};

fn f(q: &Dt<f32, (dp, tp), (Shard<0>, Shard<2>), 4>, kv: &Dt<f32, (dp, tp), (Shard<0>, Shard<2>), 4>) {
    let _ = scaled_dot_product_attention(q, kv, kv, true, None);
}

fn main() {}
