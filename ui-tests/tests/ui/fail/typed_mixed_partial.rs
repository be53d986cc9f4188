// A partial sum on one mesh dim and a partial average on another: the runtime has no such
// value, so the typed layer rejects the layout when the code is built.
use dtensor::ndarray::ArrayD;
use dtensor::typed::dims::{dp, tp};
use dtensor::{DeviceMesh, Dt, Partial, Sum, Avg};

fn make(g: &ArrayD<f32>, mesh: &DeviceMesh) -> dtensor::Result<Dt<f32, (dp, tp), (Partial<Sum>, Partial<Avg>), 2>> {
    Dt::distribute(g, mesh)
}

fn main() {
    let _ = dtensor::run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1, 1], &["dp", "tp"])?;
        make(&ArrayD::zeros(vec![2, 2]), &mesh).map(|_| ())
    });
}
