//! The group a unit reshards to after the forward when it is smaller than the FSDP dim: the
//! dim split in two, `<dim>.across` × `<dim>.within` (what `post_forward.rs` gathers over).

use crate::error::Result;
use crate::mesh::DeviceMesh;
use crate::placement::Placement;

/// Can a unit whose FSDP dim has `n` ranks reshard to groups of `group`? A divisor of `n`, at
/// least 2 (a group of one would keep whole parameters), or `n` itself (the whole dim).
pub(super) fn group_fits(group: usize, n: usize) -> bool {
    group == n || (group >= 2 && n.is_multiple_of(group))
}

/// How a unit reshards to a smaller group: the split mesh and its prefetch key.
#[derive(Clone)]
pub(super) struct ReshardGroup {
    /// The unit's mesh with the FSDP dim split into `<dim>.across` × `<dim>.within`.
    pub(super) mesh: DeviceMesh,
    /// Where `<dim>.across` is (`<dim>.within` follows it).
    pub(super) at: usize,
    /// The key of its prefetches (not the unit's: the forward's prefetch may be in flight).
    pub(super) id: u64,
}

impl ReshardGroup {
    /// Splits mesh dim `dim` (of `n` ranks) into `n / group` × `group`. Collective (the new
    /// groups are created on backends with sub-communicators); made once per mesh
    /// ([`DeviceMesh::unflatten`] keeps it), so units on one mesh share it.
    pub(super) fn new(mesh: &DeviceMesh, dim: usize, group: usize, id: u64) -> Result<Self> {
        let name = &mesh.dim_names()[dim];
        let [across, within] = Self::names(name);
        let split = mesh.unflatten(name, &[mesh.size(dim) / group, group], &[&across, &within])?;
        Ok(ReshardGroup { mesh: split, at: dim, id })
    }

    /// The names of the two halves of mesh dim `name`: `<name>.across`, `<name>.within`.
    pub(super) fn names(name: &str) -> [String; 2] {
        [format!("{name}.across"), format!("{name}.within")]
    }

    /// The size of the group resharded to.
    pub(super) fn group(&self) -> usize {
        self.mesh.size(self.at + 1)
    }

    /// `pl` (one per dim of the unit's mesh) on the split mesh, `across` and `within` for the
    /// FSDP dim.
    pub(super) fn split(&self, pl: &[Placement], across: Placement, within: Placement) -> Vec<Placement> {
        let mut out = pl.to_vec();
        out.splice(self.at..=self.at, [across, within]);
        out
    }
}
