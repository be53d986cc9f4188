//! Redistribution property cases shared by the thread-backend property test
//! (`redistribute_prop.rs`), its `cuda-threads` run (`cuda_threads_prop.rs`) and the MPI
//! suite (`mpi_redistribute.rs`): the case generator, the per-rank chain runner and the check
//! against the global tensor.
#![allow(dead_code)]

use crate::common::{check_layout, global};
use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::{distribute_tensor, launch, Launch, Placement, RankCtx, ReduceOp};
use proptest::prelude::*;

/// Random 1-3-d meshes of up to 8 ranks (thread backend: any world size).
pub fn mesh_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        (1usize..=8).prop_map(|a| vec![a]),
        (1usize..=4, 1usize..=4).prop_filter("≤ 8 ranks", |(a, b)| a * b <= 8).prop_map(|(a, b)| vec![a, b]),
        (1usize..=2, 1usize..=2, 1usize..=2).prop_map(|(a, b, c)| vec![a, b, c]),
    ]
}

fn placement_strategy(ndim: usize) -> impl Strategy<Value = Placement> {
    prop_oneof![
        3 => (0..ndim).prop_map(|d| Placement::Shard(d as isize)),
        2 => Just(Placement::Replicate),
        1 => prop_oneof![
            Just(ReduceOp::Sum), Just(ReduceOp::Avg), Just(ReduceOp::Max), Just(ReduceOp::Min)
        ].prop_map(Placement::Partial),
    ]
}

/// One generated chain: mesh shape, tensor shape, placement lists, data seed.
#[derive(Debug, Clone)]
pub struct Case {
    pub mesh: Vec<usize>,
    pub shape: Vec<usize>,
    pub chain: Vec<Vec<Placement>>,
    pub seed: u64,
}

/// Random cases on meshes drawn from `meshes`.
pub fn case_strategy(meshes: impl Strategy<Value = Vec<usize>>) -> impl Strategy<Value = Case> {
    (meshes, prop::collection::vec(0usize..9, 1..=4), any::<u64>()).prop_flat_map(|(mesh, shape, seed)| {
        let m = mesh.len();
        let nd = shape.len();
        let list = prop::collection::vec(placement_strategy(nd), m);
        prop::collection::vec(list, 2..=5).prop_map(move |lists| {
            // Make the chain legal: the first list has no Partial (distribute_tensor), a
            // Partial is only reached from Replicate or the same Partial, and a list uses one
            // reduce op for all its Partials (so the reference reduction is well defined).
            let mut chain: Vec<Vec<Placement>> = Vec::new();
            for (k, mut l) in lists.into_iter().enumerate() {
                let op = l.iter().find_map(|p| match p {
                    Placement::Partial(o) => Some(*o),
                    _ => None,
                });
                for i in 0..l.len() {
                    if let Placement::Partial(_) = l[i] {
                        let prev = chain.last().map(|p: &Vec<Placement>| p[i]);
                        l[i] = match prev {
                            None => Placement::Replicate,
                            Some(Placement::Replicate) => Placement::Partial(op.unwrap()),
                            Some(p @ Placement::Partial(_)) => p,
                            Some(_) => Placement::Replicate,
                        };
                    }
                }
                // one op per list, also against Partials kept from the previous list
                let ops: Vec<ReduceOp> = l
                    .iter()
                    .filter_map(|p| match p {
                        Placement::Partial(o) => Some(*o),
                        _ => None,
                    })
                    .collect();
                if ops.windows(2).any(|w| w[0] != w[1]) {
                    let prev = chain.last().cloned();
                    for i in 0..l.len() {
                        if l[i].is_partial() && prev.as_ref().map(|p| p[i] != l[i]).unwrap_or(true) {
                            l[i] = Placement::Replicate;
                        }
                    }
                }
                let _ = k;
                chain.push(l);
            }
            Case { mesh: mesh.clone(), shape: shape.clone(), chain, seed }
        })
    })
}

/// Every mesh shape of 1-3 dims whose sizes multiply to exactly `world` (MPI: fixed world).
pub fn mesh_factorizations(world: usize) -> Vec<Vec<usize>> {
    let divs: Vec<usize> = (1..=world).filter(|d| world.is_multiple_of(*d)).collect();
    let mut out: Vec<Vec<usize>> = vec![vec![world]];
    for &a in &divs {
        out.push(vec![a, world / a]);
        for &b in divs.iter().filter(|&&b| (world / a).is_multiple_of(b)) {
            out.push(vec![a, b, world / a / b]);
        }
    }
    out
}

/// What one rank produces for a case: its local tensor after every step, and `full_tensor`.
pub type RankOutput = (Vec<ArrayD<f64>>, ArrayD<f64>);

/// The per-rank body: distribute the global tensor, walk the chain, gather the full tensor.
pub fn run_chain(ctx: &RankCtx, case: &Case) -> dtensor_runtime::Result<RankOutput> {
    let g = global(&case.shape, case.seed);
    let names: Vec<String> = (0..case.mesh.len()).map(|i| format!("m{i}")).collect();
    let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let mesh = ctx.init_device_mesh(&case.mesh, &names)?;
    let mut dt = distribute_tensor(&g, &mesh, &case.chain[0], None)?;
    assert_eq!(dt.device(), ctx.device(), "shards live on the rank's device");
    let mut locals = vec![dt.to_host()?];
    for p in &case.chain[1..] {
        dt = dt.redistribute(p)?;
        assert_eq!(dt.placements(), &p[..]);
        assert_eq!(dt.device(), ctx.device(), "shards stay on the rank's device");
        locals.push(dt.to_host()?);
    }
    Ok((locals, dt.full_tensor()?))
}

/// Runs `case` on in-process ranks of `mode`, one per mesh position (every rank's result comes back), and
/// checks them against the global tensor.
pub fn check_case(mode: Launch, case: &Case) -> Result<(), String> {
    let world: usize = case.mesh.iter().product();
    let out = launch(mode, world, |ctx| run_chain(&ctx, case)).map_err(|e| format!("run failed on {mode}: {e}"))?;
    check_outputs(case, &out)
}

/// Checks every rank's outputs (`out[rank]`) against slicing/reducing the global tensor.
pub fn check_outputs(case: &Case, out: &[RankOutput]) -> Result<(), String> {
    let g = global(&case.shape, case.seed);
    for (step, placements) in case.chain.iter().enumerate() {
        let locals: Vec<_> = out.iter().map(|(l, _)| l[step].clone()).collect();
        check_layout(&g, &case.mesh, placements, &locals, 1e-9).map_err(|e| format!("step {step}: {e}"))?;
    }
    for (rank, (_, full)) in out.iter().enumerate() {
        let tol_ok = full.shape() == g.shape()
            && full.iter().zip(g.iter()).all(|(a, b)| (a - b).abs() <= 1e-9 * (1.0 + b.abs()));
        if !tol_ok {
            return Err(format!("full_tensor on rank {rank} differs from the global tensor"));
        }
    }
    Ok(())
}
