//! Free conversions between the typed and the dynamic form; the checked direction returns a
//! typed error at run time; in-range const checks build.
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::dims::tp;
use dtensor::{DTensor, Dt, Error, Replicate, Shard};

fn main() {
    let out = dtensor::run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let g = ArrayD::from_shape_fn(IxDyn(&[2, 3, 4]), |ix| (ix[0] + ix[1] + ix[2]) as f64);
        // Shard<2> on a rank-3 tensor: the const check passes.
        let x: Dt<f64, (tp,), (Shard<2>,), 3> = Dt::distribute(&g, &mesh)?;
        let d: DTensor<f64> = x.into_dtensor();
        let again: Dt<f64, (tp,), (Shard<2>,), 3> = d.clone().try_into()?;
        let wrong = Dt::<f64, (tp,), (Replicate,), 3>::from_dtensor(d).err();
        Ok((again.full_tensor()? == g, wrong))
    })
    .unwrap();
    for (same, wrong) in out {
        assert!(same);
        match wrong {
            Some(Error::TypedMismatch { what, expected, actual }) => {
                // The error names the caller's line (`from_dtensor` is `#[track_caller]`).
                assert!(what.starts_with("layout (at ") && what.ends_with("conversions.rs:15:21)"), "{what}");
                assert_eq!((expected.as_str(), actual.as_str()), ("layout (R) on mesh (tp)", "(S(2)): call `.redistribute()`"));
            }
            other => panic!("expected a TypedMismatch, got {other:?}"),
        }
    }
}
