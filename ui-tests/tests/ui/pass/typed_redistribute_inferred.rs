//! `x.op(&y.redistribute()?)` in a `#[distribute]` body: the operand takes the layout the op
//! needs beside the receiver's (the receiver's own; `Replicate` where a `Partial` receiver is
//! multiplied), in any expression position (nested, parenthesized, at the start of a statement,
//! on a `&mut` receiver), in a function and in a trait method; every value equals one rank's.
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::{distribute, DTensor, Dt, Forward, Partial, Replicate, Shard, Sum};

type Act = Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>;

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn combine(x: &DTensor<f32>, y: &DTensor<f32>) -> dtensor::Result<(DTensor<f32>, DTensor<f32>)> {
    let p: Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2> = y.redistribute()?; // no communication
    let ys: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = y.redistribute()?; // a local slice
    let s = x.add(&p.redistribute()?)?; // all-reduce over tp: x + y
    let d = s.sub(&(ys.redistribute()?))?; // all-gather over tp: x
    let m = d.mul(&x.mul(&s.redistribute()?)?.redistribute()?)?; // x * (x * (x + y))
    let mask = s.lt_mask(&ys.redistribute()?)?; // (x + y) < y: all 0 for positive x
    // A Partial receiver of mul takes a Replicate operand (all-gather over tp): p * y.
    let py: Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2> = p.mul(&ys.redistribute()?)?;
    let mut outs = [m.div(&s.redistribute()?)?, mask];
    for o in outs.iter_mut() {
        *o = o.add(&py.redistribute()?)?; // on a `&mut` receiver: all-reduce over tp
    }
    let [a, b] = outs;
    Ok((a, b))
}

#[distribute(mesh = "dp,tp")]
struct Scale {
    #[placements = [Replicate, Replicate]]
    w: DTensor<f32>,
}

#[distribute]
impl Forward<f32> for Scale {
    #[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
    fn forward(&self, x: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
        let p: Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2> = x.redistribute()?;
        let w: Dt<f32, (dp, tp), (Shard<0>, Replicate), 2> = self.w.redistribute()?;
        x.mul(&w)?.add(&p.redistribute()?) // x * w + x
    }
}

/// Outside a body the target is named through a tensor of that layout.
fn outside(x: &Act, p: &Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2>) -> dtensor::Result<Act> {
    x.add(&p.redistribute_like(x)?)
}

fn main() {
    let x = ArrayD::from_shape_fn(IxDyn(&[6, 4]), |ix| 1.0 + (ix[0] * 4 + ix[1]) as f32 / 8.0);
    let y = ArrayD::from_shape_fn(IxDyn(&[6, 4]), |ix| 0.5 + ((ix[0] * 5 + ix[1] * 3) % 7) as f32 / 4.0);
    let w = ArrayD::from_shape_fn(IxDyn(&[6, 4]), |ix| 0.25 * (ix[0] + ix[1]) as f32);
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let (xd, yd): (Act, Act) = (Dt::distribute(&x, &mesh)?, Dt::distribute(&y, &mesh)?);
        let (a, b) = combine(&xd, &yd)?;
        let p: Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2> = yd.redistribute()?;
        let sum = outside(&xd, &p)?.full_tensor()?;
        let scale = Scale::distribute(ScaleGlobal { w: w.clone() }, &mesh)?;
        let f = Forward::forward(&scale, xd.as_dtensor())?.full_tensor()?;
        Ok((a.full_tensor()?, b.full_tensor()?, sum, f))
    })
    .unwrap();
    let s = &x + &y;
    let m = &(&s - &y) * &(&x * &s);
    let py = &y * &y;
    let expect_a = &(m / &s) + &py;
    let expect_b = &s.mapv(|_| 0.0f32) + &py; // the mask is all 0: x > 0
    for (a, b, sum, f) in out {
        assert_eq!(a, expect_a);
        assert_eq!(b, expect_b);
        assert_eq!(sum, &x + &y);
        assert_eq!(f, &(&x * &w) + &x);
    }
}
