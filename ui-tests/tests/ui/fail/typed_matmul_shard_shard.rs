// Both operands sharded on dim 0 over `tp`: no matmul rule, a redistribute is needed first.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Replicate, Shard};

fn f(a: &Dt<f32, (dp, tp), (Replicate, Shard<0>), 2>, b: &Dt<f32, (dp, tp), (Replicate, Shard<0>), 2>) {
    let _ = a.matmul(b);
}

fn main() {}
