//! Compile-time sharding layer: placement marker types, per-op rule traits and the typed
//! tensor [`Dt`].
//!
//! A layout is a tuple of markers, one per mesh dim: `(Shard<0>, Replicate)`. Each op's
//! placement rule is a trait on one mesh dim ([`MatmulRule`], [`AddRule`], ...), lifted to the
//! whole layout; the output layout is the trait's associated type, so the type system computes
//! it, and an illegal combination fails to compile with a message naming the op, the markers
//! and the mesh dim:
//!
//! ```compile_fail,E0277
//! use dtensor_runtime::typed::{dims::{dp, tp}, Dt, Replicate, Shard};
//! fn f(a: &Dt<f32, (dp, tp), (Replicate, Shard<0>), 2>, b: &Dt<f32, (dp, tp), (Replicate, Shard<0>), 2>) {
//!     // error: matmul of `Shard<0>` × `Shard<0>` on mesh dim `tp` is not a legal layout
//!     let _ = a.matmul(b);
//! }
//! ```
//!
//! The dynamic [`DTensor`](crate::DTensor) stays the ground truth: every typed op calls the
//! dynamic op and checks that its placements are the ones the type promised.

pub mod attention;
pub mod broadcast;
pub mod cat;
pub mod custom;
pub mod dims;
pub mod embedding;
mod fsdp;
pub mod grad;
mod hf_load;
pub mod index;
pub mod layout;
mod lift;
pub mod local_map;
pub mod loss;
pub mod markers;
pub mod mask;
pub mod matmul;
pub mod norm;
#[doc(hidden)] // only `#[distribute]`'s generated code uses it
pub mod operand;
pub mod params;
pub mod permute;
pub mod pointwise;
#[doc(hidden)] // only `#[distribute]`'s generated code uses it
pub mod probe;
pub mod rank;
pub mod redistribute;
pub mod reduce;
pub mod repeat;
pub mod rotary;
pub mod same;
pub mod slice;
pub mod source;
pub mod tensor;
pub mod transpose;
pub mod unary;
pub mod view;

pub use custom::{TypedOp1, TypedOp2, TypedOp3};
pub use dims::{MeshDim, MeshDims};
pub use fsdp::{Fsdp, FsdpShards};
pub use grad::{FromLocalGradLayout, LeafGradLayout, LocalGradLayout};
pub use layout::TypedLayout;
pub use markers::{Avg, Max, Min, Partial, PlacementMarker, Product, ReduceMarker, Replicate, Shard, Sum};
pub use matmul::{Batched, LinearLayout, LinearRank, LinearRule, MatmulLayout, MatmulRule, Rank};
pub use params::Parameters;
pub use permute::Permutation;
pub use pointwise::{AddLayout, AddRule, DivLayout, DivRule, MulLayout, MulRule, SubLayout, SubRule};
pub use reduce::Dim;
pub use same::SameLayout;
pub use source::TensorSource;
pub use tensor::Dt;
pub use transpose::{Swap, TransposeLayout, TransposeRule};
pub use view::Dims;
