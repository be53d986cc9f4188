// Partial<Sum> has a single matmul partner (Replicate): the hidden `do_not_recommend` impl
// keeps rustc from inferring it and reporting a bare "mismatched types".
use dtensor::typed::dims::tp;
use dtensor::{Dt, Partial, Shard, Sum};

fn f(a: &Dt<f32, (tp,), (Partial<Sum>,), 2>, b: &Dt<f32, (tp,), (Shard<1>,), 2>) {
    let _ = a.matmul(b);
}

fn main() {}
