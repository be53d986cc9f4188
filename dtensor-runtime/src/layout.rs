//! Layout math: which slice of the global tensor a rank holds (torch.chunk semantics).
//!
//! For a size `s` split over `n` ranks, the chunk is `c = ceil(s / n)` and rank `r` holds
//! `[c*r, min(s, c*r + c))`; ranks whose start is past `s` hold an empty shard at offset `s`.
//!
//! The public `checked_*` functions check their arguments (mesh sizes, coordinates, the number
//! and range of placements, overflow) and return errors. The crate calls the unchecked
//! versions beside them on arguments a [`DeviceMesh`](crate::DeviceMesh) and
//! [`normalize_placements`] have already checked.

pub mod pack;

use crate::error::{Error, Result};
use crate::placement::{normalize_placements, Placement};
use crate::shape::{checked_numel, contiguous_strides};

/// Size and offset of chunk `rank` when `size` is split over `n` ranks (torch.chunk).
///
/// ```
/// use dtensor_runtime::layout::checked_chunk_size_and_offset;
/// let sizes: Vec<_> = (0..4).map(|r| checked_chunk_size_and_offset(5, 4, r).unwrap()).collect();
/// assert_eq!(sizes, vec![(2, 0), (2, 2), (1, 4), (0, 5)]);
/// assert!(checked_chunk_size_and_offset(5, 0, 0).is_err()); // no ranks
/// assert!(checked_chunk_size_and_offset(5, 4, 4).is_err()); // no rank 4 of 4
/// ```
pub fn checked_chunk_size_and_offset(size: usize, n: usize, rank: usize) -> Result<(usize, usize)> {
    if n == 0 {
        return Err(Error::InvalidArgument {
            context: "layout::checked_chunk_size_and_offset".into(),
            reason: format!("cannot split size {size} over 0 ranks"),
        });
    }
    if rank >= n {
        return Err(Error::RankOutOfRange { rank, world_size: n });
    }
    Ok(chunk_size_and_offset(size, n, rank))
}

/// [`checked_chunk_size_and_offset`] for `n > 0` and `rank < n`.
pub(crate) fn chunk_size_and_offset(size: usize, n: usize, rank: usize) -> (usize, usize) {
    debug_assert!(n > 0 && rank < n);
    let c = padded_chunk(size, n);
    // Saturation is exact here: a saturated start or end lies past `size`, where both clamp.
    let start = c.saturating_mul(rank);
    if start >= size {
        (0, size)
    } else {
        (start.saturating_add(c).min(size) - start, start)
    }
}

/// The padded chunk size `ceil(size / n)` every shard is padded to inside collectives.
pub(crate) fn padded_chunk(size: usize, n: usize) -> usize {
    size.div_ceil(n)
}

/// Checks a mesh shape and a coordinate in it (public entry points only).
fn check_mesh(context: &str, mesh_shape: &[usize], coord: Option<&[usize]>) -> Result<()> {
    if let Some(i) = mesh_shape.iter().position(|&s| s == 0) {
        return Err(Error::InvalidMesh { reason: format!("{context}: mesh dimension {i} has size 0") });
    }
    if let Some(c) = coord {
        if c.len() != mesh_shape.len() || c.iter().zip(mesh_shape).any(|(c, s)| c >= s) {
            return Err(Error::InvalidArgument {
                context: context.into(),
                reason: format!("coordinate {c:?} is outside mesh shape {mesh_shape:?}"),
            });
        }
    }
    Ok(())
}

/// Local shape and global offset of the shard held at mesh coordinate `coord`, after checking
/// every argument (placements may be unnormalised: `Shard(-1)` is the last dim).
///
/// Two mesh dims sharding one tensor dim nest left to right: the shard of mesh dim 0 is
/// further split by mesh dim 1.
///
/// ```
/// use dtensor_runtime::layout::checked_local_shape_and_offset;
/// use dtensor_runtime::{Error, Replicate, Shard};
/// let (shape, offset) = checked_local_shape_and_offset(&[10, 3], &[2, 2], &[1, 1], &[Shard(0), Shard(-2)]).unwrap();
/// assert_eq!((shape, offset), (vec![2, 3], vec![8, 0]));
/// let e = checked_local_shape_and_offset(&[10], &[2], &[0], &[Shard(0), Replicate]);
/// assert!(matches!(e, Err(Error::PlacementCountMismatch { given: 2, mesh_ndim: 1 })));
/// ```
pub fn checked_local_shape_and_offset(
    global_shape: &[usize],
    mesh_shape: &[usize],
    coord: &[usize],
    placements: &[Placement],
) -> Result<(Vec<usize>, Vec<usize>)> {
    check_mesh("layout::checked_local_shape_and_offset", mesh_shape, Some(coord))?;
    let placements = normalize_placements(placements, global_shape.len(), mesh_shape.len())?;
    Ok(local_shape_and_offset(global_shape, mesh_shape, coord, &placements))
}

/// [`checked_local_shape_and_offset`] for a checked mesh, coordinate and normalised placements.
pub(crate) fn local_shape_and_offset(
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
pub(crate) fn level_shape(
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
/// when no `shape` is given): local size × mesh size on every sharded dim. Errors for a bad
/// mesh shape or placements, and for a global shape that overflows
/// ([`checked_numel`]'s bound).
///
/// ```
/// use dtensor_runtime::layout::checked_global_shape_from_local;
/// use dtensor_runtime::{Error, Replicate, Shard};
/// assert_eq!(checked_global_shape_from_local(&[2, 3], &[2, 4], &[Shard(0), Shard(1)]).unwrap(), vec![4, 12]);
/// let huge = checked_global_shape_from_local(&[1 << 62], &[4], &[Shard(0)]);
/// assert!(matches!(huge, Err(Error::ShapeOverflow { .. })));
/// ```
pub fn checked_global_shape_from_local(
    local_shape: &[usize],
    mesh_shape: &[usize],
    placements: &[Placement],
) -> Result<Vec<usize>> {
    const CONTEXT: &str = "global shape from the local shape";
    check_mesh(CONTEXT, mesh_shape, None)?;
    let placements = normalize_placements(placements, local_shape.len(), mesh_shape.len())?;
    let mut shape = local_shape.to_vec();
    for (i, p) in placements.iter().enumerate() {
        if let Some(d) = p.shard_dim() {
            shape[d] = shape[d]
                .checked_mul(mesh_shape[i])
                .ok_or_else(|| Error::ShapeOverflow { context: CONTEXT.into(), shape: local_shape.to_vec() })?;
        }
    }
    checked_numel(CONTEXT, &shape)?;
    Ok(shape)
}

/// The shard of `shape` at `offset` inside a row-major tensor of shape `global`, element `i`
/// set to `f(i)` for its flat index `i` in the global tensor, in row-major order.
///
/// Walks the shard row by row (the last dim is contiguous in `global`), so the per-element
/// cost is one call of `f`, not a dynamic-rank index computation: this builds every random and
/// position-valued factory shard.
pub(crate) fn shard_from_global_index<T>(
    global: &[usize],
    offset: &[usize],
    shape: &[usize],
    mut f: impl FnMut(usize) -> T,
) -> Result<ndarray::ArrayD<T>> {
    let strides = contiguous_strides(global);
    let n: usize = shape.iter().product();
    // Sized by the caller's shape: a shard too large for memory is an error, not an abort.
    let mut data = crate::alloc::try_with_capacity("factory shard", n)?;
    if n > 0 {
        let lead = shape.len().saturating_sub(1);
        let row = shape.get(lead).copied().unwrap_or(1);
        let mut ix = vec![0usize; lead];
        for _ in 0..n / row {
            let base: usize =
                (0..shape.len()).map(|d| (ix.get(d).copied().unwrap_or(0) + offset[d]) * strides[d]).sum();
            data.extend((base..base + row).map(&mut f));
            // The next row: an odometer over the leading dims.
            for d in (0..lead).rev() {
                ix[d] += 1;
                if ix[d] < shape[d] {
                    break;
                }
                ix[d] = 0;
            }
        }
    }
    Ok(ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), data)
        .unwrap_or_else(|_| unreachable!("{n} elements were generated for shape {shape:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_from_global_index_matches_the_per_element_formula() {
        // (global, offset, shard): rank 0..3, empty dims, a 0-d tensor, an offset on every dim.
        let cases: [(&[usize], &[usize], &[usize]); 6] = [
            (&[5, 7, 3], &[2, 1, 0], &[2, 4, 3]),
            (&[5, 7, 3], &[0, 3, 1], &[5, 2, 2]),
            (&[4, 0], &[1, 0], &[2, 0]),
            (&[3, 4], &[3, 0], &[0, 4]),
            (&[], &[], &[]),
            (&[9], &[4], &[3]),
        ];
        for (global, offset, shape) in cases {
            let strides = contiguous_strides(global);
            let want = ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(shape), |ix| {
                (0..shape.len()).map(|d| (ix[d] + offset[d]) * strides[d]).sum::<usize>()
            });
            assert_eq!(
                shard_from_global_index(global, offset, shape, |i| i).unwrap(),
                want,
                "{global:?} {offset:?} {shape:?}"
            );
        }
    }
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
    fn global_from_local() {
        let g = |l: &[usize], p: &[Placement]| checked_global_shape_from_local(l, &[2, 4], p).unwrap();
        assert_eq!(g(&[2, 3], &[Shard(0), Shard(1)]), vec![4, 12]);
        assert_eq!(g(&[2, 3], &[Replicate, Shard(0)]), vec![8, 3]);
        assert_eq!(g(&[2, 3], &[Replicate, Shard(-1)]), vec![2, 12]);
    }

    /// Bad arguments to the public helpers are errors, never panics (zero ranks, more
    /// placements than mesh dims, coordinates outside the mesh, overflow).
    #[test]
    fn checked_helpers_reject_bad_arguments() {
        assert!(matches!(checked_chunk_size_and_offset(5, 0, 0), Err(Error::InvalidArgument { .. })));
        assert!(matches!(
            checked_chunk_size_and_offset(5, 2, 2),
            Err(Error::RankOutOfRange { rank: 2, world_size: 2 })
        ));
        let m = usize::MAX;
        assert_eq!(checked_chunk_size_and_offset(m, 2, 1).unwrap(), (m / 2, m / 2 + 1));
        assert_eq!(checked_chunk_size_and_offset(m, 3, 2).unwrap(), (m / 3, 2 * (m / 3)));
        let lso = |g: &[usize], m: &[usize], c: &[usize], p: &[Placement]| checked_local_shape_and_offset(g, m, c, p);
        assert!(matches!(lso(&[4], &[0], &[0], &[Shard(0)]), Err(Error::InvalidMesh { .. })));
        assert!(matches!(
            lso(&[4], &[2], &[0], &[Shard(0), Shard(0)]),
            Err(Error::PlacementCountMismatch { given: 2, mesh_ndim: 1 })
        ));
        assert!(matches!(lso(&[4], &[2], &[2], &[Shard(0)]), Err(Error::InvalidArgument { .. })));
        assert!(matches!(lso(&[4], &[2], &[0, 0], &[Shard(0)]), Err(Error::InvalidArgument { .. })));
        assert!(matches!(lso(&[4], &[2], &[0], &[Shard(1)]), Err(Error::ShardDimOutOfRange { dim: 1, ndim: 1 })));
        assert_eq!(lso(&[5, 7], &[2], &[1], &[Shard(-1)]).unwrap(), (vec![5, 3], vec![0, 4]));
        let g = |l: &[usize], m: &[usize], p: &[Placement]| checked_global_shape_from_local(l, m, p);
        assert!(matches!(g(&[2], &[0], &[Shard(0)]), Err(Error::InvalidMesh { .. })));
        assert!(matches!(g(&[2], &[2], &[Shard(0), Replicate]), Err(Error::PlacementCountMismatch { .. })));
        assert!(matches!(g(&[usize::MAX / 2 + 1], &[2], &[Shard(0)]), Err(Error::ShapeOverflow { .. })));
        assert!(matches!(g(&[1 << 31, 1 << 31], &[4], &[Shard(0)]), Err(Error::ShapeOverflow { .. })));
    }
}
