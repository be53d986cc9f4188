// Sequence-parallel activation normalised over its sharded hidden dim: the runtime would
// all-gather it first, so the typed op asks for a `.redistribute()`.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Replicate, Shard};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Shard<2>), 3>, w: &Dt<f32, (dp, tp), (Replicate, Replicate), 1>) {
    let _ = x.layer_norm([8], Some(w), None, 1e-5);
}

fn main() {}
