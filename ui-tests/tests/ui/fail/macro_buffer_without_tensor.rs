// `#[distribute(buffer)]` marks tensors written out in the field; a nested struct declares its
// own buffers, and plain data holds none.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp")]
pub struct Inner {
    #[placements = [Replicate, Replicate]]
    pub w: DTensor<f32>,
}

#[distribute(mesh = "dp,tp")]
pub struct Outer {
    #[distribute(buffer)]
    pub inner: Inner,
    #[distribute(buffer)]
    pub count: usize,
    #[placements = [Replicate, Replicate]]
    pub w: DTensor<f32>,
}

fn main() {}
