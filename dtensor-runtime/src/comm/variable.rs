//! Variable-size collectives: the argument checks every backend shares, and the default
//! implementations over the equal-block collectives.
//!
//! Uneven shards (torch.chunk sizes) give members blocks of different sizes. The defaults pad
//! every block to the largest, run the equal-block collective and drop the padding: one copy
//! in and one out, which backends that place blocks directly (the thread backend) or have a
//! variable-count primitive (MPI's `MPI_Allgatherv`, `MPI_Alltoallv`) avoid.

use super::check::{mismatch, whole};
use super::{group, Communicator, RecvBuf};
use crate::element::DType;
use crate::error::Result;
use crate::placement::ReduceOp;

/// Byte offset of every block when blocks of `counts` bytes lie back to back.
pub(crate) fn offsets(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0usize, |at, &c| {
            let o = *at;
            *at += c;
            Some(o)
        })
        .collect()
}

/// `Σ counts`, or an error when it overflows.
pub(crate) fn total(op: &str, counts: &[usize]) -> Result<usize> {
    counts
        .iter()
        .try_fold(0usize, |a, &c| a.checked_add(c))
        .ok_or_else(|| mismatch(op, format!("the counts {counts:?} overflow")))
}

/// One count per member of a group of `n`.
pub(crate) fn one_per_member(op: &str, what: &str, counts: &[usize], n: usize) -> Result<()> {
    if counts.len() != n {
        return Err(mismatch(op, format!("{} {what} for a group of {n}", counts.len())));
    }
    Ok(())
}

/// All-gather-v: member `me` sends `counts[me]` bytes; `recv` holds `Σ counts`.
pub(crate) fn check_all_gather(n: usize, me: usize, send: usize, counts: &[usize], recv: usize) -> Result<()> {
    const OP: &str = "all_gather_v";
    one_per_member(OP, "counts", counts, n)?;
    if send != counts[me] {
        return Err(mismatch(OP, format!("send has {send} bytes, counts[{me}] is {}", counts[me])));
    }
    let sum = total(OP, counts)?;
    if recv != sum {
        return Err(mismatch(OP, format!("recv has {recv} bytes, the counts add up to {sum}")));
    }
    Ok(())
}

/// Reduce-scatter-v: `send` holds the `n` blocks back to back; `recv` is block `me`; every
/// block is whole elements of `dtype`.
pub(crate) fn check_reduce_scatter(
    n: usize,
    me: usize,
    send: usize,
    counts: &[usize],
    recv: usize,
    dtype: DType,
) -> Result<()> {
    const OP: &str = "reduce_scatter_v";
    one_per_member(OP, "counts", counts, n)?;
    for &c in counts {
        whole(OP, c, dtype)?;
    }
    let sum = total(OP, counts)?;
    if send != sum {
        return Err(mismatch(OP, format!("send has {send} bytes, the counts add up to {sum}")));
    }
    if recv != counts[me] {
        return Err(mismatch(OP, format!("recv has {recv} bytes, counts[{me}] is {}", counts[me])));
    }
    Ok(())
}

/// All-to-all-v: `send` is `rows` rows of the runs `runs` (one per member); `recv` holds
/// `Σ recv_counts` (one per member).
pub(crate) fn check_all_to_all(
    n: usize,
    send: usize,
    rows: usize,
    runs: &[usize],
    recv: usize,
    recv_counts: &[usize],
) -> Result<()> {
    const OP: &str = "all_to_all_v";
    one_per_member(OP, "runs", runs, n)?;
    one_per_member(OP, "recv counts", recv_counts, n)?;
    let row = total(OP, runs)?;
    if row.checked_mul(rows) != Some(send) {
        return Err(mismatch(OP, format!("send has {send} bytes, expected {rows} rows of runs {runs:?}")));
    }
    let sum = total(OP, recv_counts)?;
    if recv != sum {
        return Err(mismatch(OP, format!("recv has {recv} bytes, the recv counts add up to {sum}")));
    }
    Ok(())
}

/// Run `j` of every row of `send` (`rows` rows of the runs `runs`), row after row: the block
/// member `j` gets from an all-to-all-v, as the backends that need it contiguous copy it out.
pub(crate) fn block_runs<'a>(send: &'a [u8], rows: usize, runs: &[usize], j: usize) -> impl Iterator<Item = &'a [u8]> {
    let row: usize = runs.iter().sum();
    let (start, run) = (runs[..j].iter().sum::<usize>(), runs[j]);
    (0..rows).map(move |r| &send[r * row + start..r * row + start + run])
}

/// `data` at the start of a zero-filled buffer of `len` bytes.
fn padded(data: &[u8], len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    v[..data.len()].copy_from_slice(data);
    v
}

/// [`Communicator::all_gather_v`] over `all_gather`: every block padded to the largest.
pub(crate) fn padded_all_gather<C: Communicator + ?Sized>(
    comm: &C,
    grp: &[usize],
    send: &[u8],
    counts: &[usize],
    mut recv: RecvBuf<'_>,
) -> Result<()> {
    let me = group::index_of("all_gather_v", comm.rank(), grp)?;
    check_all_gather(grp.len(), me, send.len(), counts, recv.len())?;
    let m = counts.iter().copied().max().unwrap_or(0);
    let mut all = vec![0u8; m * grp.len()];
    comm.all_gather(grp, &padded(send, m), (&mut all).into())?;
    for (i, (&c, o)) in counts.iter().zip(offsets(counts)).enumerate() {
        recv.write(o, &all[i * m..i * m + c]);
    }
    Ok(())
}

/// [`Communicator::reduce_scatter_v`] over `reduce_scatter`: every block padded to the largest.
pub(crate) fn padded_reduce_scatter<C: Communicator + ?Sized>(
    comm: &C,
    grp: &[usize],
    send: &[u8],
    counts: &[usize],
    mut recv: RecvBuf<'_>,
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    let me = group::index_of("reduce_scatter_v", comm.rank(), grp)?;
    check_reduce_scatter(grp.len(), me, send.len(), counts, recv.len(), dtype)?;
    let m = counts.iter().copied().max().unwrap_or(0);
    let mut blocks = vec![0u8; m * grp.len()];
    for (i, (&c, o)) in counts.iter().zip(offsets(counts)).enumerate() {
        blocks[i * m..i * m + c].copy_from_slice(&send[o..o + c]);
    }
    let mut mine = vec![0u8; m];
    comm.reduce_scatter(grp, &blocks, (&mut mine).into(), dtype, op)?;
    recv.init_from(&mine[..counts[me]]);
    Ok(())
}

/// [`Communicator::all_to_all_v`] over `all_to_all`: the members first agree on the largest
/// block (an all-gather of one `u64` each), then every block is padded to it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn padded_all_to_all<C: Communicator + ?Sized>(
    comm: &C,
    grp: &[usize],
    send: &[u8],
    rows: usize,
    runs: &[usize],
    mut recv: RecvBuf<'_>,
    recv_counts: &[usize],
) -> Result<()> {
    let n = grp.len();
    group::index_of("all_to_all_v", comm.rank(), grp)?;
    check_all_to_all(n, send.len(), rows, runs, recv.len(), recv_counts)?;
    let mine = runs.iter().map(|r| r * rows).chain(recv_counts.iter().copied()).max().unwrap_or(0) as u64;
    let mut maxima = vec![0u8; 8 * n];
    comm.all_gather(grp, &mine.to_ne_bytes(), (&mut maxima).into())?;
    let m = maxima.chunks_exact(8).map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default())).max().unwrap_or(0);
    let m = usize::try_from(m).map_err(|_| mismatch("all_to_all_v", format!("a block of {m} bytes")))?;
    let mut blocks = vec![0u8; m * n];
    for (j, &run) in runs.iter().enumerate() {
        for (r, src) in block_runs(send, rows, runs, j).enumerate() {
            let at = j * m + r * run;
            blocks[at..at + run].copy_from_slice(src);
        }
    }
    let mut got = vec![0u8; m * n];
    comm.all_to_all(grp, &blocks, (&mut got).into())?;
    for (i, (&c, o)) in recv_counts.iter().zip(offsets(recv_counts)).enumerate() {
        recv.write(o, &got[i * m..i * m + c]);
    }
    Ok(())
}
