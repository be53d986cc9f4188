// Float-only ops on an integer tensor do not compile, with a message that says why.
use dtensor::typed::dims::tp;
use dtensor::typed::Dim;
use dtensor::{Dt, Shard};

fn f(ids: &Dt<i64, (tp,), (Shard<0>,), 2>, w: &Dt<i64, (tp,), (dtensor::Replicate,), 2>) {
    let _ = ids.exp();
    let _ = ids.softmax(Dim::<1>);
    let _ = ids.div(ids);
    let _ = ids.mean(Dim::<0>);
    let _ = ids.matmul(w);
}

fn main() {}
