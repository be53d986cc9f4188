// A reduce op `Partial` does not know.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp", placements = [Shard(0), Partial(Median)])]
fn forward(x: &DTensor<f32>) -> DTensor<f32> {
    x.clone()
}

fn main() {}
