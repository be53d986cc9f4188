//! Typed collectives on a mesh dimension: the only way redistribution and ops talk to a
//! backend. Every call is recorded for [`CommDebugMode`](crate::CommDebugMode).

use super::debug::{record, CollectiveKind};
use super::fingerprint::{self, Fingerprint};
use crate::element::{DType, Element};
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::placement::ReduceOp;

/// Which ranks a collective runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Along {
    /// This rank's group along one mesh dimension.
    Dim(usize),
    /// Every rank of the mesh.
    All,
}

impl DeviceMesh {
    fn group_of(&self, along: Along) -> Result<(&[usize], Option<usize>)> {
        match along {
            Along::Dim(d) if d >= self.ndim() => {
                Err(Error::MeshDimOutOfRange { context: format!("collective on {self}"), dim: d, ndim: self.ndim() })
            }
            Along::Dim(d) => Ok((self.group(d), Some(d))),
            Along::All => Ok((self.ranks(), None)),
        }
    }

    /// Records a collective; `along` was checked by `group_of` first.
    fn note(&self, kind: CollectiveKind, along: Along, bytes: usize) {
        let Ok((g, d)) = self.group_of(along) else { return };
        record(kind, d.map(|d| self.dim_names()[d].as_str()), g.len(), bytes);
    }

    /// With the fingerprint check on, agrees with the group on this call before it runs.
    fn agree(
        &self,
        g: &[usize],
        kind: CollectiveKind,
        dtype: Option<DType>,
        count: usize,
        root: Option<usize>,
        op: Option<ReduceOp>,
    ) -> Result<()> {
        if !self.collective_checks() {
            return Ok(());
        }
        let comm = self.comm();
        let seq = comm.sequences().map_or(0, |s| s.next(g));
        let dtype = match dtype {
            Some(d) => d.name(),
            None if kind == CollectiveKind::Barrier => "",
            None => "u64",
        };
        fingerprint::agree(comm.as_ref(), g, Fingerprint { seq, kind, dtype, count, root, op })
    }

    /// All-gather equal-sized blocks; returns `n * send.len()` elements in group order.
    pub fn all_gather<T: Element>(&self, along: Along, send: &[T]) -> Result<Vec<T>> {
        let (g, _) = self.group_of(along)?;
        let mut out = vec![T::zero(); send.len() * g.len()];
        self.note(CollectiveKind::AllGather, along, std::mem::size_of_val(send));
        self.agree(g, CollectiveKind::AllGather, Some(T::DTYPE), send.len(), None, None)?;
        self.comm().all_gather(g, bytemuck::cast_slice(send), bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// All-reduce in place.
    pub fn all_reduce<T: Element>(&self, along: Along, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let (g, _) = self.group_of(along)?;
        self.note(CollectiveKind::AllReduce, along, std::mem::size_of_val(buf));
        self.agree(g, CollectiveKind::AllReduce, Some(T::DTYPE), buf.len(), None, Some(op))?;
        self.comm().all_reduce(g, bytemuck::cast_slice_mut(buf), T::DTYPE, op)
    }

    /// All-reduce out of place: the reduction of every member's `send`, in a fresh buffer
    /// (`send` is left as it is, and not copied first).
    pub fn all_reduce_into<T: Element>(&self, along: Along, send: &[T], op: ReduceOp) -> Result<Vec<T>> {
        let (g, _) = self.group_of(along)?;
        let mut out = crate::alloc::try_zeroed("all_reduce", send.len())?;
        self.note(CollectiveKind::AllReduce, along, std::mem::size_of_val(send));
        self.agree(g, CollectiveKind::AllReduce, Some(T::DTYPE), send.len(), None, Some(op))?;
        let recv = bytemuck::cast_slice_mut(&mut out);
        self.comm().all_reduce_into(g, bytemuck::cast_slice(send), recv, T::DTYPE, op)?;
        Ok(out)
    }

    /// Reduce-scatter of `n` equal blocks; returns this member's reduced block.
    pub fn reduce_scatter<T: Element>(&self, along: Along, send: &[T], op: ReduceOp) -> Result<Vec<T>> {
        let (g, _) = self.group_of(along)?;
        let mut out = vec![T::zero(); send.len() / g.len().max(1)];
        self.note(CollectiveKind::ReduceScatter, along, std::mem::size_of_val(send));
        self.agree(g, CollectiveKind::ReduceScatter, Some(T::DTYPE), send.len(), None, Some(op))?;
        self.comm().reduce_scatter(g, bytemuck::cast_slice(send), bytemuck::cast_slice_mut(&mut out), T::DTYPE, op)?;
        Ok(out)
    }

    /// All-to-all of `n` equal blocks.
    pub fn all_to_all<T: Element>(&self, along: Along, send: &[T]) -> Result<Vec<T>> {
        let (g, _) = self.group_of(along)?;
        let mut out = vec![T::zero(); send.len()];
        self.note(CollectiveKind::AllToAll, along, std::mem::size_of_val(send));
        self.agree(g, CollectiveKind::AllToAll, Some(T::DTYPE), send.len(), None, None)?;
        self.comm().all_to_all(g, bytemuck::cast_slice(send), bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// All-to-all of the column blocks of a row-major `send` of `rows` rows of `n` runs of
    /// `run` elements: member `j` gets run `j` of every row; returns `n` contiguous blocks
    /// (`rows * run` elements each) in group order, as [`all_to_all`](Self::all_to_all) of
    /// the packed blocks would, without packing them first.
    pub fn all_to_all_strided<T: Element>(&self, along: Along, send: &[T], rows: usize, run: usize) -> Result<Vec<T>> {
        let (g, _) = self.group_of(along)?;
        let mut out = crate::alloc::try_zeroed("all_to_all", send.len())?;
        self.note(CollectiveKind::AllToAll, along, std::mem::size_of_val(send));
        self.agree(g, CollectiveKind::AllToAll, Some(T::DTYPE), send.len(), None, None)?;
        let es = std::mem::size_of::<T>();
        let recv = bytemuck::cast_slice_mut(&mut out);
        self.comm().all_to_all_strided(g, bytemuck::cast_slice(send), rows, run * es, recv)?;
        Ok(out)
    }

    /// Broadcast from group member `root`.
    pub fn broadcast<T: Element>(&self, along: Along, buf: &mut [T], root: usize) -> Result<()> {
        let (g, _) = self.group_of(along)?;
        self.note(CollectiveKind::Broadcast, along, std::mem::size_of_val(buf));
        self.agree(g, CollectiveKind::Broadcast, Some(T::DTYPE), buf.len(), Some(root), None)?;
        self.comm().broadcast(g, bytemuck::cast_slice_mut(buf), root)
    }

    /// Broadcast of `u64` metadata (shapes, counts: fixed width, so ranks of different
    /// pointer sizes agree).
    pub fn broadcast_u64(&self, along: Along, buf: &mut [u64], root: usize) -> Result<()> {
        let (g, _) = self.group_of(along)?;
        self.note(CollectiveKind::Broadcast, along, std::mem::size_of_val(buf));
        self.agree(g, CollectiveKind::Broadcast, None, buf.len(), Some(root), None)?;
        self.comm().broadcast(g, bytemuck::cast_slice_mut(buf), root)
    }

    /// All-gather of `u64` metadata (shapes, counts).
    pub fn all_gather_u64(&self, along: Along, send: &[u64]) -> Result<Vec<u64>> {
        let (g, _) = self.group_of(along)?;
        let mut out = vec![0u64; send.len() * g.len()];
        self.note(CollectiveKind::AllGather, along, std::mem::size_of_val(send));
        self.agree(g, CollectiveKind::AllGather, None, send.len(), None, None)?;
        self.comm().all_gather(g, bytemuck::cast_slice(send), bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Scatter `n` equal blocks of `block` elements from group member `root`.
    pub fn scatter<T: Element>(&self, along: Along, send: &[T], block: usize, root: usize) -> Result<Vec<T>> {
        let (g, _) = self.group_of(along)?;
        let mut out = vec![T::zero(); block];
        self.note(CollectiveKind::Scatter, along, std::mem::size_of_val(send));
        self.agree(g, CollectiveKind::Scatter, Some(T::DTYPE), block, Some(root), None)?;
        self.comm().scatter(g, bytemuck::cast_slice(send), bytemuck::cast_slice_mut(&mut out), root)?;
        Ok(out)
    }

    /// Barrier over the group.
    pub fn barrier(&self, along: Along) -> Result<()> {
        let (g, _) = self.group_of(along)?;
        self.note(CollectiveKind::Barrier, along, 0);
        self.agree(g, CollectiveKind::Barrier, None, 0, None, None)?;
        self.comm().barrier(g)
    }
}
