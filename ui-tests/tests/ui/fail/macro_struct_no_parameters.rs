// A struct with only plain data has nothing to distribute.
use dtensor::distribute;

#[distribute(mesh = "tp", placements = [Shard(0)])]
pub struct Config {
    pub layers: usize,
    pub name: String,
}

fn main() {}
