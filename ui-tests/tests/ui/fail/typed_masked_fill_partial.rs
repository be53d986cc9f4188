// Masking a partial sum (attention scores of a row-parallel product before their
// all-reduce): filling is not linear, so the typed op asks for a `.redistribute()`.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Partial, Replicate, Shard, Sum};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2>, m: &Dt<f32, (dp, tp), (Replicate, Replicate), 2>) {
    let _ = x.masked_fill(m, f32::NEG_INFINITY);
}

fn main() {}
