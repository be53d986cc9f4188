//! Attention heads inside a `#[distribute]` fn on a dp × tp mesh: the hidden dim, sharded over
//! tp, is split into heads (`unflatten`: the shard lands on the heads dim), the heads move
//! before the sequence (`permute`), batched matmuls run with batch and heads sharded, and the
//! heads move back and merge (`flatten`: the heads dim is the outer one of the group, so the
//! shard stays). `narrow` / `cat` along the unsharded sequence dim and `unsqueeze` / `squeeze`
//! keep the layout. Every layout is computed by the types, nothing communicates, and the
//! result is checked against a single-device loop.
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::{Dim, Dims};
use dtensor::{distribute, DTensor, Dt, Shard};

type M = (dp, tp);
const HEADS: usize = 2;

/// `out[b, i, :] = (q q^T) q` per batch and head, `q` the heads of `x`.
#[distribute(mesh = "dp,tp", placements = [Shard(0), Shard(2)])]
fn self_mix(x: &DTensor<f64, 3>) -> dtensor::Result<DTensor<f64, 3>> {
    let (s, h) = (x.shape()[1], x.shape()[2]);
    let q: Dt<f64, M, (Shard<0>, Shard<2>), 4> = x.unflatten(Dim::<2>, [HEADS, h / HEADS])?;
    let q: Dt<f64, M, (Shard<0>, Shard<1>), 4> = q.permute((Dim::<0>, Dim::<2>, Dim::<1>, Dim::<3>))?;
    let scores = q.matmul_batched(&q.transpose(Dim::<2>, Dim::<3>)?)?;
    let mixed: Dt<f64, M, (Shard<0>, Shard<1>), 4> = scores.matmul_batched(&q)?;
    let (first, rest) = (mixed.narrow(Dim::<2>, 0, 1)?, mixed.narrow(Dim::<2>, 1, s - 1)?);
    let mixed = Dt::cat(&[&first, &rest], Dim::<2>)?;
    let back: Dt<f64, M, (Shard<0>, Shard<2>), 4> = mixed.permute((Dim::<0>, Dim::<2>, Dim::<1>, Dim::<3>))?;
    let wide: Dt<f64, M, (Shard<0>, Shard<3>), 5> = back.unsqueeze(Dim::<1>)?;
    let back: Dt<f64, M, (Shard<0>, Shard<2>), 4> = wide.squeeze(Dim::<1>)?;
    back.flatten(Dims::<2, 3>)
}

fn main() {
    let (b, s, h) = (2, 3, 8);
    let hd = h / HEADS;
    let x = ArrayD::from_shape_fn(IxDyn(&[b, s, h]), |ix| ((ix[0] * 31 + ix[1] * 7 + ix[2] * 3) % 5) as f64 - 2.0);
    let mut expect = ArrayD::zeros(IxDyn(&[b, s, h]));
    for bi in 0..b {
        for n in 0..HEADS {
            let q = |i: usize, d: usize| x[[bi, i, n * hd + d]];
            for i in 0..s {
                for d in 0..hd {
                    let mut v = 0.0;
                    for j in 0..s {
                        let score: f64 = (0..hd).map(|e| q(i, e) * q(j, e)).sum();
                        v += score * q(j, d);
                    }
                    expect[[bi, i, n * hd + d]] = v;
                }
            }
        }
    }
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let xs: Dt<f64, M, (Shard<0>, Shard<2>), 3> = Dt::distribute(&x, &mesh)?;
        let before = dtensor::ops::implicit_redistribution_count();
        let y = self_mix(&xs)?;
        assert_eq!(dtensor::ops::implicit_redistribution_count(), before);
        assert_eq!(y.placements(), &[dtensor::Shard(0), dtensor::Shard(2)]);
        y.full_tensor()
    })
    .unwrap();
    for y in out {
        assert_eq!(y, expect);
    }
}
