//! `x.op(&y.redistribute()?)` in a `#[distribute]` body: the operand takes the receiver's
//! layout (what `Dt::redistribute_like` says outside a body), in any expression position
//! (nested, parenthesized, at the start of a statement); the values equal one rank's.
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::{distribute, DTensor, Dt, Partial, Replicate, Shard, Sum};

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn combine(x: &DTensor<f32>, y: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
    let p: Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2> = y.redistribute()?; // no communication
    let ys: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = y.redistribute()?; // a local slice
    let s = x.add(&p.redistribute()?)?; // all-reduce over tp: x + y
    let d = s.sub(&(ys.redistribute()?))?; // all-gather over tp: x
    let m = d.mul(&x.mul(&s.redistribute()?)?.redistribute()?)?; // x * (x * (x + y))
    s.lt_mask(&ys.redistribute()?)?.full_tensor()?; // at the start of a statement
    m.div(&s.redistribute()?)
}

/// Outside a body the target is named through a tensor of that layout.
fn outside(
    x: &Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>,
    p: &Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2>,
) -> dtensor::Result<Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>> {
    x.add(&p.redistribute_like(x)?)
}

fn main() {
    let x = ArrayD::from_shape_fn(IxDyn(&[6, 4]), |ix| 1.0 + (ix[0] * 4 + ix[1]) as f32 / 8.0);
    let y = ArrayD::from_shape_fn(IxDyn(&[6, 4]), |ix| 0.5 + ((ix[0] * 5 + ix[1] * 3) % 7) as f32 / 4.0);
    let expect = ndarray_expect(&x, &y);
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let placed = |a: &ArrayD<f32>| -> dtensor::Result<Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>> {
            Dt::distribute(a, &mesh)
        };
        let (xd, yd) = (placed(&x)?, placed(&y)?);
        let got = combine(&xd, &yd)?.full_tensor()?;
        let p: Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2> = yd.redistribute()?;
        let sum = outside(&xd, &p)?.full_tensor()?;
        Ok((got, sum))
    })
    .unwrap();
    for (got, sum) in out {
        assert_eq!(got, expect);
        assert_eq!(sum, &x + &y);
    }
}

fn ndarray_expect(x: &ArrayD<f32>, y: &ArrayD<f32>) -> ArrayD<f32> {
    let s = x + y;
    let d = &s - y;
    let m = &d * &(x * &s);
    m / s
}
