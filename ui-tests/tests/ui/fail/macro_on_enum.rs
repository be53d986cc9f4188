// #[distribute] on something that is neither a struct nor a function.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "tp")]
pub enum Layer {
    Dense(DTensor<f32>),
}

fn main() {}
