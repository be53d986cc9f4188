//! Local argument checks shared by every backend (threads, MPI, NCCL): a bad call fails the
//! same way on every rank, before any message moves.

use crate::element::DType;
use crate::error::{Error, Result};
use crate::placement::ReduceOp;

/// A buffer of the wrong size for collective `op`.
pub(crate) fn mismatch(op: &str, reason: String) -> Error {
    Error::BufferMismatch { op: op.into(), reason }
}

/// A group index (`root`) inside a group of `n`.
pub(crate) fn root(root: usize, n: usize) -> Result<()> {
    if root >= n {
        return Err(Error::RankOutOfRange { rank: root, world_size: n });
    }
    Ok(())
}

/// `len` bytes are whole elements of `dtype`.
pub(crate) fn whole(op: &str, len: usize, dtype: DType) -> Result<()> {
    if !len.is_multiple_of(dtype.size_of()) {
        return Err(mismatch(op, format!("{len} bytes is not a whole number of {dtype}")));
    }
    Ok(())
}

/// `big` holds exactly `n` blocks of `block` bytes (all-gather recv, reduce-scatter send,
/// scatter root send).
pub(crate) fn blocks(op: &str, which: &str, big: usize, n: usize, block: usize) -> Result<()> {
    if big != n * block {
        return Err(mismatch(op, format!("{which} has {big} bytes, expected {n} x {block}")));
    }
    Ok(())
}

/// All-reduce into a separate output: `send` and `recv` have the same length.
pub(crate) fn same_len(op: &str, send: usize, recv: usize) -> Result<()> {
    if send != recv {
        return Err(mismatch(op, format!("send has {send} bytes, recv {recv}")));
    }
    Ok(())
}

/// All-to-all: equal send and recv, divisible into `n` blocks.
pub(crate) fn all_to_all(send: usize, recv: usize, n: usize) -> Result<()> {
    if send != recv || !send.is_multiple_of(n) {
        return Err(mismatch(
            "all_to_all",
            format!("send ({send}) and recv ({recv}) must be equal and divisible by {n}"),
        ));
    }
    Ok(())
}

/// Strided all-to-all: `send` and `recv` each hold `rows` rows of `n` runs of `run` bytes.
pub(crate) fn all_to_all_strided(send: usize, recv: usize, rows: usize, run: usize, n: usize) -> Result<()> {
    if rows.checked_mul(run).and_then(|b| b.checked_mul(n)) != Some(send) || recv != send {
        return Err(mismatch(
            "all_to_all",
            format!("send ({send}) and recv ({recv}) must both be {rows} rows x {n} x {run} bytes"),
        ));
    }
    Ok(())
}

/// Every reduction, in the order of the one-word encodings below.
pub(crate) const REDUCE_OPS: [ReduceOp; 5] =
    [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product];

/// The arguments besides buffer sizes that every member of a collective must pass alike:
/// element type and reduction (reducing collectives), root (broadcast, scatter). Members that
/// disagree would each return Ok with different data (a bf16 sum meeting an f16 one, two roots
/// that each keep their own buffer), so backends compare them before any data moves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Args {
    pub dtype: Option<DType>,
    pub op: Option<ReduceOp>,
    pub root: Option<usize>,
}

impl Args {
    /// The arguments of a reducing collective.
    pub fn reduce(dtype: DType, op: ReduceOp) -> Args {
        Args { dtype: Some(dtype), op: Some(op), root: None }
    }

    /// The argument of a rooted collective.
    pub fn root(root: usize) -> Args {
        Args { root: Some(root), ..Args::default() }
    }

    /// `[dtype, op, root]`, each 0 when absent, else its index (or the root) plus one.
    pub fn words(self) -> [u64; 3] {
        let dtype = self.dtype.and_then(|d| DType::ALL.iter().position(|&x| x == d)).map_or(0, |i| i as u64 + 1);
        let op = self.op.and_then(|o| REDUCE_OPS.iter().position(|&x| x == o)).map_or(0, |i| i as u64 + 1);
        let root = self.root.map_or(0, |r| (r as u64).saturating_add(1));
        [dtype, op, root]
    }

    /// [`words`](Self::words) packed in one `usize` (the thread backend publishes one word):
    /// 4 bits of dtype, 4 of op, the root above (roots are group indices, checked first).
    pub fn packed(self) -> usize {
        let [d, o, r] = self.words();
        (d | o << 4 | r << 8) as usize
    }

    /// The first field in which `self` and `other` differ, as the fingerprint check names it
    /// (`dtype`, `reduce op`, `root`), and a description of both values.
    pub fn differ(self, other: Args) -> Option<(&'static str, String, String)> {
        let opt = |x: Option<String>| x.unwrap_or_else(|| "none".into());
        if self.dtype != other.dtype {
            let name = |a: Args| opt(a.dtype.map(|d| d.name().to_string()));
            return Some(("dtype", name(self), name(other)));
        }
        if self.op != other.op {
            let name = |a: Args| opt(a.op.map(|o| o.name().to_string()));
            return Some(("reduce op", name(self), name(other)));
        }
        if self.root != other.root {
            let name = |a: Args| opt(a.root.map(|r| r.to_string()));
            return Some(("root", name(self), name(other)));
        }
        None
    }

    /// The inverse of [`packed`](Self::packed) (unknown indices read as absent).
    pub fn unpack(w: usize) -> Args {
        let w = w as u64;
        Args::from_words([w & 0xf, (w >> 4) & 0xf, w >> 8])
    }

    /// The inverse of [`words`](Self::words) (unknown indices read as absent).
    pub fn from_words([d, o, r]: [u64; 3]) -> Args {
        let index = |w: u64| usize::try_from(w).ok().and_then(|w| w.checked_sub(1));
        Args {
            dtype: index(d).and_then(|i| DType::ALL.get(i)).copied(),
            op: index(o).and_then(|i| REDUCE_OPS.get(i)).copied(),
            root: index(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_pack_and_unpack_every_dtype_op_and_root() {
        for dtype in DType::ALL.map(Some).into_iter().chain([None]) {
            for op in REDUCE_OPS.map(Some).into_iter().chain([None]) {
                for root in [None, Some(0), Some(1), Some(65_535)] {
                    let a = Args { dtype, op, root };
                    assert_eq!(Args::unpack(a.packed()), a);
                }
            }
        }
        // Every pair of distinct dtypes differs in its word.
        for (i, a) in DType::ALL.iter().enumerate() {
            for b in &DType::ALL[i + 1..] {
                let (x, y) = (Args::reduce(*a, ReduceOp::Sum), Args::reduce(*b, ReduceOp::Sum));
                assert_ne!(x.packed(), y.packed());
                assert_eq!(x.differ(y).map(|d| d.0), Some("dtype"));
            }
        }
        assert_eq!(Args::root(0).differ(Args::root(1)).map(|d| d.0), Some("root"));
    }
}
