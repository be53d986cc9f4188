//! Helpers shared by the checkpoint error tests: a small saved checkpoint and error checks.
#![allow(dead_code)]

use crate::common::global;
use dtensor_runtime::checkpoint::hf;
use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::{checkpoint, distribute_tensor, run, Error, Replicate, Scalar, Shard};
use std::path::Path;

/// Saves a 2x2-mesh checkpoint of one `[5, 7]` f64 tensor `w` sharded on both dims (four
/// shard files).
pub fn save_2x2(dir: &Path) {
    let g = global(&[5, 7], 1);
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let t = distribute_tensor(&g, &mesh, &[Shard(0), Shard(1)], None)?;
        checkpoint::save(dir, &[("w".to_string(), t)])
    })
    .unwrap();
}

/// Unwraps a `Checkpoint` error and checks the file it names and a word of its reason.
pub fn expect_checkpoint_error(r: dtensor_runtime::Result<()>, file: &str, reason_has: &str) {
    match r {
        Err(Error::Checkpoint { path, reason }) => {
            assert!(path.ends_with(file), "error names `{path}`, expected `{file}`");
            assert!(reason.contains(reason_has), "reason `{reason}` lacks `{reason_has}`");
        }
        other => panic!("expected a Checkpoint error naming {file}, got {other:?}"),
    }
}

/// Saves `w` (sharded on both dims of a 2x2 mesh) and `v` (`[Shard(0), Replicate]`) in this
/// project's format, as a Hugging Face directory and as one full safetensors file; loads them
/// back on a 2-rank mesh with other placements and checks every value bit for bit; then checks
/// that both safetensors files hold `T`'s dtype natively (no widening on save).
pub fn check_native_round_trip<T: Scalar>(w: &ArrayD<T>, v: &ArrayD<T>) {
    let dir = tempfile::tempdir().unwrap();
    let (own, hf_dir, full_file) = (dir.path().join("own"), dir.path().join("hf"), dir.path().join("full.safetensors"));
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let state = vec![
            ("w".to_string(), distribute_tensor(w, &mesh, &[Shard(0), Shard(1)], None)?),
            ("v".to_string(), distribute_tensor(v, &mesh, &[Shard(0), Replicate], None)?),
        ];
        checkpoint::save(&own, &state)?;
        hf::save(&hf_dir, &state)?;
        checkpoint::save_full(&full_file, &state)
    })
    .unwrap();
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let own = checkpoint::load::<T>(&own, &mesh, &[("w", &[Shard(1)]), ("v", &[Replicate])])?;
        let mut h = hf::HfCheckpoint::open(&hf_dir)?;
        let hw = h.load_tensor::<T>("w", &mesh, &[Shard(0)])?;
        let hv = h.load_tensor::<T>("v", &mesh, &[Shard(1)])?;
        Ok((own[0].1.full_tensor()?, own[1].1.full_tensor()?, hw.full_tensor()?, hv.full_tensor()?))
    })
    .unwrap();
    for (ow, ov, hw, hv) in out {
        assert_eq!((&ow, &ov), (w, v), "{} own format", T::DTYPE);
        assert_eq!((&hw, &hv), (w, v), "{} hf format", T::DTYPE);
    }
    for file in [hf_dir.join("model.safetensors"), full_file] {
        let bytes = std::fs::read(&file).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let t = st.tensor("w").unwrap();
        assert_eq!(t.dtype().to_string(), T::DTYPE.safetensors_name(), "{file:?}");
        assert_eq!(t.data(), bytemuck::cast_slice::<T, u8>(w.as_slice().unwrap()));
    }
}
