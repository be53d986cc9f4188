//! Property test: random shapes (uneven included), random 1-3-d meshes of up to 8 ranks,
//! random chains of placement lists. Every step's local shards (Partials through their
//! reduction) and the final `full_tensor` are checked against slicing the global tensor.

mod common;

use common::{check_layout, global};
use dtensor_runtime::{distribute_tensor, run, Placement, ReduceOp};
use proptest::prelude::*;

fn mesh_strategy() -> impl Strategy<Value = Vec<usize>> {
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

#[derive(Debug, Clone)]
struct Case {
    mesh: Vec<usize>,
    shape: Vec<usize>,
    chain: Vec<Vec<Placement>>,
    seed: u64,
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (mesh_strategy(), prop::collection::vec(0usize..9, 1..=4), any::<u64>()).prop_flat_map(|(mesh, shape, seed)| {
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

fn check_case(case: &Case) -> Result<(), String> {
    let g = global(&case.shape, case.seed);
    let world: usize = case.mesh.iter().product();
    let names: Vec<String> = (0..case.mesh.len()).map(|i| format!("m{i}")).collect();
    let out = run(world, |ctx| {
        let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        let mesh = ctx.init_device_mesh(&case.mesh, &names)?;
        let mut dt = distribute_tensor(&g, &mesh, &case.chain[0], None)?;
        let mut locals = vec![dt.to_local()];
        for p in &case.chain[1..] {
            dt = dt.redistribute(p)?;
            assert_eq!(dt.placements(), &p[..]);
            locals.push(dt.to_local());
        }
        Ok((locals, dt.full_tensor()?))
    })
    .map_err(|e| format!("run failed: {e}"))?;
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

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn redistribution_chains_match_global(case in case_strategy()) {
        if let Err(e) = check_case(&case) {
            return Err(TestCaseError::fail(format!("{e}\ncase: {case:?}")));
        }
    }
}
