//! Pack plans: the data movement of redistribution (and of transpose, slicing, padding and
//! broadcasting) as strided box copies between row-major buffers, computed from shapes alone.
//!
//! A [`PackPlan`] copies [`CopyBlock`]s from a row-major source buffer into a fresh row-major
//! destination of shape `dst_shape`; destination elements no block writes are zero (the
//! padding collectives need for uneven shards). Plans are pure functions of shapes, so they are
//! tested here without any storage, and one storage call (`Storage::pack`) executes a whole
//! plan: ndarray loops on the host, one kernel launch on a device.
//!
//! Blocks are normalised when built (size-1 dims dropped, dims that are contiguous in both
//! buffers merged, consecutive runs joined), so a plan that only reorders nothing is
//! recognisable: [`PackPlan::is_identity`] lets callers skip the copy and reuse the buffer.
//!
//! ```
//! use dtensor_runtime::layout::pack::{join, split};
//! // All-gather of dim 0 of a [2, 3] shard over 2 ranks: nothing to pack, nothing to unpack.
//! assert!(split(&[2, 3], 0, 1, &[2, 3]).is_identity());
//! assert!(join(&[2, 3], 2, 0, &[4, 3]).is_identity());
//! // Along dim 1 the received blocks interleave: one strided copy.
//! let unpack = join(&[2, 3], 2, 1, &[2, 6]);
//! assert!(!unpack.is_identity());
//! assert_eq!(unpack.blocks.len(), 2);
//! ```

use super::chunk_size_and_offset;
use crate::error::{Error, Result};

/// One strided box copy: for every index `i` within `extents`,
/// `dst[dst_offset + Σ i_k·dst_strides_k] = src[src_offset + Σ i_k·src_strides_k]`.
///
/// Source strides may be 0 (broadcasting); destination boxes of one plan never overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyBlock {
    /// First source element.
    pub src_offset: usize,
    /// First destination element.
    pub dst_offset: usize,
    /// Size of the box along each of its dims (never empty: a scalar copy is `[1]`).
    pub extents: Vec<usize>,
    /// Source stride of each box dim, in elements.
    pub src_strides: Vec<usize>,
    /// Destination stride of each box dim, in elements.
    pub dst_strides: Vec<usize>,
}

impl CopyBlock {
    /// Number of elements the block copies.
    pub fn len(&self) -> usize {
        self.extents.iter().product()
    }

    /// Does the block copy nothing?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Largest source and destination index the block touches (the block must not be empty).
    fn last_index(&self) -> (usize, usize) {
        let far = |strides: &[usize]| self.extents.iter().zip(strides).map(|(&e, &s)| (e - 1) * s).sum::<usize>();
        (self.src_offset + far(&self.src_strides), self.dst_offset + far(&self.dst_strides))
    }

    /// Drops size-1 dims and merges neighbouring dims that are contiguous in both buffers.
    fn normalize(mut self) -> CopyBlock {
        let mut ext = Vec::with_capacity(self.extents.len());
        let mut ss: Vec<usize> = Vec::with_capacity(self.extents.len());
        let mut ds: Vec<usize> = Vec::with_capacity(self.extents.len());
        for k in 0..self.extents.len() {
            let (e, s, d) = (self.extents[k], self.src_strides[k], self.dst_strides[k]);
            if e == 1 {
                continue;
            }
            match (ext.last_mut(), ss.last(), ds.last()) {
                // The previous (outer) dim steps exactly over this one in both buffers.
                (Some(pe), Some(&ps), Some(&pd)) if ps == e * s && pd == e * d => {
                    *pe *= e;
                    *ss.last_mut().expect("non-empty") = s;
                    *ds.last_mut().expect("non-empty") = d;
                }
                _ => {
                    ext.push(e);
                    ss.push(s);
                    ds.push(d);
                }
            }
        }
        if ext.is_empty() {
            (ext, ss, ds) = (vec![1], vec![1], vec![1]);
        }
        self.extents = ext;
        self.src_strides = ss;
        self.dst_strides = ds;
        self
    }

    /// Is this a single contiguous run in both buffers?
    fn contiguous_run(&self) -> Option<usize> {
        (self.extents.len() == 1 && self.src_strides[0] == 1 && self.dst_strides[0] == 1).then_some(self.extents[0])
    }
}

/// Row-major strides of `shape`, in elements.
fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

fn dot(index: &[usize], strides: &[usize]) -> usize {
    index.iter().zip(strides).map(|(i, s)| i * s).sum()
}

/// A whole data movement: blocks from a row-major source of `src_len` elements into a fresh
/// row-major destination of shape `dst_shape` (zeros where no block writes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackPlan {
    /// Number of elements the source must have.
    pub src_len: usize,
    /// Shape of the destination.
    pub dst_shape: Vec<usize>,
    /// The copies, in destination order for the plans built here.
    pub blocks: Vec<CopyBlock>,
}

impl PackPlan {
    /// An empty plan (all zeros) from `src_len` elements into `dst_shape`.
    pub fn new(src_len: usize, dst_shape: &[usize]) -> PackPlan {
        PackPlan { src_len, dst_shape: dst_shape.to_vec(), blocks: Vec::new() }
    }

    /// Number of destination elements.
    pub fn dst_len(&self) -> usize {
        self.dst_shape.iter().product()
    }

    /// Adds the copy of the box `extents` starting at `src_start` of a row-major source of
    /// `src_shape` (living at element `src_base` of the source buffer) to the box starting at
    /// `dst_start` of a row-major `dst_block` living at `dst_base` of the destination.
    /// `src_strides` may replace the source's row-major strides (e.g. 0 to broadcast).
    #[allow(clippy::too_many_arguments)] // two boxes in two buffers; a struct per call would only rename them
    pub fn push_box(
        &mut self,
        src_strides: &[usize],
        src_base: usize,
        src_start: &[usize],
        dst_block: &[usize],
        dst_base: usize,
        dst_start: &[usize],
        extents: &[usize],
    ) {
        if extents.contains(&0) {
            return;
        }
        let ds = strides_of(dst_block);
        let block = CopyBlock {
            src_offset: src_base + dot(src_start, src_strides),
            dst_offset: dst_base + dot(dst_start, &ds),
            extents: extents.to_vec(),
            src_strides: src_strides.to_vec(),
            dst_strides: ds,
        }
        .normalize();
        // Join with the previous block when this one continues its run in both buffers.
        if let (Some(prev), Some(n)) = (self.blocks.last_mut(), block.contiguous_run()) {
            if let Some(p) = prev.contiguous_run() {
                if prev.src_offset + p == block.src_offset && prev.dst_offset + p == block.dst_offset {
                    prev.extents[0] += n;
                    return;
                }
            }
        }
        self.blocks.push(block);
    }

    /// Is the destination exactly the source (same length, one contiguous run from 0)? Then
    /// the copy can be skipped and the source buffer reused as the destination.
    pub fn is_identity(&self) -> bool {
        self.dst_len() == self.src_len && self.is_prefix()
    }

    /// Is the destination the first `dst_len` elements of the source, in order (one contiguous
    /// run from 0)? Then the copy is a truncation: a torch.chunk split pads only its trailing
    /// chunks, so joining the blocks of a leading dim drops padding from the end alone, and
    /// the source buffer can be cut short instead of copied.
    pub fn is_prefix(&self) -> bool {
        let n = self.dst_len();
        n <= self.src_len
            && match self.blocks.as_slice() {
                [] => n == 0,
                [b] => b.src_offset == 0 && b.dst_offset == 0 && b.contiguous_run() == Some(n),
                _ => false,
            }
    }

    /// Do the blocks write every destination element (so no zero fill is needed)?
    pub fn covers_destination(&self) -> bool {
        self.blocks.iter().map(CopyBlock::len).sum::<usize>() == self.dst_len()
    }

    /// Do the blocks write every destination element exactly once, in order: each block's
    /// destination a contiguous row-major run starting where the previous one ended, the last
    /// ending at the end? (Then the destination needs no zero fill; overlapping blocks never
    /// pass, whatever their total length.)
    pub fn tiles_destination(&self) -> bool {
        self.writes_in_order() && self.blocks.iter().map(CopyBlock::len).sum::<usize>() == self.dst_len()
    }

    /// Does each block write one contiguous row-major run of the destination, starting at or
    /// after the end of the previous block's run, the last ending inside the destination?
    /// Then a copy writes every element at most once, and only the gaps between the runs
    /// (padding) need zeros, not the whole destination.
    pub fn writes_in_order(&self) -> bool {
        let mut end = 0;
        for b in &self.blocks {
            if b.dst_offset < end || b.dst_strides != strides_of(&b.extents) {
                return false;
            }
            end = b.dst_offset + b.len();
        }
        end <= self.dst_len()
    }

    /// Checks that every block stays inside both buffers (executors call it before copying,
    /// so a wrong plan is an error, never an out-of-bounds access).
    pub fn check(&self) -> Result<()> {
        let dst_len = self.dst_len();
        for b in &self.blocks {
            let ok = b.extents.len() == b.src_strides.len() && b.extents.len() == b.dst_strides.len();
            let (s, d) = if ok && !b.is_empty() { b.last_index() } else { (0, 0) };
            if !ok || (!b.is_empty() && (s >= self.src_len || d >= dst_len)) {
                return Err(Error::InvalidArgument {
                    context: "pack plan".into(),
                    reason: format!(
                        "block {b:?} leaves the source of {} or the destination of {dst_len} elements",
                        self.src_len
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Splits a row-major `src` along `dim` into `n` chunks (torch.chunk sizes) and writes chunk
/// `j` at the origin of block `j` of a destination `[n, block..]` (zero padded).
///
/// The send side of reduce-scatter (`dim` split over the group), of all-to-all (the target
/// dim split), and, with `n = 1`, padding a shard to the common chunk size for all-gather.
pub fn split(src: &[usize], dim: usize, n: usize, block: &[usize]) -> PackPlan {
    debug_assert!(src.len() == block.len() && dim < src.len());
    let mut dst = vec![n];
    dst.extend_from_slice(block);
    let mut plan = PackPlan::new(src.iter().product(), &dst);
    let block_len: usize = block.iter().product();
    let src_strides = strides_of(src);
    let zero = vec![0; src.len()];
    for j in 0..n {
        let (sz, off) = chunk_size_and_offset(src[dim], n, j);
        let mut start = zero.clone();
        start[dim] = off;
        let mut ext = src.to_vec();
        ext[dim] = sz;
        plan.push_box(&src_strides, 0, &start, block, j * block_len, &zero, &ext);
    }
    plan
}

/// Joins `n` row-major blocks of shape `block` (a buffer `[n, block..]`) along `dim` into
/// `dst`: block `j` holds chunk `j` of `dst[dim]` (torch.chunk sizes) at its origin; the rest
/// of each block (padding) is dropped.
///
/// The receive side of all-gather (`dim` gathered) and of all-to-all (the source dim
/// gathered), and, with `n = 1`, cutting the padding off a reduce-scatter result.
pub fn join(block: &[usize], n: usize, dim: usize, dst: &[usize]) -> PackPlan {
    debug_assert!(dst.len() == block.len() && dim < dst.len());
    let block_len: usize = block.iter().product();
    let mut plan = PackPlan::new(n * block_len, dst);
    let block_strides = strides_of(block);
    let zero = vec![0; dst.len()];
    for j in 0..n {
        let (sz, off) = chunk_size_and_offset(dst[dim], n, j);
        let mut start = zero.clone();
        start[dim] = off;
        let mut ext = dst.to_vec();
        ext[dim] = sz;
        plan.push_box(&block_strides, j * block_len, &zero, dst, 0, &start, &ext);
    }
    plan
}

/// Splits a row-major `src` along `dim` into `n` chunks (torch.chunk sizes) laid back to back
/// unpadded, chunk `j` row-major in the shape of `src` with `dim` cut to its size: the send
/// side of a variable-size reduce-scatter. The identity when the dims before `dim` have one
/// element in all (each chunk is then already one contiguous run).
pub fn split_v(src: &[usize], dim: usize, n: usize) -> PackPlan {
    debug_assert!(dim < src.len());
    let numel: usize = src.iter().product();
    let mut plan = PackPlan::new(numel, &[numel]);
    let src_strides = strides_of(src);
    let zero = vec![0; src.len()];
    let mut at = 0;
    for j in 0..n {
        let (sz, off) = chunk_size_and_offset(src[dim], n, j);
        let ext = with_dim(src, dim, sz);
        plan.push_box(&src_strides, 0, &with_dim(&zero, dim, off), &ext, at, &zero, &ext);
        at += ext.iter().product::<usize>();
    }
    plan
}

/// Joins `n` row-major blocks laid back to back unpadded along `dim` into `dst`: block `j` is
/// chunk `j` of `dst[dim]` (torch.chunk sizes), in the shape of `dst` with `dim` cut to its
/// size. The receive side of a variable-size all-gather or all-to-all. The identity when the
/// dims before `dim` have one element in all.
pub fn join_v(dst: &[usize], dim: usize, n: usize) -> PackPlan {
    debug_assert!(dim < dst.len());
    let numel: usize = dst.iter().product();
    let mut plan = PackPlan::new(numel, dst);
    let zero = vec![0; dst.len()];
    let mut at = 0;
    for j in 0..n {
        let (sz, off) = chunk_size_and_offset(dst[dim], n, j);
        let ext = with_dim(dst, dim, sz);
        plan.push_box(&strides_of(&ext), at, &zero, dst, 0, &with_dim(&zero, dim, off), &ext);
        at += ext.iter().product::<usize>();
    }
    plan
}

/// `shape` with dim `d` set to `size`.
pub(crate) fn with_dim(shape: &[usize], d: usize, size: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s[d] = size;
    s
}

/// The box of `extents` at `start` of a row-major `src`, as a fresh row-major array.
pub fn slice(src: &[usize], start: &[usize], extents: &[usize]) -> PackPlan {
    let mut plan = PackPlan::new(src.iter().product(), extents);
    plan.push_box(&strides_of(src), 0, start, extents, 0, &vec![0; extents.len()], extents);
    plan
}

/// A row-major `src` written at `start` of a zero destination of shape `dst` (the inverse of
/// [`slice()`]): narrow's backward, and Shard → Partial(sum), where each rank keeps its shard
/// in place and contributes zeros everywhere else.
pub fn pad(src: &[usize], dst: &[usize], start: &[usize]) -> PackPlan {
    let mut plan = PackPlan::new(src.iter().product(), dst);
    plan.push_box(&strides_of(src), 0, &vec![0; src.len()], dst, 0, start, src);
    plan
}

/// Every box `(start, extents)` of a row-major `src`, each written row-major at the start of
/// its own slot of `slot` elements (`[boxes.len() * slot]`, zero padded): the send buffer of a
/// scatter of uneven shards.
pub fn gather_boxes(src: &[usize], boxes: &[(Vec<usize>, Vec<usize>)], slot: usize) -> PackPlan {
    let mut plan = PackPlan::new(src.iter().product(), &[boxes.len() * slot]);
    let src_strides = strides_of(src);
    for (j, (start, ext)) in boxes.iter().enumerate() {
        plan.push_box(&src_strides, 0, start, ext, j * slot, &vec![0; ext.len()], ext);
    }
    plan
}

/// `src` with its axes reordered (`axes[k]` is the source axis of output axis `k`),
/// materialised row-major: transpose and permute.
pub fn permute(src: &[usize], axes: &[usize]) -> PackPlan {
    let s = strides_of(src);
    let shape: Vec<usize> = axes.iter().map(|&a| src[a]).collect();
    let strides: Vec<usize> = axes.iter().map(|&a| s[a]).collect();
    let mut plan = PackPlan::new(src.iter().product(), &shape);
    plan.push_box(&strides, 0, &vec![0; shape.len()], &shape, 0, &vec![0; shape.len()], &shape);
    plan
}

/// `src` broadcast to `to` (numpy rules: `src` is right-aligned, its size-1 dims repeat),
/// materialised row-major. `None` when the shapes do not broadcast.
pub fn broadcast(src: &[usize], to: &[usize]) -> Option<PackPlan> {
    if src.len() > to.len() {
        return None;
    }
    let off = to.len() - src.len();
    let s = strides_of(src);
    let mut strides = vec![0; to.len()];
    for (k, &t) in to.iter().enumerate().skip(off) {
        match src[k - off] {
            x if x == t => strides[k] = s[k - off],
            1 => {}
            _ => return None,
        }
    }
    let mut plan = PackPlan::new(src.iter().product(), to);
    plan.push_box(&strides, 0, &vec![0; to.len()], to, 0, &vec![0; to.len()], to);
    Some(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference executor: element by element, straight from the block definition.
    fn run(plan: &PackPlan, src: &[i64]) -> Vec<i64> {
        plan.check().unwrap();
        assert_eq!(src.len(), plan.src_len);
        let mut dst = vec![0; plan.dst_len()];
        let mut written = vec![false; dst.len()];
        for b in &plan.blocks {
            let mut idx = vec![0; b.extents.len()];
            for _ in 0..b.len() {
                let d = b.dst_offset + dot(&idx, &b.dst_strides);
                assert!(!written[d], "blocks overlap at {d}");
                written[d] = true;
                dst[d] = src[b.src_offset + dot(&idx, &b.src_strides)];
                for k in (0..idx.len()).rev() {
                    idx[k] += 1;
                    if idx[k] < b.extents[k] {
                        break;
                    }
                    idx[k] = 0;
                }
            }
        }
        assert_eq!(plan.covers_destination(), written.iter().all(|&w| w));
        assert!(!plan.tiles_destination() || plan.covers_destination());
        dst
    }

    /// Value of the element at `index` of a tensor: its global coordinates, encoded.
    fn code(index: &[usize]) -> i64 {
        index.iter().fold(1, |acc, &i| acc * 100 + i as i64)
    }

    /// Row-major data of `shape` whose element at `ix` is `code(origin + ix)`.
    fn data(shape: &[usize], origin: &[usize]) -> Vec<i64> {
        let n: usize = shape.iter().product();
        (0..n)
            .map(|mut flat| {
                let mut ix = vec![0; shape.len()];
                for k in (0..shape.len()).rev() {
                    ix[k] = flat % shape[k] + origin[k];
                    flat /= shape[k];
                }
                code(&ix)
            })
            .collect()
    }

    /// The shard of rank `j` of `n` along `dim` of `full`: (shape, origin).
    fn shard(full: &[usize], dim: usize, n: usize, j: usize) -> (Vec<usize>, Vec<usize>) {
        let (sz, off) = chunk_size_and_offset(full[dim], n, j);
        let mut shape = full.to_vec();
        shape[dim] = sz;
        let mut origin = vec![0; full.len()];
        origin[dim] = off;
        (shape, origin)
    }

    /// Variable-size all-gather and reduce-scatter layouts through the plans: the shards laid
    /// back to back unpadded join into the full tensor, and `split_v` of the full tensor lays
    /// out exactly those shards; both are identities when only size-1 dims precede `dim`.
    #[test]
    fn variable_split_and_join_round_trip() {
        for full in [vec![5, 3], vec![2, 7, 3], vec![3, 0, 2], vec![1, 1, 9], vec![4]] {
            for dim in 0..full.len() {
                for n in 1..=5 {
                    let mut wire = Vec::new();
                    for j in 0..n {
                        let (shape, origin) = shard(&full, dim, n, j);
                        wire.extend(data(&shape, &origin));
                    }
                    let trivial = full[..dim].iter().product::<usize>() == 1 || full.contains(&0);
                    let join = join_v(&full, dim, n);
                    assert_eq!(run(&join, &wire), data(&full, &vec![0; full.len()]), "{full:?} dim {dim} n {n}");
                    assert!(join.covers_destination(), "{full:?} dim {dim} n {n}");
                    let split = split_v(&full, dim, n);
                    assert_eq!(run(&split, &data(&full, &vec![0; full.len()])), wire, "{full:?} dim {dim} n {n}");
                    if trivial {
                        assert!(join.is_identity() && split.is_identity(), "{full:?} dim {dim} n {n}");
                    }
                }
            }
        }
    }

    /// All-gather through the plans: pad each shard, concatenate the blocks, join.
    fn all_gather(full: &[usize], dim: usize, n: usize) -> Vec<i64> {
        let c = full[dim].div_ceil(n);
        let mut block = full.to_vec();
        block[dim] = c;
        let mut wire = Vec::new();
        for j in 0..n {
            let (shape, origin) = shard(full, dim, n, j);
            let pad = split(&shape, dim, 1, &block);
            let empty = block.contains(&0);
            assert_eq!(pad.is_identity(), shape == block || empty, "{full:?} dim {dim} n {n} rank {j}");
            wire.extend(run(&pad, &data(&shape, &origin)));
        }
        run(&join(&block, n, dim, full), &wire)
    }

    #[test]
    fn all_gather_reassembles_even_uneven_and_empty_shards() {
        for full in [vec![8, 3], vec![5, 3], vec![3, 7, 2], vec![2, 0, 3], vec![1, 4, 5]] {
            for dim in 0..full.len() {
                for n in 1..6 {
                    assert_eq!(all_gather(&full, dim, n), data(&full, &vec![0; full.len()]), "{full:?} {dim} {n}");
                }
            }
        }
    }

    #[test]
    fn even_leading_dim_gathers_without_copies() {
        assert!(split(&[2, 3], 0, 1, &[2, 3]).is_identity());
        assert!(join(&[2, 3], 4, 0, &[8, 3]).is_identity());
        // Leading size-1 dims do not break contiguity.
        assert!(join(&[1, 2, 3], 2, 1, &[1, 4, 3]).is_identity());
        // Uneven: the last block's padding must be dropped.
        assert!(!join(&[2, 3], 3, 0, &[5, 3]).is_identity());
        // A non-leading dim interleaves.
        assert!(!join(&[3, 2], 2, 1, &[3, 4]).is_identity());
        // Reduce-scatter of dim 0 sends the tensor as is.
        assert!(split(&[8, 3], 0, 4, &[2, 3]).is_identity());
    }

    #[test]
    fn reduce_scatter_send_and_receive() {
        for (full, dim, n) in [(vec![5usize, 3], 0, 2), (vec![4, 5], 1, 3), (vec![3, 2, 4], 2, 4), (vec![2, 3], 1, 4)] {
            let c = full[dim].div_ceil(n);
            let mut block = full.to_vec();
            block[dim] = c;
            let send = run(&split(&full, dim, n, &block), &data(&full, &vec![0; full.len()]));
            let block_len: usize = block.iter().product();
            for j in 0..n {
                let (shape, origin) = shard(&full, dim, n, j);
                let mine = &send[j * block_len..(j + 1) * block_len];
                assert_eq!(run(&join(&block, 1, dim, &shape), mine), data(&shape, &origin), "{full:?} {dim} {n} {j}");
            }
        }
    }

    #[test]
    fn all_to_all_moves_shard_dim() {
        // S(d) -> S(e) over n ranks of a tensor `full`: rank k holds d-chunk k and ends with
        // e-chunk k.
        for (full, d, e, n) in
            [(vec![6usize, 4], 0, 1, 2), (vec![5, 7], 0, 1, 3), (vec![4, 5, 3], 2, 0, 4), (vec![3, 2], 1, 0, 4)]
        {
            let (cd, ce) = (full[d].div_ceil(n), full[e].div_ceil(n));
            let sends: Vec<(Vec<usize>, Vec<i64>)> = (0..n)
                .map(|k| {
                    let (shape, origin) = shard(&full, d, n, k);
                    let mut block = shape.clone();
                    block[d] = cd;
                    block[e] = ce;
                    (block.clone(), run(&split(&shape, e, n, &block), &data(&shape, &origin)))
                })
                .collect();
            let block_len: usize = sends[0].0.iter().product();
            for k in 0..n {
                // Member k receives block k of every member j, in member order.
                let recv: Vec<i64> =
                    (0..n).flat_map(|j| sends[j].1[k * block_len..(k + 1) * block_len].to_vec()).collect();
                let (want_shape, want_origin) = shard(&full, e, n, k);
                let got = run(&join(&sends[0].0, n, d, &want_shape), &recv);
                assert_eq!(got, data(&want_shape, &want_origin), "{full:?} S({d})->S({e}) n={n} rank {k}");
            }
        }
    }

    #[test]
    fn slices_permutes_broadcasts_and_scatter_boxes() {
        let src = data(&[4, 5], &[0, 0]);
        assert_eq!(run(&slice(&[4, 5], &[1, 2], &[2, 3]), &src), data(&[2, 3], &[1, 2]));
        assert!(slice(&[4, 5], &[0, 0], &[4, 5]).is_identity());
        let t = run(&permute(&[4, 5], &[1, 0]), &src);
        assert_eq!(t[..4], [code(&[0, 0]), code(&[1, 0]), code(&[2, 0]), code(&[3, 0])]);
        assert!(permute(&[1, 5], &[1, 0]).is_identity());
        let row = vec![1, 2, 3];
        let b = broadcast(&[3], &[2, 3]).unwrap();
        assert_eq!(run(&b, &row), vec![1, 2, 3, 1, 2, 3]);
        assert_eq!(run(&broadcast(&[3, 1], &[3, 2]).unwrap(), &row), vec![1, 1, 2, 2, 3, 3]);
        assert!(broadcast(&[2], &[3]).is_none());
        // Two boxes of a [3, 2] tensor, each in a slot of 4 elements.
        let g = data(&[3, 2], &[0, 0]);
        let boxes = [(vec![0, 0], vec![2, 2]), (vec![2, 0], vec![1, 2])];
        let out = run(&gather_boxes(&[3, 2], &boxes, 4), &g);
        assert_eq!(out, [g[..4].to_vec(), g[4..].to_vec(), vec![0, 0]].concat());
    }

    #[test]
    fn tiling_plans_are_exact_covers_in_order() {
        assert!(slice(&[4, 5], &[1, 2], &[2, 3]).tiles_destination());
        assert!(permute(&[4, 5], &[1, 0]).tiles_destination());
        assert!(broadcast(&[3], &[2, 3]).unwrap().tiles_destination());
        // Padding leaves zeros: not a tiling.
        assert!(!pad(&[2, 3], &[4, 3], &[1, 0]).tiles_destination());
        // Two overlapping rows: as many elements as the destination, yet one row unwritten.
        let mut p = PackPlan::new(4, &[2, 2]);
        p.push_box(&[2, 1], 0, &[0, 0], &[2, 2], 0, &[0, 0], &[1, 2]);
        p.push_box(&[2, 1], 0, &[1, 0], &[2, 2], 0, &[0, 0], &[1, 2]);
        assert!(p.covers_destination() && !p.tiles_destination());
        assert!(!p.writes_in_order());
        // Padded blocks still write in order: only the gaps need zeros.
        assert!(pad(&[2, 3], &[4, 3], &[1, 0]).writes_in_order());
        assert!(split(&[3, 4], 1, 2, &[4, 2]).writes_in_order());
        assert!(split(&[7, 2], 0, 3, &[3, 2]).writes_in_order());
        // A join along dim 1 writes each block as a strided box of the destination: not in order.
        assert!(!join(&[2, 3], 2, 1, &[2, 5]).writes_in_order());
    }

    #[test]
    fn pad_is_the_inverse_of_slice_with_zeros_elsewhere() {
        // Shard -> Partial(sum): every rank's embedded shard, summed, is the full tensor.
        for (full, dim, n) in [(vec![5usize, 3], 0, 2), (vec![4, 5], 1, 3), (vec![2, 3], 1, 4), (vec![0, 3], 0, 2)] {
            let mut sum = vec![0; full.iter().product()];
            for j in 0..n {
                let (shape, origin) = shard(&full, dim, n, j);
                let e = pad(&shape, &full, &origin);
                let out = run(&e, &data(&shape, &origin));
                assert_eq!(run(&slice(&full, &origin, &shape), &out), data(&shape, &origin));
                for (s, o) in sum.iter_mut().zip(out) {
                    *s += o;
                }
            }
            assert_eq!(sum, data(&full, &vec![0; full.len()]), "{full:?} {dim} {n}");
        }
        assert!(pad(&[2, 3], &[2, 3], &[0, 0]).is_identity());
    }

    #[test]
    fn blocks_merge_and_checks_reject_bad_plans() {
        // A [2, 3] -> [2, 3] copy is one run of 6; a column is a strided run.
        let p = slice(&[2, 3], &[0, 0], &[2, 3]);
        assert_eq!(p.blocks[0].extents, vec![6]);
        let col = slice(&[2, 3], &[0, 1], &[2, 1]);
        assert_eq!((col.blocks[0].extents.clone(), col.blocks[0].src_strides.clone()), (vec![2], vec![3]));
        let mut bad = PackPlan::new(4, &[4]);
        bad.blocks.push(CopyBlock {
            src_offset: 2,
            dst_offset: 0,
            extents: vec![3],
            src_strides: vec![1],
            dst_strides: vec![1],
        });
        assert!(matches!(bad.check(), Err(Error::InvalidArgument { .. })));
        // Empty tensors: no blocks, identity when both sides are empty.
        assert!(split(&[0, 3], 0, 1, &[0, 3]).is_identity());
        assert!(join(&[0, 3], 2, 0, &[0, 3]).blocks.is_empty());
        assert!(slice(&[], &[], &[]).is_identity()); // a 0-d tensor is one element
    }
}
