// Batch dim sharded on the left operand only: both batched operands must shard it alike.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Replicate, Shard};

fn f(q: &Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 4>, k: &Dt<f32, (dp, tp), (Replicate, Shard<1>), 4>) {
    let _ = q.matmul_batched(k);
}

fn main() {}
