// Integer tensors compare, select and reshape, but float-only ops still do not compile on
// them, with the element type's message: triangles and reductions.
use dtensor::typed::dims::tp;
use dtensor::typed::Dim;
use dtensor::{Dt, Shard};

fn f(ids: &Dt<i64, (tp,), (Shard<0>,), 2>) {
    let _ = ids.lt_mask(ids);
    let _ = ids.tril(0);
    let _ = ids.sum(Dim::<1>);
}

fn main() {}
