//! Broadcasting with a replicated bias on a batch-sharded activation, batched matmul with
//! heads sharded, and layer / RMS norm of a batch-sharded activation: the annotated layouts are
//! what the rules compute, with no communication.
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Partial, Replicate, Shard, Sum};

type M = (dp, tp);

fn array(shape: &[usize], seed: usize) -> ArrayD<f64> {
    let mut i = 0;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        i += 1;
        ((i * 7 + seed) % 5) as f64 - 2.0
    })
}

fn main() {
    let (x, bias, q, k) = (array(&[4, 3], 1), array(&[1, 3], 2), array(&[2, 2, 3, 4], 3), array(&[2, 2, 4, 3], 4));
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let xs: Dt<f64, M, (Shard<0>, Replicate), 2> = Dt::distribute(&x, &mesh)?;
        let b: Dt<f64, M, (Replicate, Replicate), 2> = Dt::distribute(&bias, &mesh)?;
        let y: Dt<f64, M, (Shard<0>, Replicate), 2> = xs.add_broadcast(&b)?;
        let p: Dt<f64, M, (Shard<0>, Partial<Sum>), 2> = xs.redistribute::<(Shard<0>, Partial<Sum>)>()?;
        let z: Dt<f64, M, (Shard<0>, Partial<Sum>), 2> = p.mul_broadcast(&b)?;
        let qs: Dt<f64, M, (Shard<0>, Shard<1>), 4> = Dt::distribute(&q, &mesh)?;
        let ks: Dt<f64, M, (Shard<0>, Shard<1>), 4> = Dt::distribute(&k, &mesh)?;
        let s: Dt<f64, M, (Shard<0>, Shard<1>), 4> = qs.matmul_batched(&ks)?;
        let w: Dt<f64, M, (Replicate, Replicate), 1> = Dt::distribute(&ArrayD::ones(IxDyn(&[3])), &mesh)?;
        let n: Dt<f64, M, (Shard<0>, Replicate), 2> = y.layer_norm([3], Some(&w), None, 1e-5)?;
        let r: Dt<f64, M, (Shard<0>, Shard<1>), 4> = s.rms_norm([3], None, 1e-5)?;
        let rows = n.sum(dtensor::typed::Dim::<1>)?.full_tensor()?;
        assert!(rows.iter().all(|v| v.abs() < 1e-9));
        assert_eq!(r.shape(), &[2, 2, 3, 3]);
        Ok((y.full_tensor()?, z.full_tensor()?, s.full_tensor()?))
    })
    .unwrap();
    let b = bias.broadcast(x.raw_dim()).unwrap();
    for (y, z, s) in out {
        assert_eq!(y, &x + &b);
        assert_eq!(z, &x * &b);
        assert_eq!(s.shape(), &[2, 2, 3, 3]);
    }
}
