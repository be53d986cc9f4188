//! # dtensor
//!
//! Distributed tensors for Rust, with a compile-time sharding DSL.
//!
//! This facade re-exports the runtime ([`dtensor_runtime`]) and the proc macros
//! ([`dtensor_macros`]) so that users depend on one crate:
//!
//! ```
//! use dtensor::prelude::*;
//!
//! let out = dtensor::run(4, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[4], &["tp"])?;
//!     let global = ndarray::ArrayD::from_shape_fn(vec![5, 3], |ix| (ix[0] * 3 + ix[1]) as f32);
//!     let dt = distribute_tensor(&global, &mesh, &[Shard(0)], Some(0))?;
//!     let full = dt.full_tensor()?;
//!     assert_eq!(full, global);
//!     Ok(dt.to_local().shape().to_vec())
//! })
//! .unwrap();
//! // torch.chunk semantics: 5 rows over 4 ranks -> 2, 2, 1, 0
//! assert_eq!(out, vec![vec![2, 3], vec![2, 3], vec![1, 3], vec![0, 3]]);
//! ```
pub use dtensor_macros::*;
pub use dtensor_runtime::*;

/// The README's Rust snippets, compiled and run as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The Rust snippets of docs/ADDING_AN_OP.md, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/ADDING_AN_OP.md")]
pub struct AddingAnOpDoctests;

/// The Rust snippets of docs/CHECKPOINTS.md, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/CHECKPOINTS.md")]
pub struct CheckpointsDoctests;

/// The Rust snippets of docs/EXAMPLES.md, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/EXAMPLES.md")]
pub struct ExamplesDoctests;

/// The Rust snippets of docs/FSDP.md, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/FSDP.md")]
pub struct FsdpDoctests;

/// The Rust snippets of docs/MIXED_PRECISION.md, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/MIXED_PRECISION.md")]
pub struct MixedPrecisionDoctests;

/// The Rust snippets of docs/OVERLAP.md, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/OVERLAP.md")]
pub struct OverlapDoctests;
