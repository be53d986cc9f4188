//! Cross-check with Python's `safetensors`: what Rust saves (full, and sharded with an index)
//! Python reads back value for value, and what Python saves Rust loads onto a 2 x 2 mesh; the
//! same for integer tensors (`I64` beyond 2⁵³, `I32`, `U8`).
//!
//! Needs a Python with `safetensors` and `numpy`, named by `DTENSOR_PYTHON`
//! (e.g. `python3 -m venv /work/venv-st && /work/venv-st/bin/pip install safetensors numpy`,
//! then `DTENSOR_PYTHON=/work/venv-st/bin/python`); skipped with a printed reason otherwise.

mod common;
mod hf_util;

use common::{coord_of, expected_shard};
use dtensor_runtime::checkpoint::hf::{self, HfCheckpoint, LoadPlan};
use dtensor_runtime::layout::checked_local_shape_and_offset;
use dtensor_runtime::module::{ColwiseParallel, RowwiseParallel};
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::{distribute_tensor, run, DTensor, Placement, Replicate, Scalar, Shard};
use hf_util::through;
use safetensors::Dtype;
use std::ffi::OsStr;
use std::process::Command;

/// The Python to use, or why the test is skipped.
fn python() -> Result<String, String> {
    let py = std::env::var("DTENSOR_PYTHON").map_err(|_| "DTENSOR_PYTHON is not set".to_string())?;
    let ok = Command::new(&py).args(["-c", "import safetensors, numpy"]).output().map_err(|e| format!("{py}: {e}"))?;
    if !ok.status.success() {
        return Err(format!("{py} cannot import safetensors and numpy: {}", String::from_utf8_lossy(&ok.stderr)));
    }
    Ok(py)
}

/// Values both sides compute: `(i * 7 + seed) % 61 - 30` over the row-major index, divided by 8
/// (exact in f16, bf16, f32, f64).
fn values(shape: &[usize], seed: usize) -> ArrayD<f64> {
    let mut i = 0;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        i += 1;
        (((i - 1) * 7 + seed) % 61) as f64 / 8.0 - 30.0 / 8.0
    })
}

const PY_VALUES: &str = "
import json, sys, os
import numpy as np
from safetensors.numpy import load_file, save_file
def values(shape, seed):
    n = int(np.prod(shape))
    return (((np.arange(n) * 7 + seed) % 61) / 8.0 - 30.0 / 8.0).reshape(shape)
def ints(shape, seed, mult, off, dtype):
    n = int(np.prod(shape))
    return (((np.arange(n, dtype=np.int64) * 7 + seed) % 61 - 30) * mult + off).astype(dtype).reshape(shape)
";

/// Runs `script` (after the shared `values`) with `args`; returns its output, having checked
/// it succeeded and printed `OK`.
fn run_py(py: &str, script: &str, args: &[&OsStr]) -> String {
    let out = Command::new(py).arg("-c").arg(format!("{PY_VALUES}{script}")).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("OK"), "python failed:\n{text}");
    println!("{text}");
    text
}

/// Name, shape, seed of the tensors Rust saves.
const SAVED: [(&str, &[usize], usize); 3] = [
    ("model.embed_tokens.weight", &[5, 3], 1),
    ("model.layers.0.mlp.up_proj.weight", &[7, 3], 2),
    ("model.norm.weight", &[3], 3),
];

#[test]
fn python_reads_what_rust_saves() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => return println!("skipped: {why}"),
    };
    let dir = tempfile::tempdir().unwrap();
    let (full, sharded) = (dir.path().join("full"), dir.path().join("sharded"));
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let pl: [&[Placement]; 3] = [&[Shard(0), Shard(1)], &[Replicate, Shard(0)], &[Shard(0), Replicate]];
        let mut sd32 = Vec::new();
        let mut sd64 = Vec::new();
        for ((name, shape, seed), p) in SAVED.iter().zip(pl) {
            let g = values(shape, *seed);
            sd64.push((name.to_string(), distribute_tensor(&g, &mesh, p, None)?));
            sd32.push((name.to_string(), distribute_tensor(g.mapv(|x| x as f32), &mesh, p, None)?));
        }
        hf::save(&full, &sd32)?;
        hf::save_sharded(&sharded, &sd64, 100)
    })
    .unwrap();
    let script = "
tensors = json.loads(sys.argv[3])
full = load_file(os.path.join(sys.argv[1], 'model.safetensors'))
index = json.load(open(os.path.join(sys.argv[2], 'model.safetensors.index.json')))
assert set(full) == set(tensors) == set(index['weight_map']), (list(full), list(index['weight_map']))
sharded = {}
for f in sorted(set(index['weight_map'].values())):
    sharded.update(load_file(os.path.join(sys.argv[2], f)))
assert index['metadata']['total_size'] == sum(a.nbytes for a in sharded.values())
for name, (shape, seed) in tensors.items():
    assert full[name].dtype == np.float32 and sharded[name].dtype == np.float64, name
    assert np.array_equal(full[name], values(shape, seed).astype(np.float32)), name
    assert np.array_equal(sharded[name], values(shape, seed)), name
print('python read', len(tensors), 'tensors, full and from', len(set(index['weight_map'].values())), 'files: OK')
";
    let spec: serde_json::Map<String, serde_json::Value> =
        SAVED.iter().map(|(n, s, seed)| (n.to_string(), serde_json::json!([s, seed]))).collect();
    let spec = serde_json::to_string(&spec).unwrap();
    run_py(&py, script, &[full.as_os_str(), sharded.as_os_str(), spec.as_ref()]);
}

#[test]
fn rust_loads_what_python_saves() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => return println!("skipped: {why}"),
    };
    let dir = tempfile::tempdir().unwrap();
    // f16, f32 and f64 (numpy has no bf16), two files and an index as `save_pretrained` writes.
    let script = "
d = sys.argv[1]
a = {'model.layers.0.mlp.up_proj.weight': values([7, 3], 1).astype(np.float16),
     'model.layers.0.mlp.down_proj.weight': values([3, 7], 2).astype(np.float32)}
b = {'model.norm.weight': values([3], 3).astype(np.float64)}
save_file(a, os.path.join(d, 'model-00001-of-00002.safetensors'), metadata={'format': 'pt'})
save_file(b, os.path.join(d, 'model-00002-of-00002.safetensors'), metadata={'format': 'pt'})
wm = {k: 'model-00001-of-00002.safetensors' for k in a}
wm.update({k: 'model-00002-of-00002.safetensors' for k in b})
size = sum(v.nbytes for v in list(a.values()) + list(b.values()))
json.dump({'metadata': {'total_size': size}, 'weight_map': wm}, open(os.path.join(d, 'model.safetensors.index.json'), 'w'))
print('python wrote', len(wm), 'tensors: OK')
";
    run_py(&py, script, &[dir.path().as_os_str()]);
    let expect: [(&str, Dtype, ArrayD<f64>); 3] = [
        ("model.layers.0.mlp.down_proj.weight", Dtype::F32, values(&[3, 7], 2)),
        ("model.layers.0.mlp.up_proj.weight", Dtype::F16, values(&[7, 3], 1)),
        ("model.norm.weight", Dtype::F64, values(&[3], 3)),
    ];
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let plan = LoadPlan::new()
            .style("model.layers.*.mlp.up_proj", ColwiseParallel::new())
            .style("model.layers.*.mlp.down_proj", RowwiseParallel::new());
        let sd = HfCheckpoint::open(dir.path())?.load::<f32>(&mesh, &plan)?;
        for ((name, t), (want_name, dtype, g)) in sd.iter().zip(&expect) {
            assert_eq!(name, want_name);
            let want = expected_shard(&through(*dtype, g), &[2, 2], &coord_of(ctx.rank(), &[2, 2]), t.placements());
            assert_eq!(t.to_host()?.mapv(f64::from), want, "{name}");
        }
        Ok(())
    })
    .unwrap();
    println!("rust loaded python's sharded checkpoint onto 2x2: OK");
}

/// An integer tensor both sides compute: `((i * 7 + seed) % 61 - 30) * mult + off` over the
/// row-major index in i64, then Rust's `as` (numpy's `astype`, which wraps alike). For i64
/// `mult` makes values beyond 2⁵³, which a path through f64 would round.
struct IntSpec {
    name: &'static str,
    shape: &'static [usize],
    seed: i64,
    mult: i64,
    off: i64,
    numpy: &'static str,
}

impl IntSpec {
    fn values<T: Scalar>(&self) -> ArrayD<T> {
        let mut i = 0i64;
        ArrayD::from_shape_fn(IxDyn(self.shape), |_| {
            i += 1;
            T::of_i64(((i - 1) * 7 + self.seed) % 61 * self.mult - 30 * self.mult + self.off)
        })
    }
}

/// One tensor per integer element type: i64, i32, u8.
const INTS: [IntSpec; 3] = [
    IntSpec { name: "input_ids", shape: &[5, 3], seed: 1, mult: 150_000_000_000_000_001, off: 7, numpy: "int64" },
    IntSpec { name: "labels", shape: &[7], seed: 2, mult: 70_000_001, off: -3, numpy: "int32" },
    IntSpec { name: "attention_mask", shape: &[3, 5], seed: 3, mult: 4, off: 0, numpy: "uint8" },
];

/// The specs as JSON for the Python side: `[[name, shape, seed, mult, off, dtype], ..]`.
fn ints_json() -> String {
    let rows: Vec<_> =
        INTS.iter().map(|t| serde_json::json!([t.name, t.shape, t.seed, t.mult, t.off, t.numpy])).collect();
    serde_json::to_string(&rows).unwrap()
}

/// The placements of the integer tensors on the 2 × 2 mesh (uneven shards).
const INT_PLACEMENTS: [&[Placement]; 3] = [
    &[Placement::Shard(0), Placement::Shard(1)],
    &[Placement::Shard(0), Placement::Shard(0)],
    &[Placement::Replicate, Placement::Shard(1)],
];

/// This rank's shard of the global `g` at `placements` on a 2 × 2 mesh.
fn shard_of<T: Scalar>(g: &ArrayD<T>, rank: usize, placements: &[Placement]) -> ArrayD<T> {
    let (shape, off) =
        checked_local_shape_and_offset(g.shape(), &[2, 2], &coord_of(rank, &[2, 2]), placements).unwrap();
    g.slice_each_axis(|ax| {
        let d = ax.axis.index();
        (off[d]..off[d] + shape[d]).into()
    })
    .to_owned()
}

#[test]
fn python_reads_the_integers_rust_saves() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => return println!("skipped: {why}"),
    };
    let dir = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = ["i64", "i32", "u8"].iter().map(|d| dir.path().join(d)).collect();
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let [pa, pb, pc] = INT_PLACEMENTS;
        let a: DTensor<i64> = distribute_tensor(INTS[0].values::<i64>(), &mesh, pa, None)?;
        // Sharded by size with an index: the two tensors land in two files.
        hf::save_sharded(&dirs[0], &[(INTS[0].name.to_string(), a.clone()), ("input_ids.copy".into(), a)], 100)?;
        let b: DTensor<i32> = distribute_tensor(INTS[1].values::<i32>(), &mesh, pb, None)?;
        hf::save(&dirs[1], &[(INTS[1].name.to_string(), b)])?;
        let c: DTensor<u8> = distribute_tensor(INTS[2].values::<u8>(), &mesh, pc, None)?;
        hf::save(&dirs[2], &[(INTS[2].name.to_string(), c)])
    })
    .unwrap();
    let script = "
spec = json.loads(sys.argv[4])
i64s = {}
index = json.load(open(os.path.join(sys.argv[1], 'model.safetensors.index.json')))
for f in sorted(set(index['weight_map'].values())):
    i64s.update(load_file(os.path.join(sys.argv[1], f)))
got = [i64s, load_file(os.path.join(sys.argv[2], 'model.safetensors')), load_file(os.path.join(sys.argv[3], 'model.safetensors'))]
for (name, shape, seed, mult, off, dtype), files in zip(spec, got):
    want = ints(shape, seed, mult, off, np.dtype(dtype))
    keys = [k for k in files if k.startswith(name)]
    assert keys, name
    for key in keys:
        assert files[key].dtype == np.dtype(dtype), (key, files[key].dtype)
        assert np.array_equal(files[key], want), (key, files[key], want)
assert len(i64s) == 2 and i64s['input_ids'].max() > 2**53
print('python read int64 (sharded, beyond 2**53), int32 and uint8 tensors: OK')
";
    let spec = ints_json();
    run_py(&py, script, &[dirs[0].as_os_str(), dirs[1].as_os_str(), dirs[2].as_os_str(), spec.as_ref()]);
}

#[test]
fn rust_loads_the_integers_python_saves() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => return println!("skipped: {why}"),
    };
    let dir = tempfile::tempdir().unwrap();
    let script = "
spec = json.loads(sys.argv[2])
tensors = {n: ints(s, seed, m, o, np.dtype(dt)) for n, s, seed, m, o, dt in spec}
save_file(tensors, os.path.join(sys.argv[1], 'model.safetensors'), metadata={'format': 'pt'})
print('python wrote', len(spec), 'integer tensors: OK')
";
    let spec = ints_json();
    run_py(&py, script, &[dir.path().as_os_str(), spec.as_ref()]);
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let mut ck = HfCheckpoint::open(dir.path())?;
        let (r, [pa, pb, pc]) = (ctx.rank(), INT_PLACEMENTS);
        let a = ck.load_tensor::<i64>(INTS[0].name, &mesh, pa)?;
        assert_eq!(a.to_host()?, shard_of(&INTS[0].values::<i64>(), r, pa));
        let b = ck.load_tensor::<i32>(INTS[1].name, &mesh, pb)?;
        assert_eq!(b.to_host()?, shard_of(&INTS[1].values::<i32>(), r, pb));
        let c = ck.load_tensor::<u8>(INTS[2].name, &mesh, pc)?;
        assert_eq!(c.to_host()?, shard_of(&INTS[2].values::<u8>(), r, pc));
        Ok(())
    })
    .unwrap();
    println!("rust loaded python's int64/int32/uint8 tensors onto 2x2, shard by shard: OK");
}
