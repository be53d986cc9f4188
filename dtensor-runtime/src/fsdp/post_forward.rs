//! Resharding after the forward to a smaller group (PyTorch `reshard_after_forward=<int>`).
//!
//! The FSDP dim of `n` ranks is seen as two, `<dim>.across` (`n / group`) × `<dim>.within`
//! (`group`, runs of consecutive coordinates: with node-major ranks, one node). A resharding
//! unit's forward keeps of each gathered parameter the slice `Shard(d)` over `<dim>.within`
//! (replicated across), a local slice of what it gathered: nothing is sent. Its backward
//! all-gathers those slices over `<dim>.within` only. The slices are ordinary layouts on the
//! split mesh, so the gather is the mesh's own redistribution (or a prefetch, the same batch
//! as any unit's), and its result is relabelled onto the unit's mesh, where the same local
//! data is `Replicate` on the FSDP dim.

use super::prefetch::{self, Starter};
use super::unit::{Param, Unit};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::Result;
use crate::mesh::DeviceMesh;
use crate::placement::Placement;
use std::sync::Arc;

/// The same local data on another mesh under other placements (no copy, no history).
fn relabel<E: Element>(t: &DTensor<E>, mesh: &DeviceMesh, placements: Vec<Placement>) -> DTensor<E> {
    let mut t = t.detach();
    t.mesh = mesh.clone();
    t.placements = placements;
    t
}

/// What a unit resharding to a smaller group keeps from its forward: a slice of each gathered
/// parameter, and how to gather them again.
pub(super) struct Kept<E: Element> {
    /// The unit seen on the split mesh: each parameter rests as its slice, is used
    /// `Replicate` on both halves of the FSDP dim, and gathers over `<dim>.within`.
    within: Unit<E>,
    slices: Vec<DTensor<E>>,
    /// The unit's mesh and each parameter's in-use layout there.
    mesh: DeviceMesh,
    in_use: Vec<Vec<Placement>>,
}

impl<T: Element> Unit<T> {
    /// The slices of `gathered` (every parameter in its in-use layout, element type `E`) that
    /// this unit keeps after its forward, or `None` when it reshards to the whole FSDP dim.
    pub(super) fn keep<E: Element>(&self, gathered: &[DTensor<E>]) -> Result<Option<Kept<E>>> {
        let Some(post) = &self.post else { return Ok(None) };
        let within = Unit {
            name: self.name.clone(),
            id: post.id,
            mesh: post.mesh.clone(),
            mesh_dim: post.at + 1,
            reduce_dtype: self.reduce_dtype,
            params: Arc::new(
                self.params
                    .iter()
                    .map(|p| {
                        let in_use = post.split(&p.in_use, Placement::Replicate, Placement::Replicate);
                        let slice = post.split(&p.in_use, Placement::Replicate, p.stored[self.mesh_dim]);
                        Param::new(p.name.clone(), in_use, slice)
                    })
                    .collect(),
            ),
            sync: Arc::clone(&self.sync),
            post: None,
        };
        let slices = gathered
            .iter()
            .zip(within.params.iter())
            .map(|(g, info)| {
                let whole = relabel(g, &post.mesh, info.in_use.clone());
                if !info.sharded() {
                    return Ok(whole);
                }
                // Replicate → Shard is a local slice: nothing is sent.
                Ok(whole.redistribute_scoped(&info.stored, "fsdp_reshard_to_group")?.detach())
            })
            .collect::<Result<Vec<_>>>()?;
        let in_use = self.params.iter().map(|p| p.in_use.clone()).collect();
        Ok(Some(Kept { within, slices, mesh: self.mesh.clone(), in_use }))
    }
}

impl<E: Element> Kept<E> {
    /// Starts gathering the slices (the backward prefetch of this unit).
    pub(super) fn starter(&self) -> Starter {
        prefetch::starter(&self.within, self.slices.clone(), |p| Ok(p.clone()))
    }

    /// Every parameter in its in-use layout on the unit's mesh again: prefetched, or gathered
    /// now over `<dim>.within`.
    pub(super) fn gather(&self) -> Result<Vec<DTensor<E>>> {
        let gathered = match prefetch::prefetched::<E, E>(self.within.id, &self.within, &self.slices)? {
            Some(g) => g,
            None => self
                .slices
                .iter()
                .zip(self.within.params.iter())
                .map(|(s, info)| self.within.gather_data(s, info))
                .collect::<Result<_>>()?,
        };
        Ok(gathered.iter().zip(&self.in_use).map(|(g, pl)| relabel(g, &self.mesh, pl.clone())).collect())
    }
}
