//! Layout math: which slice of the global tensor a rank holds (torch.chunk semantics).
//!
//! For a size `s` split over `n` ranks, the chunk is `c = ceil(s / n)` and rank `r` holds
//! `[c*r, min(s, c*r + c))`; ranks whose start is past `s` hold an empty shard at offset `s`.

pub mod pack;

use crate::placement::Placement;

/// Size and offset of chunk `rank` when `size` is split over `n` ranks (torch.chunk).
///
/// ```
/// use dtensor_runtime::layout::chunk_size_and_offset;
/// let sizes: Vec<_> = (0..4).map(|r| chunk_size_and_offset(5, 4, r)).collect();
/// assert_eq!(sizes, vec![(2, 0), (2, 2), (1, 4), (0, 5)]);
/// ```
pub fn chunk_size_and_offset(size: usize, n: usize, rank: usize) -> (usize, usize) {
    debug_assert!(n > 0 && rank < n);
    let c = padded_chunk(size, n);
    let start = c * rank;
    if start >= size {
        (0, size)
    } else {
        ((start + c).min(size) - start, start)
    }
}

/// The padded chunk size `ceil(size / n)` every shard is padded to inside collectives.
pub fn padded_chunk(size: usize, n: usize) -> usize {
    size.div_ceil(n)
}

/// Local shape and global offset of the shard held at mesh coordinate `coord`.
///
/// Placements must be normalised. Two mesh dims sharding one tensor dim nest left to right:
/// the shard of mesh dim 0 is further split by mesh dim 1.
pub fn local_shape_and_offset(
    global_shape: &[usize],
    mesh_shape: &[usize],
    coord: &[usize],
    placements: &[Placement],
) -> (Vec<usize>, Vec<usize>) {
    let mut shape = global_shape.to_vec();
    let mut offset = vec![0; global_shape.len()];
    for (i, p) in placements.iter().enumerate() {
        if let Some(d) = p.shard_dim() {
            let (sz, off) = chunk_size_and_offset(shape[d], mesh_shape[i], coord[i]);
            shape[d] = sz;
            // An empty shard sits at the end of its parent block.
            offset[d] += off;
        }
    }
    (shape, offset)
}

/// Shape of the tensor as mesh dim `mesh_dim` sees it: this rank's local shape if mesh dim
/// `mesh_dim` were `Replicate` (the global shape split by every *other* mesh dim's sharding).
///
/// A redistribution step on `mesh_dim` only touches tensor dims that no inner mesh dim
/// shards, so for those dims this is the size split by the outer mesh dims alone.
pub fn level_shape(
    global_shape: &[usize],
    mesh_shape: &[usize],
    coord: &[usize],
    placements: &[Placement],
    mesh_dim: usize,
) -> Vec<usize> {
    let mut shape = global_shape.to_vec();
    for (i, p) in placements.iter().enumerate().filter(|&(i, _)| i != mesh_dim) {
        if let Some(d) = p.shard_dim() {
            shape[d] = chunk_size_and_offset(shape[d], mesh_shape[i], coord[i]).0;
        }
    }
    shape
}

/// Global shape implied by a local shape under even sharding (what `from_local` assumes
/// when no `shape` is given): local size × mesh size on every sharded dim.
pub fn global_shape_from_local(local_shape: &[usize], mesh_shape: &[usize], placements: &[Placement]) -> Vec<usize> {
    let mut shape = local_shape.to_vec();
    for (i, p) in placements.iter().enumerate() {
        if let Some(d) = p.shard_dim() {
            shape[d] *= mesh_shape[i];
        }
    }
    shape
}

/// Row-major (C-contiguous) strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Placement::*;

    #[test]
    fn chunk_examples_from_design() {
        let s: Vec<_> = (0..4).map(|r| chunk_size_and_offset(5, 4, r)).collect();
        assert_eq!(s.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 2, 1, 0]);
        assert_eq!(s.iter().map(|x| x.1).collect::<Vec<_>>(), vec![0, 2, 4, 5]);
        let s: Vec<_> = (0..4).map(|r| chunk_size_and_offset(3, 4, r).0).collect();
        assert_eq!(s, vec![1, 1, 1, 0]);
        let s: Vec<_> = (0..4).map(|r| chunk_size_and_offset(8, 4, r)).collect();
        assert_eq!(s, vec![(2, 0), (2, 2), (2, 4), (2, 6)]);
        // 6 over 4: chunk 2 -> [2,2,2,0] (torch.chunk gives only 3 chunks)
        let s: Vec<_> = (0..4).map(|r| chunk_size_and_offset(6, 4, r).0).collect();
        assert_eq!(s, vec![2, 2, 2, 0]);
        assert_eq!(chunk_size_and_offset(0, 3, 2), (0, 0));
    }

    #[test]
    fn chunks_cover_exactly() {
        for size in 0..40 {
            for n in 1..9 {
                let mut next = 0;
                for r in 0..n {
                    let (sz, off) = chunk_size_and_offset(size, n, r);
                    if sz > 0 {
                        assert_eq!(off, next);
                    }
                    next = off + sz;
                    assert!(sz <= padded_chunk(size, n));
                }
                assert_eq!(next, size, "size {size} n {n}");
            }
        }
    }

    #[test]
    fn nested_sharding_splits_left_to_right() {
        // 2x2 mesh, (S(0), S(0)) on 10 rows: mesh dim 0 -> [5,5], mesh dim 1 -> [3,2]
        let p = [Shard(0), Shard(0)];
        let got: Vec<_> =
            [[0, 0], [0, 1], [1, 0], [1, 1]].iter().map(|c| local_shape_and_offset(&[10, 3], &[2, 2], c, &p)).collect();
        assert_eq!(got[0], (vec![3, 3], vec![0, 0]));
        assert_eq!(got[1], (vec![2, 3], vec![3, 0]));
        assert_eq!(got[2], (vec![3, 3], vec![5, 0]));
        assert_eq!(got[3], (vec![2, 3], vec![8, 0]));
        assert_eq!(level_shape(&[10, 3], &[2, 2], &[1, 1], &p, 1), vec![5, 3]);
        // Inner mesh dims that shard other tensor dims count too.
        assert_eq!(level_shape(&[8, 7], &[2, 2], &[1, 1], &[Replicate, Shard(1)], 0), vec![8, 3]);
    }

    #[test]
    fn global_from_local_and_strides() {
        assert_eq!(global_shape_from_local(&[2, 3], &[2, 4], &[Shard(0), Shard(1)]), vec![4, 12]);
        assert_eq!(global_shape_from_local(&[2, 3], &[2, 4], &[Replicate, Shard(0)]), vec![8, 3]);
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(contiguous_strides(&[]), Vec::<usize>::new());
    }
}
