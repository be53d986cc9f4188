// With `implicit = "allow"` a `#[distribute]` function makes no promise about hidden
// collectives, so it may return a closure or an iterator; other `impl Trait` results
// (`impl Display`, `Box<dyn Error>`) run nothing later and stay allowed under the guard.
use dtensor::{distribute, DTensor, Result};

#[distribute(mesh = "tp", placements = [Partial(Sum)], implicit = "allow")]
fn later(x: &DTensor<f32>) -> impl Fn() -> Result<Vec<usize>> + '_ {
    move || Ok(x.as_dtensor().exp()?.shape().to_vec())
}

#[distribute(mesh = "tp", placements = [Partial(Sum)], implicit = "allow")]
fn lazily(xs: &[DTensor<f32>]) -> impl Iterator<Item = Result<Vec<usize>>> + '_ {
    xs.iter().map(|x| Ok(x.as_dtensor().exp()?.shape().to_vec()))
}

#[distribute(mesh = "tp", placements = [Shard(0)], returns = [Shard(0)])]
fn described(x: &DTensor<f32>) -> std::result::Result<(DTensor<f32>, impl std::fmt::Display), Box<dyn std::error::Error>> {
    Ok((x.add(x)?, "doubled"))
}

fn main() {
    let _ = (later, lazily, described);
}
