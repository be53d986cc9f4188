//! Typed sum / mean / max / min / argmax / argmin over one dim and over every dim, against the single-rank result.
use dtensor::ndarray::{ArrayD, Axis, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Max, Min, Partial, Replicate, Shard, Sum};

fn main() {
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let g = ArrayD::from_shape_fn(IxDyn(&[5, 3]), |ix| ((ix[0] * 3 + ix[1]) % 7) as f32 - 2.0);
        let x: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = Dt::distribute(&g, &mesh)?;
        let s: Dt<f32, _, (Partial<Sum>, Shard<1>), 2> = x.sum(Dim::<0>)?;
        let m: Dt<f32, _, (Shard<0>, Partial<Sum>), 2> = x.mean(Dim::<1>)?;
        let mx: Dt<f32, _, (Partial<Max>, Shard<1>), 2> = x.max(Dim::<0>)?;
        let sa: Dt<f32, _, (Partial<Sum>, Partial<Sum>), 0> = x.sum_all()?;
        let ma: Dt<f32, _, (Partial<Sum>, Partial<Sum>), 0> = x.mean_all()?;
        let xa: Dt<f32, _, (Partial<Max>, Partial<Max>), 0> = x.max_all()?;
        let mn: Dt<f32, _, (Shard<0>, Partial<Min>), 2> = x.min(Dim::<1>)?;
        let na: Dt<f32, _, (Partial<Min>, Partial<Min>), 0> = x.min_all()?;
        let rows: Dt<f32, _, (Shard<0>, Replicate), 2> = x.redistribute()?;
        // Indices are i64 (PyTorch's int64), whatever the element type.
        let am: Dt<i64, _, (Shard<0>, Replicate), 2> = rows.argmax(Dim::<1>)?;
        let an: Dt<i64, _, (Shard<0>, Replicate), 2> = rows.argmin(Dim::<1>)?;
        let first = |max: bool| {
            g.map_axis(Axis(1), |l| {
                let pick = |a: usize, (i, v): (usize, &f32)| if (max && *v > l[a]) || (!max && *v < l[a]) { i } else { a };
                l.iter().enumerate().fold(0, pick) as i64
            })
            .insert_axis(Axis(1))
        };
        let r: Dt<f32, _, (Replicate, Replicate), 2> = x.redistribute()?;
        let kept: Dt<f32, _, (Replicate, Partial<Sum>), 0> = r.redistribute::<(Replicate, Partial<Sum>)>()?.sum_all()?;
        let close = |a: &ArrayD<f32>, b: &ArrayD<f32>| a.shape() == b.shape() && a.iter().zip(b).all(|(p, q)| (p - q).abs() < 1e-5);
        let total = g.sum();
        let ok = close(&s.full_tensor()?, &g.sum_axis(Axis(0)).insert_axis(Axis(0)))
            && close(&m.full_tensor()?, &g.mean_axis(Axis(1)).unwrap().insert_axis(Axis(1)))
            && close(&mx.full_tensor()?, &g.fold_axis(Axis(0), f32::MIN, |a, b| a.max(*b)).insert_axis(Axis(0)))
            && close(&sa.full_tensor()?, &ArrayD::from_elem(IxDyn(&[]), total))
            && close(&ma.full_tensor()?, &ArrayD::from_elem(IxDyn(&[]), total / 15.0))
            && close(&xa.full_tensor()?, &ArrayD::from_elem(IxDyn(&[]), 4.0))
            && close(&mn.full_tensor()?, &g.fold_axis(Axis(1), f32::MAX, |a, b| a.min(*b)).insert_axis(Axis(1)))
            && close(&na.full_tensor()?, &ArrayD::from_elem(IxDyn(&[]), -2.0))
            && am.full_tensor()? == first(true)
            && an.full_tensor()? == first(false)
            && close(&kept.full_tensor()?, &ArrayD::from_elem(IxDyn(&[]), total));
        Ok(ok)
    })
    .unwrap();
    assert!(out.into_iter().all(|ok| ok));
}
