//! Hostile checkpoint directories: every case is a typed error (never a hang, an abort, a
//! read outside the directory or a write through a planted link), and the index check stays
//! fast for tens of thousands of blocks.
#![cfg(unix)]

mod checkpoint_util;
mod common;

use checkpoint_util::{expect_checkpoint_error, save_2x2};
use common::global;
use dtensor_runtime::checkpoint::{
    self, Checkpoint, CheckpointIndex, FileKind, FileProblem, MeshInfo, ShardEntry, TensorEntry, FORMAT, VERSION,
};
use dtensor_runtime::{distribute_tensor, run, Error, Replicate, Shard};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Opens the checkpoint and reads `w` whole, on a helper thread: a loader that blocks (a
/// FIFO) fails the test after 20 s instead of hanging it.
fn read_w(dir: &Path) -> dtensor_runtime::Result<()> {
    let dir = dir.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = Checkpoint::open(&dir).and_then(|mut c| c.read_full::<f64>("w")).map(|_| ());
        let _ = tx.send(r);
    });
    rx.recv_timeout(Duration::from_secs(20)).expect("the loader blocked")
}

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo").arg(path).status().unwrap().success();
    assert!(ok, "mkfifo {path:?}");
}

/// Checks an `UnsafeFile` error: the file it names and its problem.
fn expect_refused(r: dtensor_runtime::Result<()>, file: &str, want: impl Fn(&FileProblem) -> bool) {
    match r {
        Err(Error::UnsafeFile { path, problem }) => {
            assert!(path.ends_with(file), "error names `{path}`, expected `{file}`");
            assert!(want(&problem), "unexpected problem {problem:?}");
        }
        other => panic!("expected UnsafeFile naming {file}, got {other:?}"),
    }
}

fn replace_with_symlink(target: &Path, link: &Path) {
    std::fs::remove_file(link).unwrap();
    symlink(target, link).unwrap();
}

// ------------------------------------------------------------------ file types and links

#[test]
fn fifo_index_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    mkfifo(&dir.path().join("index.json"));
    expect_refused(read_w(dir.path()), "index.json", |p| *p == FileProblem::NotRegular(FileKind::Fifo));
}

#[test]
fn fifo_shard_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    save_2x2(dir.path());
    let shard = dir.path().join("shard-00002.safetensors");
    std::fs::remove_file(&shard).unwrap();
    mkfifo(&shard);
    expect_refused(read_w(dir.path()), "shard-00002.safetensors", |p| *p == FileProblem::NotRegular(FileKind::Fifo));
}

#[test]
fn index_linked_to_dev_zero_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    symlink("/dev/zero", dir.path().join("index.json")).unwrap();
    let t = Instant::now();
    expect_refused(
        read_w(dir.path()),
        "index.json",
        |p| matches!(p, FileProblem::LeavesDirectory { target } if target == "/dev/zero"),
    );
    assert!(t.elapsed() < Duration::from_secs(5), "read from /dev/zero for {:?}", t.elapsed());
}

#[test]
fn shard_linked_to_dev_zero_or_outside_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    save_2x2(dir.path());
    let shard = dir.path().join("shard-00001.safetensors");
    replace_with_symlink(Path::new("/dev/zero"), &shard);
    expect_refused(read_w(dir.path()), "shard-00001.safetensors", |p| matches!(p, FileProblem::LeavesDirectory { .. }));
    // A regular file outside the directory (`/etc/passwd` in the report) is not opened either.
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("passwd");
    std::fs::write(&victim, "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    replace_with_symlink(&victim, &shard);
    expect_refused(read_w(dir.path()), "shard-00001.safetensors", |p| matches!(p, FileProblem::LeavesDirectory { .. }));
    // ... nor through a chain of links that starts inside the directory.
    let hop = dir.path().join("hop");
    symlink(&victim, &hop).unwrap();
    replace_with_symlink(Path::new("hop"), &shard);
    expect_refused(read_w(dir.path()), "shard-00001.safetensors", |p| matches!(p, FileProblem::LeavesDirectory { .. }));
    // A link that leaves and comes back (`../<dir>/file`) resolves inside: accepted.
    let real = dir.path().join("moved.safetensors");
    std::fs::remove_file(&hop).unwrap();
    std::fs::remove_file(&shard).unwrap();
    save_2x2(outside.path());
    std::fs::copy(outside.path().join("shard-00001.safetensors"), &real).unwrap();
    let name = dir.path().file_name().unwrap();
    symlink(Path::new("..").join(name).join("moved.safetensors"), &shard).unwrap();
    read_w(dir.path()).unwrap();
}

#[test]
fn dangling_link_and_directory_entries() {
    let dir = tempfile::tempdir().unwrap();
    save_2x2(dir.path());
    // A shard that is a directory is reported as such (it used to read as "truncated").
    let shard = dir.path().join("shard-00003.safetensors");
    std::fs::remove_file(&shard).unwrap();
    std::fs::create_dir(&shard).unwrap();
    expect_refused(read_w(dir.path()), "shard-00003.safetensors", |p| {
        *p == FileProblem::NotRegular(FileKind::Directory)
    });
    std::fs::remove_dir(&shard).unwrap();
    symlink("nowhere.safetensors", &shard).unwrap();
    expect_checkpoint_error(read_w(dir.path()), "shard-00003.safetensors", "does not resolve");
    // An index that is a directory.
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir(other.path().join("index.json")).unwrap();
    expect_refused(read_w(other.path()), "index.json", |p| *p == FileProblem::NotRegular(FileKind::Directory));
}

#[test]
fn oversized_index_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let f = std::fs::File::create(dir.path().join("index.json")).unwrap();
    f.set_len(checkpoint::MAX_INDEX_BYTES + 1).unwrap(); // sparse: costs no disk
    let t = Instant::now();
    expect_refused(read_w(dir.path()), "index.json", |p| matches!(p, FileProblem::TooLarge { .. }));
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
}

// -------------------------------------------------------- sizes, offsets and overflow

/// An index of one f64 tensor `w` of `shape` on a 1-rank mesh, with the given blocks.
fn index_of(shape: &[usize], shards: Vec<ShardEntry>) -> CheckpointIndex {
    CheckpointIndex {
        format: FORMAT.into(),
        version: VERSION,
        mesh: MeshInfo { shape: vec![1], dim_names: vec!["x".into()], ranks: vec![0] },
        tensors: vec![TensorEntry {
            name: "w".into(),
            dtype: "F64".into(),
            shape: shape.to_vec(),
            placements: vec!["R".into()],
            shards,
        }],
    }
}

fn block(file: &str, offset: &[usize], shape: &[usize]) -> ShardEntry {
    ShardEntry { file: file.into(), rank: 0, offset: offset.to_vec(), shape: shape.to_vec() }
}

fn write_index(dir: &Path, index: &CheckpointIndex) {
    std::fs::write(dir.join("index.json"), serde_json::to_string(index).unwrap()).unwrap();
}

/// A safetensors file with the given JSON header, followed by `data_bytes` zero bytes.
fn raw_shard(path: &Path, header: &str, data_bytes: usize) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(0u8, data_bytes));
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn index_claiming_2_pow_34_elements_fails_before_allocating() {
    const HUGE: usize = 1 << 34; // 128 GiB of f64
    let dir = tempfile::tempdir().unwrap();
    // The file a hostile index points to: a real small checkpoint's shard.
    save_2x2(dir.path());
    write_index(dir.path(), &index_of(&[HUGE], vec![block("shard-00000.safetensors", &[0], &[HUGE])]));
    let idx_len = std::fs::metadata(dir.path().join("index.json")).unwrap().len();
    assert!(idx_len < 400, "a {idx_len}-byte index");
    expect_checkpoint_error(read_w(dir.path()), "shard-00000.safetensors", "index says");
    // The shard's own header agrees with the index, but the file holds 64 bytes, not 128 GiB.
    let header = format!(r#"{{"w":{{"dtype":"F64","shape":[{HUGE}],"data_offsets":[0,{}]}}}}"#, HUGE * 8);
    raw_shard(&dir.path().join("shard-00000.safetensors"), &header, 64);
    expect_checkpoint_error(read_w(dir.path()), "shard-00000.safetensors", "truncated");
    // Loading onto a mesh takes the same path.
    let r = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        checkpoint::load::<f64>(dir.path(), &mesh, &[("w", &[Replicate][..])]).map(|_| ())
    });
    expect_checkpoint_error(r.map(|_| ()), "shard-00000.safetensors", "truncated");
}

#[test]
fn overflowing_shapes_and_offsets_in_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let f = "shard-00000.safetensors";
    let cases: Vec<(CheckpointIndex, &str)> = vec![
        // Element count wraps to 0 in a release build with a plain product.
        (index_of(&[1 << 32, 1 << 32], vec![block(f, &[0, 0], &[1 << 32, 1 << 32])]), "overflows"),
        // Zero elements, but strides of 2^80.
        (index_of(&[0, 1 << 40, 1 << 40], vec![]), "overflows"),
        // Element count fits, bytes do not.
        (index_of(&[1 << 61], vec![block(f, &[0], &[1 << 61])]), "more bytes"),
        // offset + shape wraps.
        (index_of(&[4], vec![block(f, &[usize::MAX], &[5])]), "lies outside"),
        (index_of(&[4], vec![block(f, &[0], &[usize::MAX])]), "lies outside"),
    ];
    for (index, want) in cases {
        write_index(dir.path(), &index);
        expect_checkpoint_error(read_w(dir.path()), "index.json", want);
    }
    // Numbers past u64 are malformed JSON for the index's integer fields.
    let text = serde_json::to_string(&index_of(&[4], vec![block(f, &[0], &[4])]))
        .unwrap()
        .replace("[4]", "[18446744073709551616]");
    std::fs::write(dir.path().join("index.json"), text).unwrap();
    expect_checkpoint_error(read_w(dir.path()), "index.json", "malformed");
}

#[test]
fn hostile_shard_headers() {
    let dir = tempfile::tempdir().unwrap();
    save_2x2(dir.path());
    let name = "shard-00003.safetensors";
    let f = dir.path().join(name);
    let good = std::fs::read(&f).unwrap();
    let with_len = |n: u64| {
        let mut b = good.clone();
        b[..8].copy_from_slice(&n.to_le_bytes());
        b
    };
    let len = good.len() as u64;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (with_len(u64::MAX), "bad header"),             // 8 + n overflows
        (with_len(99_999_999), "bad header"),           // under the 100 MB cap, past the end
        (with_len(200_000_000), "bad header"),          // over the cap
        (with_len(len - 7), "bad header"),              // one byte too long
        (good[..7].to_vec(), "truncated"),              // shorter than the length field (`len - 8`)
        (good[..good.len() - 1].to_vec(), "truncated"), // data cut short
        ([good.clone(), vec![0]].concat(), "corrupt"),  // trailing bytes
    ];
    for (bytes, want) in cases {
        std::fs::write(&f, &bytes).unwrap();
        expect_checkpoint_error(read_w(dir.path()), name, want);
    }
    // Headers whose tensor byte count overflows, or whose offsets disagree with the shape.
    for header in [
        r#"{"w":{"dtype":"F64","shape":[2305843009213693952,4],"data_offsets":[0,8]}}"#,
        r#"{"w":{"dtype":"F64","shape":[2],"data_offsets":[0,18446744073709551615]}}"#,
        r#"{"w":{"dtype":"F64","shape":[2],"data_offsets":[8,0]}}"#,
    ] {
        raw_shard(&f, header, 16);
        expect_checkpoint_error(read_w(dir.path()), name, "bad header");
    }
}

// ------------------------------------------------------------------ block structure

#[test]
fn blocks_that_do_not_tile_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = ("a.safetensors", "b.safetensors");
    let cases: Vec<(CheckpointIndex, &str)> = vec![
        (index_of(&[4], vec![block(a, &[0], &[3]), block(b, &[2], &[2])]), "overlap"),
        (index_of(&[4], vec![block(a, &[0], &[4]), block(b, &[0], &[4])]), "same block"),
        (index_of(&[4], vec![block(a, &[0], &[1]), block(b, &[2], &[2])]), "no shard covers 1..2"),
        (index_of(&[4], vec![block(a, &[0], &[2])]), "no shard covers 2..4"),
        // A 2x2 grid with one cell missing.
        (index_of(&[2, 2], vec![block(a, &[0, 0], &[1, 1]), block(b, &[1, 1], &[1, 1])]), "missing"),
        (index_of(&[4], vec![block(a, &[0], &[0]), block(b, &[0], &[4])]), "empty"),
        (index_of(&[0], vec![block(a, &[0], &[1])]), "lies outside"),
        (index_of(&[4], vec![block("../x", &[0], &[4])]), "plain file name"),
        (index_of(&[4], vec![block(".index.json.tmp", &[0], &[4])]), "plain file name"),
        (index_of(&[4], vec![block(a, &[0, 0], &[4, 1])]), "wrong rank"),
    ];
    for (index, want) in cases {
        write_index(dir.path(), &index);
        expect_checkpoint_error(read_w(dir.path()), "index.json", want);
    }
    // Index-level damage.
    let mut twice = index_of(&[4], vec![block(a, &[0], &[4])]);
    twice.tensors.push(twice.tensors[0].clone());
    let mut bad_mesh = index_of(&[4], vec![block(a, &[0], &[4])]);
    bad_mesh.mesh.ranks = vec![0, 1];
    let mut bad_placement = index_of(&[4], vec![block(a, &[0], &[4])]);
    bad_placement.tensors[0].placements = vec!["S(3)".into()];
    for (index, want) in [(twice, "appears twice"), (bad_mesh, "not a mesh"), (bad_placement, "out of range")] {
        std::fs::write(dir.path().join("index.json"), serde_json::to_string(&index).unwrap()).unwrap();
        expect_checkpoint_error(read_w(dir.path()), "index.json", want);
    }
}

/// Seconds to open (parse and validate) an index of one tensor split into `n` blocks: a
/// `[n/100, 100]` grid of rows of 100 elements... plus `n % 100`, kept 0 here.
fn open_seconds(n: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let rows = n / 100;
    let shards =
        (0..rows).flat_map(|r| (0..100).map(move |c| block(&format!("s{r}.safetensors"), &[r, c], &[1, 1]))).collect();
    let mut index = index_of(&[rows, 100], shards);
    index.mesh = MeshInfo { shape: vec![1, 1], dim_names: vec!["a".into(), "b".into()], ranks: vec![0] };
    index.tensors[0].placements = vec!["S(0)".into(), "S(1)".into()];
    std::fs::write(dir.path().join("index.json"), serde_json::to_string(&index).unwrap()).unwrap();
    let t = Instant::now();
    let c = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(c.index().tensors[0].shards.len(), n);
    t.elapsed().as_secs_f64()
}

#[test]
fn forty_thousand_block_index_validates_fast() {
    // Best of three against noise from other work on the machine.
    let best = |n| (0..3).map(|_| open_seconds(n)).fold(f64::INFINITY, f64::min);
    let (t10, t40) = (best(10_000), best(40_000));
    eprintln!("open: 10k blocks {t10:.4} s, 40k blocks {t40:.4} s (ratio {:.1})", t40 / t10);
    // The quadratic check took 5 s at 40k; linearithmic is ~4x from 10k to 40k, quadratic 16x.
    assert!(t40 < 3.0, "40k blocks took {t40:.2} s");
    assert!(t40 < 10.0 * t10 + 0.05, "40k/10k = {:.1}: not linearithmic", t40 / t10);
}

// ------------------------------------------------------------------ saving into a hostile directory

fn save_small(dir: &Path) -> dtensor_runtime::Result<()> {
    let g = global(&[4, 3], 2);
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        let t = distribute_tensor(&g, &mesh, &[Shard(0)], None)?;
        checkpoint::save(dir, &[("w".to_string(), t)])
    })
    .map(|_| ())
}

#[test]
fn planted_links_are_replaced_not_followed_on_save() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victims: Vec<PathBuf> = (0..3).map(|i| outside.path().join(format!("victim{i}"))).collect();
    for v in &victims {
        std::fs::write(v, "precious").unwrap();
    }
    // The name the old code wrote through, the index itself, and a shard file.
    symlink(&victims[0], dir.path().join("index.json.tmp")).unwrap();
    symlink(&victims[1], dir.path().join("index.json")).unwrap();
    symlink(&victims[2], dir.path().join("shard-00000.safetensors")).unwrap();
    save_small(dir.path()).unwrap();
    for v in &victims {
        assert_eq!(std::fs::read_to_string(v).unwrap(), "precious", "{v:?} was written through a link");
    }
    for name in ["index.json", "shard-00000.safetensors"] {
        let m = std::fs::symlink_metadata(dir.path().join(name)).unwrap();
        assert!(m.file_type().is_file(), "{name} is not a regular file after save");
    }
    // The checkpoint is whole, and no temporary file is left behind.
    let mut c = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(c.read_full::<f64>("w").unwrap(), global(&[4, 3], 2));
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["index.json", "index.json.tmp", "shard-00000.safetensors", "shard-00001.safetensors"]);
}
