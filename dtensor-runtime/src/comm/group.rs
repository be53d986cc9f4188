//! Groups of ranks: one home for membership, "is this the whole world" and the colour/key of
//! a communicator split, shared by every backend.
//!
//! A group is a list of global ranks in group order; a partition is a list of disjoint groups
//! that together hold every rank of the world (the groups of one mesh dim).

// `validate` and `index_of` serve every backend; the rest only the process backends (MPI,
// NCCL), which split communicators.
#![cfg_attr(not(any(feature = "mpi", feature = "cuda")), allow(dead_code))]

use crate::error::{Error, Result};

/// `group` names ranks of a world of `world` ranks, each once.
pub(crate) fn validate(op: &str, group: &[usize], world: usize) -> Result<()> {
    if let Some(&r) = group.iter().find(|&&r| r >= world) {
        return Err(Error::RankOutOfRange { rank: r, world_size: world });
    }
    let mut sorted = group.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::InvalidArgument {
            context: op.into(),
            reason: format!("group {group:?} lists rank {} twice", w[0]),
        });
    }
    Ok(())
}

/// Index of `rank` in `group`, or [`Error::NotInGroup`].
pub(crate) fn index_of(op: &str, rank: usize, group: &[usize]) -> Result<usize> {
    group.iter().position(|&r| r == rank).ok_or_else(|| Error::NotInGroup {
        op: op.into(),
        rank,
        group: group.to_vec(),
    })
}

/// [`validate`] then [`index_of`]: this rank's index in a well-formed group.
pub(crate) fn member(op: &str, rank: usize, world: usize, group: &[usize]) -> Result<usize> {
    validate(op, group, world)?;
    index_of(op, rank, group)
}

/// Whether `group` is the whole world of `world` ranks in rank order.
pub(crate) fn is_world(group: &[usize], world: usize) -> bool {
    group.len() == world && group.iter().enumerate().all(|(i, &r)| i == r)
}

/// One communicator split a rank takes part in: its group, the group's index in its partition
/// (the colour) and the rank's position in the group (the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Split {
    pub colour: usize,
    pub key: usize,
    pub group: Vec<usize>,
}

/// The splits `rank` takes part in for `partitions`, skipping a partition that is the whole
/// world in rank order (the world communicator serves it). Every partition is checked first,
/// so every rank fails the same way before any split starts.
pub(crate) fn splits(partitions: &[Vec<Vec<usize>>], rank: usize, world: usize) -> Result<Vec<Split>> {
    let mut plan = Vec::new();
    for p in partitions {
        let mut seen = vec![0usize; world];
        p.iter().flatten().filter(|&&r| r < world).for_each(|&r| seen[r] += 1);
        if p.iter().flatten().any(|&r| r >= world) || seen.iter().any(|&c| c != 1) {
            return Err(Error::InvalidArgument {
                context: "prepare_groups".into(),
                reason: format!("{p:?} is not a partition of the {world} world ranks"),
            });
        }
        let Some((colour, group)) = p.iter().enumerate().find(|(_, g)| g.contains(&rank)) else {
            return Err(Error::NotInGroup { op: "prepare_groups".into(), rank, group: p.concat() });
        };
        if p.len() == 1 && is_world(group, world) {
            continue;
        }
        let key = index_of("prepare_groups", rank, group)?;
        plan.push(Split { colour, key, group: group.clone() });
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_and_world() {
        assert_eq!(member("x", 2, 4, &[3, 2]).unwrap(), 1);
        assert!(matches!(member("x", 0, 4, &[3, 2]), Err(Error::NotInGroup { rank: 0, .. })));
        assert!(matches!(member("x", 0, 4, &[0, 4]), Err(Error::RankOutOfRange { rank: 4, world_size: 4 })));
        assert!(matches!(member("x", 0, 4, &[0, 1, 0]), Err(Error::InvalidArgument { .. })));
        assert!(is_world(&[0, 1, 2], 3));
        assert!(!is_world(&[1, 0, 2], 3));
        assert!(!is_world(&[0, 1], 3));
    }

    #[test]
    fn splits_give_colour_and_key_and_skip_the_world() {
        // A 2x2 mesh: dim 0 groups [0,2],[1,3]; dim 1 groups [0,1],[2,3]; the whole world.
        let parts = vec![vec![vec![0, 2], vec![1, 3]], vec![vec![0, 1], vec![2, 3]], vec![vec![0, 1, 2, 3]]];
        let s = splits(&parts, 3, 4).unwrap();
        assert_eq!(
            s,
            vec![Split { colour: 1, key: 1, group: vec![1, 3] }, Split { colour: 1, key: 1, group: vec![2, 3] },]
        );
        // A reordered whole world is a split of its own.
        assert_eq!(splits(&[vec![vec![1, 0]]], 0, 2).unwrap(), vec![Split { colour: 0, key: 1, group: vec![1, 0] }]);
        assert!(matches!(splits(&[vec![vec![0], vec![0, 1]]], 0, 2), Err(Error::InvalidArgument { .. })));
        assert!(matches!(splits(&[vec![vec![0, 2]]], 0, 2), Err(Error::InvalidArgument { .. })));
    }
}
