//! Helpers shared by the checkpoint error tests: a small saved checkpoint and error checks.
#![allow(dead_code)]

use crate::common::global;
use dtensor_runtime::{checkpoint, distribute_tensor, run, Error, Shard};
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
