//! Property test: random shapes (uneven included), random 1-3-d meshes of up to 8 ranks,
//! random chains of placement lists. Every step's local shards (Partials through their
//! reduction) and the final `full_tensor` are checked against slicing the global tensor.

mod common;
mod prop_cases;

use dtensor_runtime::Launch;
use prop_cases::{case_strategy, check_case, mesh_strategy};
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn redistribution_chains_match_global(case in case_strategy(mesh_strategy())) {
        if let Err(e) = check_case(Launch::Threads, &case) {
            return Err(TestCaseError::fail(format!("{e}\ncase: {case:?}")));
        }
    }
}
