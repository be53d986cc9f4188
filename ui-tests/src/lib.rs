//! trybuild UI tests of the `#[distribute]` DSL and the typed layer live in `tests/`; see the
//! README for how to regenerate the snapshots.
