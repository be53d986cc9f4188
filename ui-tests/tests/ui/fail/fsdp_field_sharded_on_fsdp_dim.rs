// Under `fsdp = "dp"` a field declares the layout it is used in, which is `Replicate` on dp
// (FSDP keeps it sharded at rest and gathers it for use): a field sharded on dp is refused.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp", fsdp = "dp")]
pub struct Block {
    #[placements = [Shard(0), Shard(1)]]
    pub w1: DTensor<f64>,
    #[placements = [Replicate, Shard(0)]]
    pub w2: DTensor<f64>,
}

fn main() {}
