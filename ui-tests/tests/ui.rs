//! Compile-time checks of the typed layer and `#[distribute]`, with trybuild.
//!
//! The `.stderr` snapshots are rustc 1.95.0's exact output; another compiler words and
//! places spans differently, so there the test is ignored rather than failed. Pass and fail
//! cases are one `TestCases` set: with pass cases present trybuild runs `cargo build`, which
//! also evaluates the `const` checks (a plain `cargo check` would not). Regenerate snapshots
//! with `TRYBUILD=overwrite cargo test -p ui-tests` and read every `.stderr` afterwards.

#[rustversion::attr(not(stable(1.95)), ignore = "UI snapshots are made with rustc 1.95")]
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
