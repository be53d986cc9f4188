// stack inserts a dim: the shard of dim 1 moves to dim 2, and the declared layout must say so.
use dtensor::typed::dims::tp;
use dtensor::typed::Dim;
use dtensor::{Dt, Shard};

fn f(a: &Dt<f32, (tp,), (Shard<1>,), 2>) -> dtensor::Result<()> {
    let _s: Dt<f32, (tp,), (Shard<1>,), 3> = Dt::stack(&[a, a], Dim::<0>)?;
    Ok(())
}

fn main() {}
