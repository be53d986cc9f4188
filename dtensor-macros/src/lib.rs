//! Proc macros of dtensor-rs (filled by the DSL work).
