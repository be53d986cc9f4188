// A vocab-parallel table looked up at batch-sharded ids on the same mesh dim: the runtime
// would gather one of them first.
use dtensor::typed::dims::tp;
use dtensor::{Dt, Shard};

fn f(w: &Dt<f32, (tp,), (Shard<0>,), 2>, ids: &Dt<f32, (tp,), (Shard<0>,), 2>) {
    let _: Result<Dt<f32, (tp,), _, 3>, _> = w.embedding(ids);
}

fn main() {}
