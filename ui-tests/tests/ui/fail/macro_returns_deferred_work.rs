// A `#[distribute]` body runs under a guard that refuses hidden collectives. A closure,
// iterator or future in the result would run ops after the guard ended: refused, in every
// position of the result, and `async` too.
use dtensor::{distribute, DTensor, Result};

#[distribute(mesh = "tp", placements = [Partial(Sum)])]
fn later(x: &DTensor<f32>) -> impl Fn() -> Result<DTensor<f32>> + '_ {
    move || x.exp()
}

#[distribute(mesh = "tp", placements = [Partial(Sum)])]
fn later_in_result(x: &DTensor<f32>) -> Result<Box<dyn Fn() -> Result<DTensor<f32>> + '_>> {
    Ok(Box::new(move || x.exp()))
}

#[distribute(mesh = "tp", placements = [Partial(Sum)])]
fn lazily(xs: &[DTensor<f32>]) -> impl Iterator<Item = Result<DTensor<f32>>> + '_ {
    xs.iter().map(|x| x.exp())
}

#[distribute(mesh = "tp", placements = [Partial(Sum)], returns = [Replicate])]
async fn eventually(x: &DTensor<f32>) -> Result<DTensor<f32>> {
    x.redistribute()
}

fn main() {}
