//! Hostile Hugging Face checkpoints: every case is a typed error naming the file (and the
//! tensor where there is one), never a panic, a hang, an out-of-bounds read or a read
//! outside the directory.
#![cfg(unix)]

mod common;
mod hf_util;

use common::global;
use dtensor_runtime::checkpoint::hf::{HfCheckpoint, INDEX_FILE, SINGLE_FILE};
use dtensor_runtime::checkpoint::{FileKind, FileProblem};
use dtensor_runtime::{run, Error, Replicate};
use hf_util::{expect_checkpoint, write_header, write_index, write_raw, write_st};
use safetensors::Dtype;
use std::path::Path;
use std::time::Duration;

/// Opens the checkpoint at `path` and reads every tensor whole as f32, on a helper thread (a
/// loader that blocks fails the test after 20 s instead of hanging it).
fn read_all(path: &Path) -> dtensor_runtime::Result<()> {
    let path = path.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = HfCheckpoint::open(&path).and_then(|mut ck| {
            let names: Vec<String> = ck.names().iter().map(|s| s.to_string()).collect();
            names.iter().try_for_each(|n| ck.read_full::<f32>(n).map(|_| ()))
        });
        let _ = tx.send(r);
    });
    rx.recv_timeout(Duration::from_secs(20)).expect("the loader blocked")
}

/// A directory with `model.safetensors` made of header length `n` and `rest`.
fn raw_model(n: u64, rest: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_raw(&dir.path().join(SINGLE_FILE), n, rest);
    dir
}

/// A directory with `model.safetensors` whose header is `header` followed by `data`.
fn model_with_header(header: &str, data: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_header(&dir.path().join(SINGLE_FILE), header, data);
    dir
}

fn expect_refused(r: dtensor_runtime::Result<()>, file: &str, want: impl Fn(&FileProblem) -> bool) {
    match r {
        Err(Error::UnsafeFile { path, problem }) => {
            assert!(path.ends_with(file), "error names `{path}`, expected `{file}`");
            assert!(want(&problem), "unexpected problem {problem:?}");
        }
        other => panic!("expected UnsafeFile naming {file}, got {other:?}"),
    }
}

/// Two files and an index: `a` in the first, `b` in the second.
fn sharded(dir: &Path) {
    write_st(&dir.join("m-1.safetensors"), &[("a", Dtype::F32, &global(&[2, 3], 1))]);
    write_st(&dir.join("m-2.safetensors"), &[("b", Dtype::BF16, &global(&[4], 2))]);
    write_index(dir, &[("a", "m-1.safetensors"), ("b", "m-2.safetensors")]);
}

// ------------------------------------------------------------------------ the header

#[test]
fn file_shorter_than_the_length_prefix() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(SINGLE_FILE), [1, 2, 3]).unwrap();
    expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["truncated"]);
}

#[test]
fn header_length_past_the_end_of_the_file() {
    let dir = raw_model(1000, b"{}");
    expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["header length 1000"]);
}

#[test]
fn header_length_that_overflows() {
    for n in [u64::MAX, u64::MAX - 7, 1 << 63, 100_000_001] {
        let dir = raw_model(n, b"{}");
        expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["bad header", &n.to_string()]);
    }
}

#[test]
fn header_that_is_not_utf8() {
    let dir = raw_model(6, b"{\"\xff\xfe\":1}");
    expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["not a safetensors header"]);
}

#[test]
fn header_that_is_not_json() {
    for h in ["{", "[]", "{\"a\": 1}", "{\"a\": {\"dtype\": \"F32\"}}", "null", "{\"__metadata__\": {\"x\": 1}}"] {
        let dir = model_with_header(h, &[]);
        expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["not a safetensors header"]);
    }
}

#[test]
fn unknown_dtype() {
    let dir = model_with_header(r#"{"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}"#, &[0; 16]);
    expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["not a safetensors header", "F128"]);
}

#[test]
fn negative_or_fractional_offsets() {
    for h in [
        r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}"#,
        r#"{"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}"#,
    ] {
        let dir = model_with_header(h, &[0; 4]);
        expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["not a safetensors header"]);
    }
}

#[test]
fn offsets_out_of_range() {
    // The header claims 4000 bytes of data; the file has 16.
    let dir = model_with_header(r#"{"w":{"dtype":"F32","shape":[1000],"data_offsets":[0,4000]}}"#, &[0; 16]);
    expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["truncated", "the file has 84"]);
    // Offsets near usize::MAX.
    let big = usize::MAX - 3;
    let h = format!(r#"{{"w":{{"dtype":"F32","shape":[1],"data_offsets":[{big},{}]}}}}"#, usize::MAX);
    let dir = model_with_header(&h, &[0; 4]);
    expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["not a safetensors header"]);
}

#[test]
fn overlapping_tensors() {
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let dir = model_with_header(h, &[0; 12]);
    expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["not a safetensors header"]);
    // Two tensors on the same bytes.
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let dir = model_with_header(h, &[0; 8]);
    expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["not a safetensors header"]);
}

#[test]
fn byte_range_that_disagrees_with_the_shape() {
    let dir = model_with_header(r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, &[0; 8]);
    expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["not a safetensors header"]);
}

#[test]
fn bytes_after_the_last_tensor() {
    let dir = model_with_header(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, &[0; 9]);
    expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["corrupt", "describes"]);
}

#[test]
fn absurd_sizes() {
    // Zero elements, so no bytes, but strides past isize: refused by the shape check, naming
    // the file and the tensor.
    let h = r#"{"w":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}}"#;
    let dir = model_with_header(h, &[]);
    match read_all(dir.path()) {
        Err(Error::ShapeOverflow { context, .. }) => {
            assert!(context.contains(SINGLE_FILE) && context.contains("`w`"), "{context}")
        }
        other => panic!("expected ShapeOverflow, got {other:?}"),
    }
    // An element count whose byte size overflows usize.
    let h = r#"{"w":{"dtype":"F64","shape":[4611686018427387904,8],"data_offsets":[0,0]}}"#;
    let dir = model_with_header(h, &[]);
    expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["not a safetensors header"]);
}

#[test]
fn dtype_the_runtime_has_no_element_for() {
    let dir = tempfile::tempdir().unwrap();
    write_st(&dir.path().join(SINGLE_FILE), &[("ids", Dtype::I16, &global(&[3], 0))]);
    expect_checkpoint(read_all(dir.path()), SINGLE_FILE, &["`ids`", "I16"]);
}

// ------------------------------------------------------------------- names and files

#[test]
fn unknown_tensor_name() {
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path());
    let e = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        HfCheckpoint::open(dir.path())?.load_tensor::<f32>("model.c", &mesh, &[Replicate]).map(|_| ())
    });
    expect_checkpoint(e, INDEX_FILE, &["no tensor `model.c`"]);
}

#[test]
fn index_naming_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path());
    std::fs::remove_file(dir.path().join("m-2.safetensors")).unwrap();
    expect_checkpoint(read_all(dir.path()), "m-2.safetensors", &["cannot open", "tensor `b`"]);
    // The whole checkpoint missing.
    let empty = tempfile::tempdir().unwrap();
    expect_checkpoint(read_all(empty.path()), INDEX_FILE, &["cannot open"]);
}

#[test]
fn index_naming_a_tensor_the_file_lacks() {
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path());
    write_index(dir.path(), &[("a", "m-1.safetensors"), ("b", "m-1.safetensors")]);
    expect_checkpoint(read_all(dir.path()), "m-1.safetensors", &["tensor `b` is missing"]);
}

#[test]
fn index_naming_a_file_outside_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path());
    for bad in ["../m-1.safetensors", "/etc/passwd", "sub/m-1.safetensors", ".hidden"] {
        write_index(dir.path(), &[("a", "m-1.safetensors"), ("b", bad)]);
        expect_refused(read_all(dir.path()), bad.rsplit('/').next().unwrap(), |p| *p == FileProblem::NotPlainName);
    }
}

#[test]
fn index_naming_a_link_out_of_the_directory() {
    let outside = tempfile::tempdir().unwrap();
    sharded(outside.path());
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path());
    std::fs::remove_file(dir.path().join("m-2.safetensors")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("m-2.safetensors"), dir.path().join("m-2.safetensors")).unwrap();
    expect_refused(read_all(dir.path()), "m-2.safetensors", |p| matches!(p, FileProblem::LeavesDirectory { .. }));
    // A link inside the directory is followed.
    std::fs::remove_file(dir.path().join("m-2.safetensors")).unwrap();
    std::fs::copy(outside.path().join("m-2.safetensors"), dir.path().join("real.safetensors")).unwrap();
    std::os::unix::fs::symlink("real.safetensors", dir.path().join("m-2.safetensors")).unwrap();
    read_all(dir.path()).unwrap();
}

#[test]
fn fifo_or_directory_as_the_model_file() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join(SINGLE_FILE);
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    expect_refused(read_all(dir.path()), SINGLE_FILE, |p| *p == FileProblem::NotRegular(FileKind::Fifo));
    expect_refused(read_all(&fifo), SINGLE_FILE, |p| *p == FileProblem::NotRegular(FileKind::Fifo));
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(SINGLE_FILE)).unwrap();
    expect_refused(read_all(dir.path()), SINGLE_FILE, |p| *p == FileProblem::NotRegular(FileKind::Directory));
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join(SINGLE_FILE)).unwrap();
    expect_refused(read_all(dir.path()), SINGLE_FILE, |p| matches!(p, FileProblem::LeavesDirectory { .. }));
}

#[test]
fn malformed_index() {
    let dir = tempfile::tempdir().unwrap();
    sharded(dir.path());
    let index = dir.path().join(INDEX_FILE);
    for bad in [
        &b"{"[..],
        b"{\"metadata\": {}}",
        b"{\"weight_map\": {\"a\": 3}}",
        b"{\"weight_map\": {\"\xff\": \"m-1.safetensors\"}}",
        b"\xff\xfe",
    ] {
        std::fs::write(&index, bad).unwrap();
        expect_checkpoint(read_all(dir.path()), INDEX_FILE, &["malformed Hugging Face index"]);
    }
    write_index(dir.path(), &[("__metadata__", "m-1.safetensors")]);
    expect_checkpoint(read_all(dir.path()), INDEX_FILE, &["`__metadata__` cannot be a tensor name"]);
}

#[test]
fn index_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let f = std::fs::File::create(dir.path().join(INDEX_FILE)).unwrap();
    f.set_len(dtensor_runtime::checkpoint::MAX_INDEX_BYTES + 1).unwrap(); // sparse: no disk used
    expect_refused(read_all(dir.path()), INDEX_FILE, |p| matches!(p, FileProblem::TooLarge { .. }));
}

/// A Hugging Face hub cache: snapshot files link to `../../blobs/`. Refused by default, read
/// when the repository folder is named as the root links may resolve in; a link leaving that
/// root is still refused, and a root that does not contain the checkpoint is an error.
#[test]
fn hub_cache_links_within_a_named_root() {
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--org--tiny");
    let (blobs, snap) = (repo.join("blobs"), repo.join("snapshots").join("abc123"));
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::create_dir_all(&snap).unwrap();
    write_st(&blobs.join("5f2e"), &[("w", Dtype::BF16, &global(&[4, 2], 3))]);
    std::os::unix::fs::symlink("../../blobs/5f2e", snap.join(SINGLE_FILE)).unwrap();
    expect_refused(read_all(&snap), SINGLE_FILE, |p| matches!(p, FileProblem::LeavesDirectory { .. }));
    let mut ck = HfCheckpoint::open_with_link_root(&snap, &repo).unwrap();
    assert_eq!(ck.read_full::<f32>("w").unwrap().mapv(f64::from), global(&[4, 2], 3));
    // Out of the root: still refused.
    let outside = tempfile::tempdir().unwrap();
    write_st(&outside.path().join("x"), &[("w", Dtype::F32, &global(&[2], 1))]);
    std::fs::remove_file(snap.join(SINGLE_FILE)).unwrap();
    std::os::unix::fs::symlink(outside.path().join("x"), snap.join(SINGLE_FILE)).unwrap();
    let r = HfCheckpoint::open_with_link_root(&snap, &repo).map(|_| ());
    expect_refused(r, SINGLE_FILE, |p| matches!(p, FileProblem::LeavesDirectory { .. }));
    let e = HfCheckpoint::open_with_link_root(&snap, outside.path()).err().unwrap();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}
