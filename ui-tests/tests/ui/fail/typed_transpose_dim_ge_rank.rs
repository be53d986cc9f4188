// transpose of dim 2 of a rank-2 tensor: caught by a const check when the code is built.
use dtensor::typed::dims::tp;
use dtensor::typed::Dim;
use dtensor::{Dt, Replicate};

fn f(x: &Dt<f32, (tp,), (Replicate,), 2>) {
    let _ = x.transpose(Dim::<0>, Dim::<2>);
}

fn main() {
    let _ = f;
    let _ = dtensor::run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["tp"])?;
        let x = Dt::distribute(&dtensor::ndarray::ArrayD::zeros(vec![2, 2]), &mesh)?;
        f(&x);
        Ok(())
    });
}
