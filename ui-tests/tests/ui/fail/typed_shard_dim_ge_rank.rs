// Shard<2> of a rank-2 tensor: caught by a const check when the code is built.
use dtensor::ndarray::ArrayD;
use dtensor::typed::dims::tp;
use dtensor::{DeviceMesh, Dt, Shard};

fn make(g: &ArrayD<f32>, mesh: &DeviceMesh) -> dtensor::Result<Dt<f32, (tp,), (Shard<2>,), 2>> {
    Dt::distribute(g, mesh)
}

fn main() {
    let _ = dtensor::run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["tp"])?;
        make(&ArrayD::zeros(vec![2, 2]), &mesh).map(|_| ())
    });
}
