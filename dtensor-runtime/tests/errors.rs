//! Error variants raised by ops and autograd on bad input (the runtime core's are in
//! mesh.rs, distribute.rs, factory.rs and launcher.rs).

use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::{distribute_tensor, run, Error, Replicate, Shard};

#[test]
fn ops_name_the_problem() {
    let errs = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let other = ctx.init_device_mesh(&[2], &["y"])?;
        let g = ArrayD::<f32>::ones(vec![4, 4]);
        let a = distribute_tensor(&g, &mesh, &[Shard(0)], None)?;
        let b = distribute_tensor(&g, &other, &[Replicate], None)?;
        Ok(vec![
            a.add(&b).unwrap_err(),
            a.sum_dim(5, false).unwrap_err(),
            a.transpose(0, -3).unwrap_err(),
            a.backward().unwrap_err(),
        ])
    })
    .unwrap();
    let e = &errs[0];
    assert!(matches!(&e[0], Error::MeshMismatch { context, .. } if context == "add"), "{}", e[0]);
    assert!(matches!(e[1], Error::DimOutOfRange { dim: 5, ndim: 2, .. }), "{}", e[1]);
    assert!(matches!(e[2], Error::DimOutOfRange { dim: -3, ndim: 2, .. }), "{}", e[2]);
    assert!(matches!(e[3], Error::Autograd(_)), "{}", e[3]);
}
