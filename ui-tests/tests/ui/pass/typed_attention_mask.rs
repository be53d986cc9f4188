//! Typed attention with an additive mask on a dp × tp mesh (batch on dp, heads on tp): a
//! replicated `[L, L]` causal mask broadcast over batch and heads equals `is_causal`.
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::attention::{scaled_dot_product_attention, scaled_dot_product_attention_masked};
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Replicate, Shard};

fn main() {
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let g = ArrayD::from_shape_fn(IxDyn(&[2, 2, 3, 4]), |ix| ((ix[0] * 7 + ix[1] * 5 + ix[2] * 3 + ix[3]) % 5) as f64 / 4.0);
        let q: Dt<f64, (dp, tp), (Shard<0>, Shard<1>), 4> = Dt::distribute(&g, &mesh)?;
        let m = ArrayD::from_shape_fn(IxDyn(&[3, 3]), |ix| if ix[1] > ix[0] { f64::NEG_INFINITY } else { 0.0 });
        let mask: Dt<f64, (dp, tp), (Replicate, Replicate), 2> = Dt::distribute(&m, &mesh)?;
        let y: Dt<f64, (dp, tp), (Shard<0>, Shard<1>), 4> = scaled_dot_product_attention_masked(&q, &q, &q, &mask, None)?;
        let c: Dt<f64, (dp, tp), (Shard<0>, Shard<1>), 4> = scaled_dot_product_attention(&q, &q, &q, true, None)?;
        let (y, c) = (y.full_tensor()?, c.full_tensor()?);
        Ok(y.iter().zip(&c).all(|(a, b)| (a - b).abs() < 1e-12))
    })
    .unwrap();
    assert!(out.into_iter().all(|ok| ok));
}
