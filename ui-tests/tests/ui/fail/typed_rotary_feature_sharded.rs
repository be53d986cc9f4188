// A rotary embedding pairs features: a tensor sharded on its feature dim does not compile.
use dtensor::ops::rotary::RotaryStyle;
use dtensor::typed::dims::tp;
use dtensor::typed::rotary::RotaryTable;
use dtensor::{Dt, Shard};

fn f(q: &Dt<f32, (tp,), (Shard<2>,), 3>, cos: &RotaryTable<f32, (tp,)>, sin: &RotaryTable<f32, (tp,)>) {
    let _ = q.apply_rotary(cos, sin, RotaryStyle::Half);
}

fn main() {}
