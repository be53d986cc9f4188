// An integer element type behind an alias: the macro cannot see it is not a float, so the
// `Element` bound reports it, once, at the element type (not once per generated item).
use dtensor::{distribute, DTensor};

type TokenId = i64;

#[distribute(mesh = "tp", placements = [Shard(0)])]
pub struct Tokens {
    pub ids: DTensor<TokenId>,
}

fn main() {}
