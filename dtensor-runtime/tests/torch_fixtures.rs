//! Parity with PyTorch's own DTensor, through fixtures PyTorch computed (not this project):
//! `tests/fixtures/torch_dtensor.json`, made by `scripts/gen_torch_fixtures.py` with PyTorch
//! 2.15 on CPU (gloo, one process per rank). The other tests derive their expected shards
//! from this crate's layout code; these compare against an independent implementation:
//!
//! - the torch.chunk table of `Shard` (size, offset per rank, sizes 0..17 over 1..8 ranks);
//! - `compute_local_shape_and_global_offset` for 1-, 2- and 3-d meshes, nested sharding included;
//! - redistribution chains: every step's local shard on every rank, bit for bit, and the
//!   final full tensor. Chains start from `distribute_tensor` or from `from_local` with
//!   Partial placements.

use dtensor_runtime::layout::{checked_chunk_size_and_offset, checked_local_shape_and_offset};
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::placement::without_partials;
use dtensor_runtime::{distribute_tensor, from_local, run, FromLocal, Placement, ReduceOp};
use serde_json::Value;

fn fixtures() -> Value {
    let text = include_str!("fixtures/torch_dtensor.json");
    serde_json::from_str(text).expect("fixture file is JSON")
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("unsigned") as usize).collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number")).collect()
}

/// `"S(1)"`, `"R"`, `"P(sum)"` as PyTorch prints them (the generator's encoding).
fn placement(s: &str) -> Placement {
    match s {
        "R" => Placement::Replicate,
        _ if s.starts_with("S(") => Placement::Shard(s[2..s.len() - 1].parse().expect("shard dim")),
        _ if s.starts_with("P(") => {
            let op = match &s[2..s.len() - 1] {
                "sum" => ReduceOp::Sum,
                "avg" => ReduceOp::Avg,
                "max" => ReduceOp::Max,
                "min" => ReduceOp::Min,
                "product" => ReduceOp::Product,
                other => panic!("unknown reduce op {other} in the fixtures"),
            };
            Placement::Partial(op)
        }
        _ => panic!("unknown placement {s} in the fixtures"),
    }
}

fn placements(v: &Value) -> Vec<Placement> {
    v.as_array().expect("array").iter().map(|p| placement(p.as_str().expect("string"))).collect()
}

/// Element `i` of a generated tensor: the generator's formula.
fn value(i: usize, seed: u64) -> f64 {
    ((i as u64 * 7919 + seed * 104729) % 97) as f64 - 48.0
}

fn generated(shape: &[usize], seed: u64) -> ArrayD<f64> {
    let n: usize = shape.iter().product();
    ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(|i| value(i, seed)).collect()).expect("shape")
}

fn coord_of(rank: usize, mesh: &[usize]) -> Vec<usize> {
    let mut c = vec![0; mesh.len()];
    let mut r = rank;
    for i in (0..mesh.len()).rev() {
        c[i] = r % mesh[i];
        r /= mesh[i];
    }
    c
}

fn has_shard_to_partial(steps: &[Value]) -> bool {
    steps.windows(2).any(|w| {
        let (a, b) = (placements(&w[0]["placements"]), placements(&w[1]["placements"]));
        a.iter().zip(&b).any(|(x, y)| x.is_shard() && y.is_partial())
    })
}

#[test]
fn chunk_table_matches_torch() {
    let f = fixtures();
    let rows = f["chunk"].as_array().expect("chunk table");
    assert!(rows.len() > 600, "the table covers sizes 0..17 over 1..8 ranks");
    for row in rows {
        let r = usizes(row);
        let (size, n, rank, want_size, want_off) = (r[0], r[1], r[2], r[3], r[4]);
        let (got_size, got_off) = checked_chunk_size_and_offset(size, n, rank).unwrap();
        assert_eq!(got_size, want_size, "size {size} over {n}, rank {rank}: local size");
        // PyTorch puts an empty shard's offset at the end of the dim as well.
        assert_eq!(got_off, want_off, "size {size} over {n}, rank {rank}: offset");
    }
}

#[test]
fn local_shapes_and_offsets_match_torch() {
    let f = fixtures();
    let mut checked = 0;
    for m in f["meshes"].as_array().expect("meshes") {
        let mesh = usizes(&m["mesh"]);
        for l in m["layouts"].as_array().expect("layouts") {
            let shape = usizes(&l["shape"]);
            let ps = placements(&l["placements"]);
            for (rank, want) in l["ranks"].as_array().expect("ranks").iter().enumerate() {
                let (ls, off) = checked_local_shape_and_offset(&shape, &mesh, &coord_of(rank, &mesh), &ps).unwrap();
                assert_eq!(ls, usizes(&want[0]), "mesh {mesh:?} shape {shape:?} {ps:?} rank {rank}: local shape");
                // PyTorch reports offset 0 on dims of size 0 and at an empty shard's dim it
                // reports the end of the parent block, as we do; compare only where elements exist.
                if ls.iter().all(|&s| s > 0) {
                    assert_eq!(off, usizes(&want[1]), "mesh {mesh:?} shape {shape:?} {ps:?} rank {rank}: offset");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "only {checked} layouts checked");
}

/// The value PyTorch's Partial shards of `rank` stand for: the fixture data of every rank that
/// differs from `rank` only on Partial mesh dims, reduced element-wise with their reduce op
/// (the fixtures never mix reduce ops in one layout).
fn reduce_over_partial_groups(ranks: &Value, rank: usize, mesh: &[usize], ps: &[Placement]) -> Vec<f64> {
    let ops: Vec<ReduceOp> =
        ps.iter().filter_map(|p| if let Placement::Partial(op) = p { Some(*op) } else { None }).collect();
    assert!(ops.windows(2).all(|w| w[0] == w[1]), "mixed Partial fixture {ps:?}");
    let me = coord_of(rank, mesh);
    let world: usize = mesh.iter().product();
    let group: Vec<Vec<f64>> = (0..world)
        .filter(|&r| {
            let c = coord_of(r, mesh);
            (0..mesh.len()).all(|i| ps[i].is_partial() || c[i] == me[i])
        })
        .map(|r| floats(&ranks[r]["data"]))
        .collect();
    let fold = |f: fn(f64, f64) -> f64| -> Vec<f64> {
        (0..group[0].len()).map(|k| group.iter().map(|d| d[k]).reduce(f).expect("non-empty group")).collect()
    };
    match ops[0] {
        ReduceOp::Sum => fold(|a, b| a + b),
        ReduceOp::Avg => fold(|a, b| a + b).into_iter().map(|v| v / group.len() as f64).collect(),
        ReduceOp::Max => fold(f64::max),
        ReduceOp::Min => fold(f64::min),
        ReduceOp::Product => fold(|a, b| a * b),
    }
}

/// Runs every chain of the fixtures (those with or without Shard -> Partial steps) and
/// compares each step's local shard on every rank, bit for bit, and the final full tensor.
fn run_chains(with_shard_to_partial: bool) -> usize {
    let f = fixtures();
    let mut steps_checked = 0;
    for m in f["meshes"].as_array().expect("meshes") {
        let mesh_shape = usizes(&m["mesh"]);
        let world: usize = mesh_shape.iter().product();
        let chains: Vec<&Value> = m["chains"]
            .as_array()
            .expect("chains")
            .iter()
            .filter(|c| has_shard_to_partial(c["steps"].as_array().expect("steps")) == with_shard_to_partial)
            .collect();
        let names: Vec<String> = (0..mesh_shape.len()).map(|i| format!("d{i}")).collect();
        let counts = run(world, |ctx| {
            let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
            let mesh = ctx.init_device_mesh(&mesh_shape, &names)?;
            let rank = ctx.rank();
            let mut n = 0;
            for c in &chains {
                let shape = usizes(&c["shape"]);
                let seed = c["seed"].as_u64().expect("seed");
                let steps = c["steps"].as_array().expect("steps");
                let first = placements(&steps[0]["placements"]);
                let mine = &steps[0]["ranks"][rank];
                let mut dt = if c["from_local"].as_bool().expect("flag") {
                    let local = ArrayD::from_shape_vec(IxDyn(&usizes(&mine["shape"])), floats(&mine["data"]))
                        .expect("fixture local shape");
                    from_local(local, &mesh, &first, FromLocal::with_shape(&shape))?
                } else {
                    distribute_tensor(generated(&shape, seed), &mesh, &first, None)?
                };
                for (k, step) in steps.iter().enumerate() {
                    let ps = placements(&step["placements"]);
                    if k > 0 {
                        dt = dt.redistribute(&ps)?;
                    }
                    let want = &step["ranks"][rank];
                    let ctx_msg = format!("mesh {mesh_shape:?} shape {shape:?} step {k} {ps:?} rank {rank}");
                    assert_eq!(dt.placements(), ps.as_slice(), "{ctx_msg}: placements");
                    let local = dt.to_host()?;
                    assert_eq!(local.shape(), usizes(&want["shape"]).as_slice(), "{ctx_msg}: local shape");
                    if with_shard_to_partial && ps.iter().any(|p| p.is_partial()) {
                        // After a Shard -> Partial step a Partial shard's terms depend on the
                        // route taken to it (PyTorch and this planner may route differently);
                        // their reduction does not. Other chains match term for term.
                        let reduced = dt.redistribute(&without_partials(&ps))?.to_host()?;
                        let got: Vec<f64> = reduced.iter().copied().collect();
                        let want = reduce_over_partial_groups(&step["ranks"], rank, &mesh_shape, &ps);
                        assert_eq!(got, want, "{ctx_msg}: reduced Partial values");
                    } else {
                        let got: Vec<f64> = local.iter().copied().collect();
                        assert_eq!(got, floats(&want["data"]), "{ctx_msg}: local values");
                    }
                    n += 1;
                }
                let full: Vec<f64> = dt.full_tensor()?.iter().copied().collect();
                assert_eq!(full, floats(&c["full"]), "mesh {mesh_shape:?} shape {shape:?}: full tensor");
            }
            Ok(n)
        })
        .expect("chains run");
        steps_checked += counts[0] * world;
    }
    steps_checked
}

#[test]
fn redistribution_chains_match_torch() {
    let n = run_chains(false);
    assert!(n > 500, "only {n} (step, rank) pairs checked");
}

#[test]
fn shard_to_partial_chains_match_torch() {
    let n = run_chains(true);
    assert!(n > 50, "only {n} (step, rank) pairs checked");
}
