//! Local argument checks shared by every backend (threads, MPI, NCCL): a bad call fails the
//! same way on every rank, before any message moves.

use crate::element::DType;
use crate::error::{Error, Result};

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
