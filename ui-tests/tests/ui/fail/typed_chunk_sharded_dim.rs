// Chunking a fused qkv projection along its tp-sharded last dim: each chunk would need rows
// from other ranks, so the runtime would gather; the typed op does not compile.
use dtensor::typed::dims::tp;
use dtensor::typed::Dim;
use dtensor::{Dt, Shard};

fn f(qkv: &Dt<f32, (tp,), (Shard<1>,), 2>) {
    let _ = qkv.chunk(3, Dim::<1>);
}

fn main() {}
