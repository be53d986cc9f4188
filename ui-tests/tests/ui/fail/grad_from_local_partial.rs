// The local terms of a `Partial<Sum>` value each get the whole gradient: sending it back as
// `Partial<Sum>` (a piece per rank) is wrong for every program.
use dtensor::typed::dims::tp;
use dtensor::{DTensor, DeviceMesh, Dt, FromLocal, Partial, Sum};

fn f(local: &DTensor<f32>, mesh: &DeviceMesh) -> dtensor::Result<Dt<f32, (tp,), (Partial<Sum>,), 0>> {
    Dt::from_local_grad::<(Partial<Sum>,)>(local, mesh, FromLocal::default())
}

fn main() {
    let _ = f;
}
