//! The typed activations and element-wise math (silu, sigmoid, softplus, pow, rsqrt, abs,
//! clamp, gelu_with) and dropout on a sharded layout, checked against the single-rank result.
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::ops::GeluApproximate;
use dtensor::{Dt, Replicate, Shard};

fn main() {
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        // Uneven on both mesh dims (5 rows over 2, 3 cols over 2), with negative values.
        let g = ArrayD::from_shape_fn(IxDyn(&[5, 3]), |ix| (ix[0] * 3 + ix[1]) as f32 / 7.0 - 1.0);
        let x: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = Dt::distribute(&g, &mesh)?;
        let close = |a: &ArrayD<f32>, b: &ArrayD<f32>, tol: f32| a.iter().zip(b).all(|(p, q)| (p - q).abs() < tol);
        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        let mut ok = close(&x.silu()?.full_tensor()?, &g.mapv(|v| v * sig(v)), 1e-5);
        ok &= close(&x.sigmoid()?.full_tensor()?, &g.mapv(sig), 1e-5);
        ok &= close(&x.softplus()?.full_tensor()?, &g.mapv(|v| (1.0 + v.exp()).ln()), 1e-5);
        let sp2 = g.mapv(|v| if 2.0 * v > 0.5 { v } else { (1.0 + (2.0 * v).exp()).ln() / 2.0 });
        ok &= close(&x.softplus_with(2.0, 0.5)?.full_tensor()?, &sp2, 1e-5);
        let a = x.abs()?;
        ok &= close(&a.full_tensor()?, &g.mapv(f32::abs), 1e-6);
        let pos = a.add_scalar(0.5)?;
        ok &= close(&pos.pow(3.0)?.full_tensor()?, &g.mapv(|v| (v.abs() + 0.5).powi(3)), 1e-5);
        ok &= close(&pos.rsqrt()?.full_tensor()?, &g.mapv(|v| 1.0 / (v.abs() + 0.5).sqrt()), 1e-5);
        ok &= close(&x.clamp(Some(-0.5), Some(0.8))?.full_tensor()?, &g.mapv(|v| v.clamp(-0.5, 0.8)), 1e-6);
        ok &= close(&x.clamp(None, Some(0.0))?.full_tensor()?, &g.mapv(|v| v.min(0.0)), 1e-6);
        // The tanh form is `gelu()`; the erf form is within 1e-3 of it on this range.
        ok &= close(&x.gelu_with(GeluApproximate::Tanh)?.full_tensor()?, &x.gelu()?.full_tensor()?, 1e-7);
        let c = (2.0f32 / std::f32::consts::PI).sqrt();
        let gelu_tanh = g.mapv(|t| 0.5 * t * (1.0 + (c * (t + 0.044715 * t * t * t)).tanh()));
        ok &= close(&x.gelu_with(GeluApproximate::None)?.full_tensor()?, &gelu_tanh, 1e-3);
        // Dropout keeps the layout: every element is dropped (0) or scaled by 1 / (1 - p).
        let d: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = x.dropout(0.5, true)?;
        let full = d.full_tensor()?;
        ok &= full.iter().zip(&g).all(|(y, v)| *y == 0.0 || (y - 2.0 * v).abs() < 1e-6);
        ok &= close(&x.dropout(0.5, false)?.full_tensor()?, &g, f32::EPSILON);
        let r: Dt<f32, (dp, tp), (Replicate, Replicate), 2> = Dt::distribute(&g, &mesh)?;
        ok &= close(&r.silu()?.full_tensor()?, &g.mapv(|v| v * sig(v)), 1e-5);
        Ok(ok)
    })
    .unwrap();
    assert!(out.into_iter().all(|ok| ok));
}
