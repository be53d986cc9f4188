// A leaf's gradient is reduced by the engine: a `Partial<Sum>` parameter's gradient is typed
// `Replicate`, so code that expects a partial sum (and would reduce it again) does not compile.
use dtensor::typed::dims::tp;
use dtensor::{Dt, Partial, Sum};

fn f(w: &Dt<f32, (tp,), (Partial<Sum>,), 1>) -> dtensor::Result<()> {
    let _g: Option<Dt<f32, (tp,), (Partial<Sum>,), 1>> = w.grad()?;
    Ok(())
}

fn main() {
    let _ = f;
}
