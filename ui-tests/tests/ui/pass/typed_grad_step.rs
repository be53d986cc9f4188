// A data-parallel × tensor-parallel step read through typed gradients: the gradient types
// are derived from the parameters' layouts, and an SGD update on them type-checks.
use dtensor::ndarray::ArrayD;
use dtensor::typed::dims::{dp, tp};
use dtensor::{Dt, Replicate, Shard};

type W = Dt<f32, (dp, tp), (Replicate, Shard<1>), 2>;

fn main() {
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let w = ArrayD::from_shape_fn(vec![3, 4], |i| (i[0] + i[1]) as f32 * 0.5);
        let w: W = Dt::distribute(&w, &mesh)?.requires_grad_(true);
        let x = ArrayD::from_shape_fn(vec![4, 3], |i| i[0] as f32 - i[1] as f32);
        let x: Dt<f32, (dp, tp), (Shard<0>, Replicate), 2> = Dt::distribute(&x, &mesh)?;
        let y = x.matmul(&w)?;
        let loss = y.mul(&y)?.sum_all()?;
        loss.backward_retaining_graph()?;
        let g: W = w.grad()?.expect("a parameter has a gradient after backward");
        let stepped = w.detach().sub(&g.mul_scalar(0.1)?)?;
        w.zero_grad();
        assert!(w.grad()?.is_none());
        Ok(stepped.full_tensor()?)
    })
    .unwrap();
    assert!(out.iter().all(|w| w == &out[0]));
}
