// One placement for a 2-d mesh.
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Shard};

fn f(_x: &Dt<f32, (dp, tp), (Shard<0>,), 2>) {}

fn main() {}
