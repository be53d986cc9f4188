// [b, s, nh, hd] sharded on hd (an inner dim of the flattened group [nh, hd]): the runtime
// would redistribute, so the typed op asks for a `.redistribute()`.
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dims;
use dtensor::{Dt, Shard};

fn f(x: &Dt<f32, (dp, tp), (Shard<0>, Shard<3>), 4>) {
    let _ = x.flatten(Dims::<2, 3>);
}

fn main() {}
