// A function in which nothing would be typed.
use dtensor::distribute;

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn steps(n: usize) -> usize {
    n + 1
}

fn main() {
    let _ = steps(1);
}
