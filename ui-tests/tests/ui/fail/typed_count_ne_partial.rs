// A Partial of ids is no id: counting them does not compile.
use dtensor::typed::dims::dp;
use dtensor::{Dt, Partial, Sum};

fn f(ids: &Dt<i64, (dp,), (Partial<Sum>,), 1>) {
    let _ = ids.count_ne::<f32, _>(-100);
}

fn main() {}
