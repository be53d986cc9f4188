//! trybuild UI tests of the #[distribute] DSL live in tests/.
