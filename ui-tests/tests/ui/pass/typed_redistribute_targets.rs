//! Every legal redistribution target compiles and runs (the runtime's table).
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Partial, Replicate, Shard, Sum};

fn main() {
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let g = ArrayD::from_shape_fn(IxDyn(&[4, 4]), |ix| (ix[0] * 4 + ix[1]) as f32);
        let x: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = Dt::distribute(&g, &mesh)?;
        let r = x.redistribute::<(Replicate, Replicate)>()?;
        let p = r.redistribute::<(Replicate, Partial<Sum>)>()?;
        let s = p.redistribute::<(Shard<1>, Shard<0>)>()?;
        let back = s.redistribute::<(Replicate, Replicate)>()?;
        // Shard -> Partial<Sum> (PyTorch 2.15): each rank keeps its shard, zeros elsewhere.
        let sp = x.redistribute::<(Partial<Sum>, Shard<1>)>()?;
        Ok(back.full_tensor()? == g && sp.full_tensor()? == g)
    })
    .unwrap();
    assert!(out.into_iter().all(|ok| ok));
}
