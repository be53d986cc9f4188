// `#[distribute]` on a method of a trait impl, without `#[distribute]` on the impl block: the
// method gets a typed signature, which the trait's does not match. Put `#[distribute]` on the
// impl block (see the pass case `macro_methods.rs`).
use dtensor::{distribute, DTensor, Forward, Result};

pub struct Block;

impl Forward<f32> for Block {
    #[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
    fn forward(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> {
        x.add(x)
    }
}

fn main() {}
