//! The redistribution property test (`redistribute_prop.rs`, cases from `prop_cases`) on the
//! `cuda-threads` launch mode: the same random meshes of 1-8 ranks, uneven shapes (torch.chunk
//! semantics), empty shards and chains of placement lists, with every shard on the CUDA device
//! and every step checked against the global host tensor. The case count is capped by a time
//! budget (the GPU check runs every device binary within 4 minutes). Without a GPU it prints a
//! SKIP row and returns.

mod common;
mod cuda_device;
mod prop_cases;

use cuda_device::device;
use dtensor_runtime::layout::checked_local_shape_and_offset;
use dtensor_runtime::Launch;
use prop_cases::{case_strategy, check_case, mesh_strategy, Case};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, TestRunner};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const TEST: &str = "cuda_threads_redistribute_prop";

/// At most this many cases (`PROPTEST_CASES` overrides) ...
fn max_cases() -> usize {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(6000)
}

/// ... and no new case after this long (`GPU_PROP_SECONDS` overrides).
fn budget() -> Duration {
    Duration::from_secs(std::env::var("GPU_PROP_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(30))
}

/// Whether some list of the chain shards unevenly, and whether some rank then holds an empty
/// shard of a non-empty tensor (what the GPU row reports as covered).
fn uneven_and_empty(case: &Case) -> (bool, bool) {
    let world: usize = case.mesh.iter().product();
    let (mut uneven, mut empty) = (false, false);
    for p in &case.chain {
        let sizes: BTreeSet<usize> = (0..world)
            .map(|r| {
                let coord = common::coord_of(r, &case.mesh);
                let (shape, _) = checked_local_shape_and_offset(&case.shape, &case.mesh, &coord, p).unwrap();
                shape.iter().product()
            })
            .collect();
        uneven |= sizes.len() > 1;
        empty |= sizes.contains(&0) && case.shape.iter().all(|&n| n > 0);
    }
    (uneven, empty)
}

/// Shrinks a failing case as proptest does (simplify while it fails, else complicate), within
/// a step cap, and returns the smallest failing case found with its error.
fn shrink(tree: &mut impl ValueTree<Value = Case>, error: String) -> (Case, String) {
    let mut last = (tree.current(), error);
    for _ in 0..200 {
        let more = match check_case(Launch::CudaThreads, &tree.current()) {
            Err(e) => {
                last = (tree.current(), e);
                tree.simplify()
            }
            Ok(()) => tree.complicate(),
        };
        if !more {
            break;
        }
    }
    last
}

#[test]
fn cuda_threads_redistribution_chains_match_global() {
    let Some(dev) = device(TEST) else { return };
    let strategy = case_strategy(mesh_strategy());
    let mut runner = TestRunner::new(Config { failure_persistence: None, ..Config::default() });
    let (start, budget, max) = (Instant::now(), budget(), max_cases());
    let (mut n, mut uneven, mut empty) = (0usize, 0usize, 0usize);
    let mut worlds = BTreeSet::new();
    while n < max && start.elapsed() < budget {
        let mut tree = strategy.new_tree(&mut runner).expect("the case strategy never rejects");
        let case = tree.current();
        if let Err(e) = check_case(Launch::CudaThreads, &case) {
            let (small, err) = shrink(&mut tree, e);
            panic!("{TEST}: {err}\nshrunk case: {small:?}\noriginal case: {case:?}");
        }
        let (u, z) = uneven_and_empty(&case);
        uneven += usize::from(u);
        empty += usize::from(z);
        worlds.insert(case.mesh.iter().product::<usize>());
        n += 1;
    }
    assert!(n > 0, "{TEST}: no case ran within {budget:?}");
    let seen: Vec<String> = worlds.iter().map(|w| w.to_string()).collect();
    println!(
        "GPUCHECK {TEST} | PASS | {n} cases, worlds 1-8 (seen {}), {uneven} with uneven shards, {empty} with empty \
         shards, f64 on cuda:{} ({}), {:.1} s",
        seen.join(","),
        dev.ordinal(),
        dev.name().unwrap_or_default(),
        start.elapsed().as_secs_f64()
    );
}
