//! Every typed one-input op on the layouts it keeps, checked against the single-rank result.
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Avg, Dt, Max, Partial, Replicate, Shard, Sum};

fn main() {
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let g = ArrayD::from_shape_fn(IxDyn(&[5, 3]), |ix| 0.5 + (ix[0] * 3 + ix[1]) as f32 / 7.0);
        let x: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = Dt::distribute(&g, &mesh)?;
        let y = x.exp()?.log()?.tanh()?.sqrt()?.relu()?.gelu()?.neg()?.add_scalar(1.0)?.sub_scalar(0.5)?;
        let y = y.mul_scalar(3.0)?.div_scalar(2.0)?;
        let want = g.mapv(|v| {
            let t = v.exp().ln().tanh().sqrt().max(0.0);
            let c = (2.0f32 / std::f32::consts::PI).sqrt();
            let gelu = 0.5 * t * (1.0 + (c * (t + 0.044715 * t * t * t)).tanh());
            (-gelu + 1.0 - 0.5) * 3.0 / 2.0
        });
        let close = |a: &ArrayD<f32>, b: &ArrayD<f32>| a.iter().zip(b).all(|(p, q)| (p - q).abs() < 1e-5);
        let ok1 = close(&y.full_tensor()?, &want);
        // Partial layouts the ops keep: neg / mul_scalar of a Partial<Sum>, add_scalar of a
        // Partial<Avg> and of a Partial<Max>.
        let r: Dt<f32, (dp, tp), (Replicate, Replicate), 2> = Dt::distribute(&g, &mesh)?;
        let p: Dt<f32, _, (Replicate, Partial<Sum>), 2> = r.redistribute()?;
        let ok2 = close(&p.neg()?.mul_scalar(2.0)?.full_tensor()?, &g.mapv(|v| -2.0 * v));
        let a: Dt<f32, _, (Partial<Avg>, Replicate), 2> = r.redistribute()?;
        let ok3 = close(&a.add_scalar(1.0)?.full_tensor()?, &g.mapv(|v| v + 1.0));
        let m: Dt<f32, _, (Replicate, Partial<Max>), 2> = r.redistribute()?;
        let ok4 = close(&m.add_scalar(1.0)?.full_tensor()?, &g.mapv(|v| v + 1.0));
        // Softmax on the sharded dim (two-pass) and on an unsharded one.
        let s1 = x.softmax_across_shards(Dim::<1>)?.full_tensor()?;
        let s0 = x.log_softmax_across_shards(Dim::<0>)?.full_tensor()?;
        let mut w1 = g.clone();
        for mut row in w1.rows_mut() {
            let m = row.iter().cloned().fold(f32::MIN, f32::max);
            let z: f32 = row.iter().map(|v| (v - m).exp()).sum();
            row.mapv_inplace(|v| (v - m).exp() / z);
        }
        let mut w0 = g.clone();
        for mut col in w0.columns_mut() {
            let m = col.iter().cloned().fold(f32::MIN, f32::max);
            let z: f32 = col.iter().map(|v| (v - m).exp()).sum::<f32>().ln();
            col.mapv_inplace(|v| v - m - z);
        }
        let ok5 = close(&s1, &w1) && close(&s0, &w0);
        Ok(ok1 && ok2 && ok3 && ok4 && ok5)
    })
    .unwrap();
    assert!(out.into_iter().all(|ok| ok));
}
