//! A 3-D mesh (dp × pp × tp, 8 ranks): layouts are triples, each mesh dim follows its rule,
//! and redistribute moves between any two of them.
use dtensor::ndarray::{ArrayD, Ix2, IxDyn};
use dtensor::typed::dims::{dp, pp, tp};
use dtensor::{Dt, Partial, Replicate, Shard, Sum};

type M = (dp, pp, tp);

fn main() {
    let a = ArrayD::from_shape_fn(IxDyn(&[4, 6]), |ix| (ix[0] * 6 + ix[1]) as f64 / 4.0);
    let b = ArrayD::from_shape_fn(IxDyn(&[6, 4]), |ix| (ix[0] as f64 - ix[1] as f64) / 2.0);
    let d2 = |x: &ArrayD<f64>| x.view().into_dimensionality::<Ix2>().unwrap().to_owned();
    let expect = d2(&a).dot(&d2(&b)).into_dyn();
    let out = dtensor::run(8, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2, 2], &["dp", "pp", "tp"])?;
        let x: Dt<f64, M, (Shard<0>, Replicate, Shard<1>), 2> = Dt::distribute(&a, &mesh)?;
        let w: Dt<f64, M, (Replicate, Shard<1>, Shard<0>), 2> = Dt::distribute(&b, &mesh)?;
        let y: Dt<f64, M, (Shard<0>, Shard<1>, Partial<Sum>), 2> = x.matmul(&w)?;
        let z = y.redistribute::<(Replicate, Replicate, Replicate)>()?;
        Ok(z.to_local())
    })
    .unwrap();
    for local in out {
        assert_eq!(local, expect);
    }
}
