//! What the loaded NCCL library can do, decided from its `ncclGetVersion` code alone (pure,
//! so the decisions are tested without a GPU).
//!
//! cudarc binds every symbol of the newest NCCL and panics when a missing one is first
//! called, so a feature is used only when the version says the symbol and value exist.

use std::fmt;

/// An NCCL version code as `ncclGetVersion` returns it: `major * 10000 + minor * 100 + patch`
/// since 2.9, `major * 1000 + minor * 100 + patch` before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclVersion(pub i32);

/// How the NCCL backend builds a mesh dim's sub-communicators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupStrategy {
    /// `ncclCommSplit` of the world communicator (NCCL ≥ 2.18).
    Split,
    /// A fresh `ncclCommInitRank` per group, its unique id shared over the world
    /// communicator (older NCCL, which has no `ncclCommSplit`).
    InitRank,
}

impl NcclVersion {
    /// `(major, minor, patch)`.
    pub fn parts(self) -> (i32, i32, i32) {
        let v = self.0;
        if v >= 20900 {
            (v / 10000, v / 100 % 100, v % 100)
        } else {
            (v / 1000, v / 100 % 10, v % 100)
        }
    }

    /// At least `major.minor`.
    pub fn at_least(self, major: i32, minor: i32) -> bool {
        let (a, b, _) = self.parts();
        (a, b) >= (major, minor)
    }

    /// How sub-communicators are made: `ncclCommSplit` needs 2.18.
    pub fn group_strategy(self) -> GroupStrategy {
        if self.at_least(2, 18) {
            GroupStrategy::Split
        } else {
            GroupStrategy::InitRank
        }
    }

    /// Whether the `ncclAvg` reduction exists (2.10), so `Avg` needs no host divide.
    pub fn has_avg(self) -> bool {
        self.at_least(2, 10)
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, c) = self.parts();
        write!(f, "{a}.{b}.{c}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_both_encodings() {
        assert_eq!(NcclVersion(21801).parts(), (2, 18, 1));
        assert_eq!(NcclVersion(22703).to_string(), "2.27.3");
        assert_eq!(NcclVersion(2804).parts(), (2, 8, 4));
        assert_eq!(NcclVersion(21000).parts(), (2, 10, 0));
    }

    #[test]
    fn split_needs_2_18_and_avg_2_10() {
        assert_eq!(NcclVersion(21800).group_strategy(), GroupStrategy::Split);
        assert_eq!(NcclVersion(22703).group_strategy(), GroupStrategy::Split);
        assert_eq!(NcclVersion(21706).group_strategy(), GroupStrategy::InitRank);
        assert_eq!(NcclVersion(2804).group_strategy(), GroupStrategy::InitRank);
        assert!(NcclVersion(21003).has_avg());
        assert!(!NcclVersion(20906).has_avg());
        assert!(!NcclVersion(2804).has_avg());
    }
}
