//! Ops on DTensor: each op = a sharding rule (input placements → output placements, plus any
//! input redistribution) and a local kernel of the [`Storage`] surface (an op enum, run on
//! the shard's device), recorded for autograd.
//!
//! | family | ops | rule (per mesh dim) |
//! |---|---|---|
//! | [`pointwise`] | add sub mul div, *_scalar, neg exp log relu gelu tanh sqrt | same placement in → out; Partial only through linear ops |
//! | [`math`] | silu sigmoid softplus pow rsqrt abs clamp gelu_with swiglu | same placement in → out; Partial reduced first |
//! | [`mask`] | eq/ne/lt/le/gt/ge masks, where, masked_fill, tril, triu | element-wise, no Partial; tril/triu keep every placement |
//! | [`matmul`] | matmul (2-D, batched) | (R,R)→R, (S(m),R)→S(m), (R,S(n))→S(n), (S(k),S(k))→P, (P,R)→P, (R,P)→P, batch dims shard through |
//! | [`reduction`] | sum/mean/max/min over dims or all, argmax/argmin | reduced sharded dim → Partial(sum / max / min), others remapped; arg* replicate the dim |
//! | [`softmax`] | softmax, log_softmax | not sharded on the softmax dim |
//! | [`view`] | transpose, permute, reshape, flatten, unflatten, squeeze, unsqueeze, expand, contiguous | shard dims remapped |
//! | [`slice`](mod@slice) | narrow, slice, split, split_with_sizes, chunk | a shard of the sliced dim → Replicate first |
//! | [`cat`](mod@cat) | cat, stack | same placement on every input; the cat dim unsharded |
//! | [`repeat`] | repeat, repeat_interleave | composed of reshape/expand |
//! | [`index`] | index_select, gather | the indexed dim Replicate (or the index sharded) |
//! | [`embedding`] | embedding, one_hot | vocab-sharded table → masked lookup, Partial(sum) |
//! | [`norm`] | layer_norm, rms_norm | non-normalised dims sharded for free; normalised dims, weight, bias Replicate |
//! | [`dropout`] | dropout | every placement kept, Partial reduced; placement-invariant mask |
//! | [`attention`] | scaled_dot_product_attention, apply_rotary | batch/head dims sharded alike, or q sequence-sharded with k/v Replicate; local |
//! | [`loss`] | cross_entropy, mse_loss | composed of the above |
//! | [`custom`] | a user's op ([`CustomOp`], [`apply_op`]) | the user's [`DimRule`]s |
//! | [`local_map`](mod@local_map) | a user's function on local shards ([`LocalMap`]) | declared input/output placements |
//!
//! Comparisons, `where`, `masked_fill`, views, slices, `cat`, `repeat` and indexing are
//! written once over [`Scalar`], so integer tensors (`i64`, `i32`, `u8`) take
//! them under the same rules; their backward rules reach float-only ops through
//! `grad_kernels`, and an integer tensor never records one. Every other op needs
//! [`Element`] (floats).
//!
//! When the inputs match no rule, the op redistributes them to the strategy that moves the
//! fewest bytes (see [`strategy`]) and records it ([`implicit_redistributions`]); when no
//! strategy is reachable it returns [`Error::NoShardingRule`]. Inside a `#[distribute]` function
//! such a redistribution is an [`Error::ImplicitCollective`] instead (see [`implicit`]).
//! Collectives an op issues are attributed to it in [`CommDebugMode`](crate::CommDebugMode).
//!
//! The signatures of `add sub mul div relu gelu matmul sum_dim transpose` are the contract the
//! typed layer (`crate::typed`) builds on.

pub mod attention;
pub mod cat;
pub mod custom;
pub(crate) mod dispatch;
pub mod dropout;
pub mod embedding;
mod grad_kernels;
pub mod implicit;
pub mod index;
pub mod local_map;
pub mod loss;
pub mod mask;
pub mod math;
pub mod matmul;
pub mod norm;
pub mod pointwise;
pub mod reduction;
pub mod repeat;
pub mod rotary;
pub mod slice;
pub mod softmax;
pub mod strategy;
pub mod view;

pub use attention::scaled_dot_product_attention;
pub use cat::{cat, stack};
pub use custom::{apply_op, Backward, CustomOp};
pub use local_map::{local_map, LocalMap};
pub use loss::{CrossEntropyOptions, LossReduction};
pub use math::GeluApproximate;
pub use rotary::{rotary_tables, RotaryStyle};
pub use strategy::{implicit_redistribution_count, implicit_redistributions, DimRule, ImplicitRedistribute};

pub(crate) use grad_kernels::grad_kernels;

use crate::dtensor::DTensor;
use crate::element::{Element, Scalar};
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::placement::Placement;
use crate::storage::Storage;

/// Assembles an op's output (no history yet).
pub(crate) fn new_output<T: Scalar>(
    local: Storage<T>,
    mesh: &DeviceMesh,
    placements: Vec<Placement>,
    shape: Vec<usize>,
) -> DTensor<T> {
    debug_assert_eq!(
        local.shape(),
        crate::layout::local_shape_and_offset(&shape, mesh.shape(), mesh.coordinate(), &placements).0.as_slice(),
        "op output shard does not match its layout {placements:?}"
    );
    DTensor::new_unchecked(local, mesh.clone(), placements, shape, None)
}

/// Resolves a possibly negative dim against `ndim`.
/// `x` in the element type `T` of the op reading it (ids, masks): `x` itself when it already
/// is a `DTensor<T>`, else a cast (no history).
pub(crate) fn in_type<T: Scalar, I: Scalar>(x: &DTensor<I>) -> Result<std::borrow::Cow<'_, DTensor<T>>> {
    match (x as &dyn std::any::Any).downcast_ref::<DTensor<T>>() {
        Some(same) => Ok(std::borrow::Cow::Borrowed(same)),
        None => x.cast::<T>().map(std::borrow::Cow::Owned),
    }
}

pub(crate) fn norm_dim(op: &str, dim: isize, ndim: usize) -> Result<usize> {
    crate::shape::normalize_dim(dim, ndim).ok_or_else(|| Error::DimOutOfRange { context: op.into(), dim, ndim })
}

/// Sums a broadcast gradient back to `shape` (leading extra dims, then size-1 dims).
pub(crate) fn sum_to<T: Element>(g: DTensor<T>, shape: &[usize]) -> Result<DTensor<T>> {
    let mut g = g;
    while g.ndim() > shape.len() {
        g = g.sum_dim(0, false)?;
    }
    for (d, &s) in shape.iter().enumerate() {
        if s == 1 && g.shape[d] != 1 {
            g = g.sum_dim(d as isize, true)?;
        }
    }
    Ok(g)
}
