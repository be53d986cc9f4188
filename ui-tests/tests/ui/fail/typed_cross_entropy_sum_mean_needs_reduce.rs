// The mean over the counted targets divides two Partial sums: their reduction must be written
// (a division of partial sums is not linear).
use dtensor::typed::dims::dp;
use dtensor::{Dt, Shard};

fn f(x: &Dt<f32, (dp,), (Shard<0>,), 2>, t: &Dt<i64, (dp,), (Shard<0>,), 1>) -> dtensor::Result<()> {
    let total = x.cross_entropy_sum(t, Some(-100))?;
    let n = t.count_ne::<f32, _>(-100)?;
    let _ = total.div(&n);
    Ok(())
}

fn main() {}
