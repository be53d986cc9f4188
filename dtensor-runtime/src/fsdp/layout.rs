//! The one rule of where FSDP shards a parameter, shared by `fully_shard` and the memory plan.

use crate::placement::Placement;

/// The layout a parameter rests in under FSDP over mesh dim `mesh_dim`, given the layout it
/// is used in (`in_use`, `Replicate` on `mesh_dim`) and its number of tensor dims.
///
/// FSDP shards the first tensor dim that no other mesh dim shards: dim 0 unless a
/// tensor-parallel plan shards it. So the FSDP all-gather alone turns the resting layout back
/// into the in-use one, and every layout stays an ordinary one (`full_tensor`, checkpoints and
/// loaders need no strided shard). A parameter whose every dim is sharded already (or a
/// scalar) rests as it is used: `None`; so does a `mesh_dim` that `in_use` has no entry for.
/// A negative `Shard(d)` counts from the last tensor dim.
///
/// ```
/// use dtensor_runtime::fsdp::resting_layout;
/// use dtensor_runtime::{Replicate, Shard};
/// // a column-parallel weight [out, in], sharded on out by tp (mesh dim 1): FSDP takes `in`
/// assert_eq!(resting_layout(&[Replicate, Shard(0)], 2, 0), Some(vec![Shard(1), Shard(0)]));
/// // its bias [out]: nothing left to shard
/// assert_eq!(resting_layout(&[Replicate, Shard(0)], 1, 0), None);
/// ```
pub fn resting_layout(in_use: &[Placement], ndim: usize, mesh_dim: usize) -> Option<Vec<Placement>> {
    if mesh_dim >= in_use.len() {
        return None;
    }
    let taken: Vec<usize> = in_use
        .iter()
        .filter_map(|q| match q {
            Placement::Shard(d) if *d < 0 => usize::try_from(ndim as isize + d).ok(),
            Placement::Shard(d) => usize::try_from(*d).ok(),
            _ => None,
        })
        .collect();
    let d = (0..ndim).find(|d| !taken.contains(d))?;
    let mut stored = in_use.to_vec();
    stored[mesh_dim] = Placement::Shard(d as isize);
    Some(stored)
}
