// The tensor fields of a `#[distribute]` struct are parameters, which are floats: an integer
// field is the floating-point element type error (integer tensors go in `#[distribute]` fns).
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp", placements = [Shard(0)])]
pub struct Tokens {
    pub ids: DTensor<i64>,
}

fn main() {}
