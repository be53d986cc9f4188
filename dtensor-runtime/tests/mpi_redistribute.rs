//! MPI suite 2: distribute / redistribute under real processes, checked against slicing the
//! global tensor (torch.chunk semantics for uneven shapes), on a 1-d mesh and a 2×2 mesh,
//! plus the redistribution property test with a deterministic RNG (every process draws the
//! same cases; outcomes are computed from data gathered to every rank, so all agree).
//! Run under `mpirun -np 4` (scripts/mpi-tests.sh).

mod common;
mod mpi_harness;
mod prop_cases;

use common::{coord_of, expected_shard, global};
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::{
    distribute_tensor, from_local, BackwardOptions, DeviceMesh, FromLocal, Placement, RankCtx, ReduceOp, Replicate,
    Shard,
};
use mpi_harness::{fail, Outcome, TestFn};
use prop_cases::{case_strategy, check_outputs, mesh_factorizations, run_chain, RankOutput};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

const SHAPES: [&[usize]; 5] = [&[5, 3], &[3], &[7, 2, 3], &[2, 9], &[1, 4]];

/// Every placement list over Shard(0..ndim) and Replicate for a mesh of `mesh_ndim` dims.
fn placement_lists(mesh_ndim: usize, ndim: usize) -> Vec<Vec<Placement>> {
    let opts: Vec<Placement> = (0..ndim).map(|d| Shard(d as isize)).chain([Replicate]).collect();
    let mut out = vec![vec![]];
    for _ in 0..mesh_ndim {
        out =
            out.into_iter().flat_map(|l: Vec<Placement>| opts.iter().map(move |p| [&l[..], &[*p]].concat())).collect();
    }
    out
}

fn meshes(ctx: &RankCtx) -> Vec<Vec<usize>> {
    let n = ctx.world_size();
    let mut m = vec![vec![n]];
    if n.is_multiple_of(2) {
        m.push(vec![2, n / 2]);
    }
    m
}

fn same(got: &ArrayD<f64>, want: &ArrayD<f64>, what: &str) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!("{what}: shape {:?}, expected {:?}", got.shape(), want.shape()));
    }
    match got.iter().zip(want.iter()).position(|(a, b)| a != b) {
        Some(i) => Err(format!(
            "{what}: flat element {i} is {}, expected {}",
            got.as_slice().unwrap_or(&[])[i],
            want.iter().nth(i).unwrap()
        )),
        None => Ok(()),
    }
}

fn mesh_of(ctx: &RankCtx, shape: &[usize]) -> Result<DeviceMesh, String> {
    let names: Vec<String> = (0..shape.len()).map(|i| format!("m{i}")).collect();
    let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    ctx.init_device_mesh(shape, &names).map_err(fail)
}

/// distribute_tensor from rank 0, from the last rank, and with every rank holding the data
/// (`None`): non-source ranks pass different data, which must be ignored.
fn distribute_uneven_every_layout(ctx: &RankCtx) -> Result<Outcome, String> {
    let n = ctx.world_size();
    for mshape in meshes(ctx) {
        let mesh = mesh_of(ctx, &mshape)?;
        let coord = coord_of(ctx.rank(), &mshape);
        for shape in SHAPES {
            let g = global(shape, 3);
            for p in placement_lists(mshape.len(), shape.len()) {
                for src in [Some(0), Some(n - 1), None] {
                    let input =
                        if src.is_none() || src == Some(ctx.rank()) { g.clone() } else { g.mapv(|x| x * 0.0 - 999.0) };
                    let dt = distribute_tensor(&input, &mesh, &p, src).map_err(fail)?;
                    let what = format!("mesh {mshape:?} shape {shape:?} {p:?} src {src:?}");
                    same(&dt.to_host().map_err(fail)?, &expected_shard(&g, &mshape, &coord, &p), &what)?;
                    same(&dt.full_tensor().map_err(fail)?, &g, &format!("full_tensor of {what}"))?;
                }
            }
        }
    }
    Ok(Outcome::Pass)
}

/// Every (source, target) pair of Shard/Replicate lists on the 2-d mesh, uneven shapes.
fn redistribute_all_pairs_2d_mesh(ctx: &RankCtx) -> Result<Outcome, String> {
    let n = ctx.world_size();
    if !n.is_multiple_of(2) {
        return Ok(Outcome::Skip(format!("needs an even number of ranks, has {n}")));
    }
    let mshape = vec![2, n / 2];
    let mesh = mesh_of(ctx, &mshape)?;
    let coord = coord_of(ctx.rank(), &mshape);
    for shape in [&[5usize, 3][..], &[3, 7]] {
        let g = global(shape, 11);
        let lists = placement_lists(2, shape.len());
        for from in &lists {
            let dt = distribute_tensor(&g, &mesh, from, Some(0)).map_err(fail)?;
            for to in &lists {
                let r = dt.redistribute(to).map_err(fail)?;
                let what = format!("{shape:?}: {from:?} -> {to:?}");
                same(&r.to_host().map_err(fail)?, &expected_shard(&g, &mshape, &coord, to), &what)?;
                if r.placements() != &to[..] {
                    return Err(format!("{what}: placements became {:?}", r.placements()));
                }
            }
            same(&dt.full_tensor().map_err(fail)?, &g, &format!("full_tensor of {from:?}"))?;
        }
    }
    Ok(Outcome::Pass)
}

/// Partial(op) sources built with from_local (per-rank contributions that reduce to the
/// global slice), redistributed to Replicate and to Shard on the partial mesh dim.
fn partial_sources_reduce(ctx: &RankCtx) -> Result<Outcome, String> {
    let n = ctx.world_size();
    if !n.is_multiple_of(2) {
        return Ok(Outcome::Skip(format!("needs an even number of ranks, has {n}")));
    }
    let mshape = vec![2, n / 2];
    let mesh = mesh_of(ctx, &mshape)?;
    let coord = coord_of(ctx.rank(), &mshape);
    let shape = [5usize, 3];
    let g = global(&shape, 5);
    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
        for pd in 0..2 {
            for other in [Shard(0), Shard(1), Replicate] {
                let mut p = vec![other; 2];
                p[pd] = Placement::Partial(op);
                let k = mshape[pd];
                let c = coord[pd] as f64;
                let x = expected_shard(&g, &mshape, &coord, &p);
                // Contributions that reduce to x over the k members of the partial group.
                let local = x.mapv(|v| match op {
                    ReduceOp::Sum => {
                        if c == 0.0 {
                            v - (k as f64 - 1.0)
                        } else {
                            1.0
                        }
                    }
                    ReduceOp::Avg => v + c - (k as f64 - 1.0) / 2.0,
                    ReduceOp::Max => {
                        if c == 0.0 {
                            v
                        } else {
                            v - 1.0 - c
                        }
                    }
                    _ => {
                        if c == 0.0 {
                            v
                        } else {
                            v + 1.0 + c
                        }
                    }
                });
                let dt = from_local(local, &mesh, &p, FromLocal::with_shape(&shape)).map_err(fail)?;
                for target in [Replicate, Shard(0), Shard(1)] {
                    let mut to = p.clone();
                    to[pd] = target;
                    let r = dt.redistribute(&to).map_err(fail)?;
                    same(
                        &r.to_host().map_err(fail)?,
                        &expected_shard(&g, &mshape, &coord, &to),
                        &format!("{p:?} -> {to:?}"),
                    )?;
                }
            }
        }
    }
    Ok(Outcome::Pass)
}

/// Every rank's output, on every rank: shapes and values through the raw all-gather.
fn gather_outputs(ctx: &RankCtx, mine: &RankOutput) -> dtensor_runtime::Result<Vec<RankOutput>> {
    let mut flat: Vec<f64> = vec![mine.0.len() as f64 + 1.0];
    for a in mine.0.iter().chain([&mine.1]) {
        flat.push(a.ndim() as f64);
        flat.extend(a.shape().iter().map(|&s| s as f64));
        flat.extend(a.iter());
    }
    let world: Vec<usize> = (0..ctx.world_size()).collect();
    let mut lens = vec![0u8; 8 * world.len()];
    ctx.comm().all_gather(&world, (&(flat.len() as u64).to_ne_bytes()).into(), (&mut lens).into())?;
    let max = lens.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap()) as usize).max().unwrap_or(0);
    flat.resize(max, 0.0);
    let mut all = vec![0u8; 8 * max * world.len()];
    ctx.comm().all_gather(&world, bytemuck::cast_slice(&flat).into(), (&mut all).into())?;
    let all: Vec<f64> = bytemuck::pod_collect_to_vec(&all);
    Ok(all
        .chunks(max)
        .map(|mut v| {
            let mut take = |k: usize| {
                let (a, b) = v.split_at(k);
                v = b;
                a.to_vec()
            };
            let count = take(1)[0] as usize;
            let mut arrays: Vec<ArrayD<f64>> = (0..count)
                .map(|_| {
                    let nd = take(1)[0] as usize;
                    let shape: Vec<usize> = take(nd).iter().map(|&s| s as usize).collect();
                    let data = take(shape.iter().product());
                    ArrayD::from_shape_vec(IxDyn(&shape), data).expect("shape matches data")
                })
                .collect();
            let full = arrays.pop().expect("full tensor");
            (arrays, full)
        })
        .collect())
}

fn redistribution_property(ctx: &RankCtx) -> Result<Outcome, String> {
    let cases: u32 = std::env::var("DTENSOR_MPI_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 256, ..Config::default() };
    // Same seed in every process: every rank draws the same cases in the same order.
    let mut runner = TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let strategy = case_strategy(proptest::sample::select(mesh_factorizations(ctx.world_size())));
    let result = runner.run(&strategy, |case| {
        let mine = run_chain(ctx, &case).map_err(|e| TestCaseError::fail(format!("rank failed: {e}")))?;
        let all = gather_outputs(ctx, &mine).map_err(|e| TestCaseError::fail(e.to_string()))?;
        check_outputs(&case, &all).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => Ok(Outcome::Pass),
        Err(TestError::Fail(why, case)) => Err(format!("{why}\nminimal case: {case:?}")),
        Err(e) => Err(e.to_string()),
    }
}

/// `backward_opts` with `overlap_grad_reduce` (MPI_Iallreduce buckets) gives the gradients
/// of plain `backward()`, bit for bit (dp groups of two: a sum of two is the same in any
/// order), for every bucket size, uneven shards included.
fn overlapped_backward_matches_plain(ctx: &RankCtx) -> Result<Outcome, String> {
    let n = ctx.world_size();
    if !n.is_multiple_of(2) {
        return Ok(Outcome::Skip(format!("needs an even number of ranks, has {n}")));
    }
    let mesh = mesh_of(ctx, &[2, n / 2])?;
    let grads = |opts: Option<BackwardOptions>| -> dtensor_runtime::Result<Vec<Vec<f64>>> {
        let (batch, dim, hidden) = (5, 3, 7);
        let w1 =
            distribute_tensor(global(&[dim, hidden], 1), &mesh, &[Replicate, Shard(1)], None)?.requires_grad_(true);
        let w2 =
            distribute_tensor(global(&[hidden, dim], 2), &mesh, &[Replicate, Shard(0)], None)?.requires_grad_(true);
        let x = distribute_tensor(global(&[batch, dim], 3), &mesh, &[Shard(0), Replicate], None)?;
        let mut h = x;
        for _ in 0..2 {
            let y = h.matmul(&w1)?.gelu()?.matmul(&w2)?.redistribute(&[Shard(0), Replicate])?;
            h = h.add(&y)?;
        }
        let loss = h.mul(&h)?.sum()?;
        match opts {
            Some(o) => loss.backward_opts(&o)?,
            None => loss.backward()?,
        }
        [&w1, &w2].iter().map(|w| Ok(w.grad().expect("a gradient").to_host()?.iter().copied().collect())).collect()
    };
    let plain = grads(None).map_err(fail)?;
    for bucket in [0, 40, usize::MAX] {
        let got = grads(Some(BackwardOptions::new().overlap_grad_reduce(bucket))).map_err(fail)?;
        if got != plain {
            return Err(format!("bucket {bucket} bytes: gradients differ from plain backward"));
        }
    }
    Ok(Outcome::Pass)
}

fn main() {
    let tests: &[(&str, TestFn)] = &[
        ("distribute_uneven_every_layout", distribute_uneven_every_layout),
        ("redistribute_all_pairs_2d_mesh", redistribute_all_pairs_2d_mesh),
        ("partial_sources_reduce", partial_sources_reduce),
        ("redistribution_property", redistribution_property),
        ("overlapped_backward_matches_plain", overlapped_backward_matches_plain),
    ];
    mpi_harness::main("mpi_redistribute", tests);
}
