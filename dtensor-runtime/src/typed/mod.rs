//! Compile-time layer: placement marker types and typed DTensors (filled by the DSL work).
