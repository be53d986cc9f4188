// In a trait impl the trait fixes the signature: only `&DTensor<T>` / `DTensor<T>` arguments
// can be checked on entry, and the result must be `Result<DTensor<T>>`.
use dtensor::{distribute, DTensor, Result};

pub trait Mix {
    fn mix(&self, xs: &[DTensor<f32>]) -> Result<DTensor<f32>>;
    fn count(&self, x: &DTensor<f32>) -> usize;
}

pub struct Block;

#[distribute(mesh = "tp", placements = [Shard(0)])]
impl Mix for Block {
    fn mix(&self, xs: &[DTensor<f32>]) -> Result<DTensor<f32>> {
        Ok(xs[0].clone().into_dtensor())
    }
    fn count(&self, x: &DTensor<f32>) -> usize {
        x.shape()[0]
    }
}

fn main() {}
