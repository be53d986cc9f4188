//! Variable-size collectives: the argument checks every backend shares, and the default
//! implementations over the equal-block collectives.
//!
//! Uneven shards (torch.chunk sizes) give members blocks of different sizes. The defaults pad
//! every block to the largest, run the equal-block collective and drop the padding: one copy
//! in and one out, which backends that place blocks directly (the thread backend) or have a
//! variable-count primitive (MPI's `MPI_Allgatherv`, `MPI_Alltoallv`) avoid.
//!
//! Every backend checks that the members agree on every count before any data moves, so that
//! counts that disagree are a typed error on every member, never wrong data (equal totals and
//! equal largest blocks included): the thread backend compares the members' published counts,
//! MPI exchanges them first (`comm::mpi`), and the defaults here exchange small records first.

use super::check::{mismatch, whole, Args};
use super::{group, Buf, Communicator, RecvBuf};
use crate::element::DType;
use crate::error::{Error, Result};
use crate::placement::ReduceOp;

/// The blocks of an all-to-all with rows of `n` runs of `run` bytes each: block `j` is run `j`
/// of every row, one block after the other (what an equal-block all-to-all sends). Bounded by
/// the bytes: with runs of 0 bytes there is no row to walk, however many there are.
pub(crate) fn pack_strided(send: &[u8], n: usize, run: usize) -> Vec<u8> {
    let mut packed = Vec::with_capacity(send.len());
    if run > 0 {
        for j in 0..n {
            for row in send.chunks_exact(n * run) {
                packed.extend_from_slice(&row[j * run..(j + 1) * run]);
            }
        }
    }
    packed
}

/// [`Communicator::all_to_all_strided`] over `all_to_all` on host bytes: the lengths checked,
/// the column blocks packed, then an equal-block all-to-all.
pub(crate) fn packed_all_to_all<C: Communicator + ?Sized>(
    comm: &C,
    grp: &[usize],
    send: &[u8],
    rows: usize,
    run: usize,
    recv: RecvBuf<'_>,
) -> Result<()> {
    let n = grp.len();
    super::check::all_to_all_strided(send.len(), recv.len(), rows, run, n)?;
    comm.all_to_all(grp, Buf::Host(&pack_strided(send, n, run)), recv.into())
}

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
/// Yields nothing when run `j` is empty, however many rows there are: the walk is bounded by
/// the bytes it yields (an empty shard may have a huge leading dim).
pub(crate) fn block_runs<'a>(send: &'a [u8], rows: usize, runs: &[usize], j: usize) -> impl Iterator<Item = &'a [u8]> {
    let row: usize = runs.iter().sum();
    let (start, run) = (runs[..j].iter().sum::<usize>(), runs[j]);
    let rows = if run == 0 { 0 } else { rows };
    (0..rows).map(move |r| &send[r * row + start..r * row + start + run])
}

/// `data` at the start of a zero-filled buffer of `len` bytes.
fn padded(data: &[u8], len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    v[..data.len()].copy_from_slice(data);
    v
}

// ------------------------------------------------------------------------ agreement
// The defaults serve backends that compare nothing themselves (NCCL): before any data moves,
// the members exchange what they were called with, so that counts that disagree (equal totals
// or equal largest blocks included) are a typed error on every member, never wrong data. A
// member whose own arguments are bad still takes part in the exchange (so that no peer waits
// for it in a collective it never enters) and returns its own error; its peers return one
// naming it.

/// First word of every agreement record: tells the collectives apart (a record is never read
/// as another collective's).
const RECORD: u64 = 0x6474_7661_7200_0000;

/// The collectives of the records, in their tag order.
const KINDS: [&str; 3] = ["all_gather_v", "reduce_scatter_v", "all_to_all_v"];

fn record_tag(op: &str) -> u64 {
    RECORD | KINDS.iter().position(|&k| k == op).map_or(0xff, |i| i as u64)
}

/// `mine` (the same number of words on every member) from every member, in group order.
fn all_gather_words<C: Communicator + ?Sized>(comm: &C, grp: &[usize], mine: &[u64]) -> Result<Vec<Vec<u64>>> {
    let mut all = vec![0u64; mine.len() * grp.len()];
    comm.all_gather(grp, Buf::Host(bytemuck::cast_slice(mine)), bytemuck::cast_slice_mut::<u64, u8>(&mut all).into())?;
    Ok(all.chunks(mine.len().max(1)).map(<[u64]>::to_vec).collect())
}

/// A member's record: tag, whether it rejected its own arguments, the arguments that must
/// agree (`args`), then its `counts` (`n` words, zeros past its own when it passed too few).
fn record(op: &str, rejected: bool, args: Args, counts: &[usize], n: usize) -> Vec<u64> {
    let mut r = vec![record_tag(op), u64::from(rejected)];
    r.extend(args.words());
    r.extend((0..n).map(|i| counts.get(i).map_or(0, |&c| c as u64)));
    r
}

/// The verdict on every member's record (the same on every member: each compares all records
/// with its own, and when they are not all equal every member finds one that differs).
fn verdict(op: &str, grp: &[usize], me: usize, all: &[Vec<u64>], local: Result<()>) -> Result<()> {
    local?;
    if let Some(i) = all.iter().position(|r| r[1] != 0) {
        return Err(mismatch(op, format!("rank {} rejected its own arguments (see its error)", grp[i])));
    }
    let Some(i) = all.iter().position(|r| r != &all[me]) else { return Ok(()) };
    let (theirs, mine) = (&all[i], &all[me]);
    if theirs[0] != mine[0] {
        return Err(mismatch(op, format!("rank {} called another collective than rank {}", grp[i], grp[me])));
    }
    if theirs[2..5] != mine[2..5] {
        let unpack = |r: &[u64]| Args::from_words([r[2], r[3], r[4]]);
        let (field, a, b) = unpack(theirs).differ(unpack(mine)).unwrap_or(("arguments", String::new(), String::new()));
        return Err(Error::CollectiveMismatch {
            rank: grp[me],
            group: grp.to_vec(),
            field: field.into(),
            detail: format!("rank {} called `{op}` with {field} {a} while rank {} passed {b}", grp[i], grp[me]),
        });
    }
    Err(mismatch(op, format!("rank {} passed counts {:?}, rank {} {:?}", grp[i], &theirs[5..], grp[me], &mine[5..])))
}

/// [`Communicator::all_gather_v`] over `all_gather`: the members agree on the counts (an
/// all-gather of each member's), then every block is padded to the largest.
pub(crate) fn padded_all_gather<C: Communicator + ?Sized>(
    comm: &C,
    grp: &[usize],
    send: &[u8],
    counts: &[usize],
    mut recv: RecvBuf<'_>,
) -> Result<()> {
    const OP: &str = "all_gather_v";
    let (n, me) = (grp.len(), group::index_of(OP, comm.rank(), grp)?);
    let local = check_all_gather(n, me, send.len(), counts, recv.len());
    let all = all_gather_words(comm, grp, &record(OP, local.is_err(), Args::default(), counts, n))?;
    verdict(OP, grp, me, &all, local)?;
    let m = counts.iter().copied().max().unwrap_or(0);
    let mut all = vec![0u8; m * grp.len()];
    comm.all_gather(grp, Buf::Host(&padded(send, m)), (&mut all).into())?;
    for (i, (&c, o)) in counts.iter().zip(offsets(counts)).enumerate() {
        recv.write(o, &all[i * m..i * m + c]);
    }
    Ok(())
}

/// [`Communicator::reduce_scatter_v`] over `reduce_scatter`: the members agree on the counts,
/// element type and reduction, then every block is padded to the largest.
pub(crate) fn padded_reduce_scatter<C: Communicator + ?Sized>(
    comm: &C,
    grp: &[usize],
    send: &[u8],
    counts: &[usize],
    recv: RecvBuf<'_>,
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    const OP: &str = "reduce_scatter_v";
    let (n, me) = (grp.len(), group::index_of(OP, comm.rank(), grp)?);
    let local = check_reduce_scatter(n, me, send.len(), counts, recv.len(), dtype)
        .and_then(|()| super::reduce::check_op(dtype, op));
    let all = all_gather_words(comm, grp, &record(OP, local.is_err(), Args::reduce(dtype, op), counts, n))?;
    verdict(OP, grp, me, &all, local)?;
    reduce_scatter_padded(send, counts, me, recv, |blocks, mine| {
        comm.reduce_scatter(grp, Buf::Host(blocks), mine.into(), dtype, op)
    })
}

/// The data movement of a padded reduce-scatter-v (arguments checked and agreed): blocks
/// padded to the largest, `reduce` (an equal-block reduce-scatter of `blocks` into `mine`),
/// our block's padding dropped.
pub(crate) fn reduce_scatter_padded(
    send: &[u8],
    counts: &[usize],
    me: usize,
    mut recv: RecvBuf<'_>,
    reduce: impl FnOnce(&[u8], &mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    let m = counts.iter().copied().max().unwrap_or(0);
    let mut blocks = vec![0u8; m * counts.len()];
    for (i, (&c, o)) in counts.iter().zip(offsets(counts)).enumerate() {
        blocks[i * m..i * m + c].copy_from_slice(&send[o..o + c]);
    }
    let mut mine = vec![0u8; m];
    reduce(&blocks, &mut mine)?;
    recv.init_from(&mine[..counts[me]]);
    Ok(())
}

/// What every member of an all-to-all-v sends every peer (`rows × runs[j]` bytes to member
/// `j`), or `None` when that overflows.
pub(crate) fn send_counts(rows: usize, runs: &[usize]) -> Option<Vec<usize>> {
    runs.iter().map(|&r| r.checked_mul(rows)).collect()
}

/// The pairwise check of an all-to-all-v: `got[i]` is what member `i` says it sends us; our
/// `recv_counts[i]` must be it. Returns the first member that disagrees, with both counts.
pub(crate) fn first_disagreement(got: &[u64], recv_counts: &[usize]) -> Option<(usize, u64, usize)> {
    got.iter().zip(recv_counts).position(|(&g, &r)| g != r as u64).map(|i| (i, got[i], recv_counts[i]))
}

/// [`Communicator::all_to_all_v`] over `all_to_all`: every member first tells each peer how
/// many bytes it sends it (an all-to-all of one count per peer), which the peer compares with
/// what it expects; then the members agree on that verdict and on the largest block (an
/// all-gather of a few words each), and every block is padded to it.
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
    const OP: &str = "all_to_all_v";
    let n = grp.len();
    group::index_of(OP, comm.rank(), grp)?;
    let local = check_all_to_all(n, send.len(), rows, runs, recv.len(), recv_counts);
    let sent = match (&local, send_counts(rows, runs)) {
        (Ok(()), Some(s)) => s,
        _ => vec![0; n],
    };
    // To each peer: the tag and what we send it.
    let out: Vec<u64> = sent.iter().flat_map(|&c| [record_tag(OP), c as u64]).collect();
    let mut back = vec![0u64; 2 * n];
    comm.all_to_all(grp, Buf::Host(bytemuck::cast_slice(&out)), bytemuck::cast_slice_mut::<u64, u8>(&mut back).into())?;
    let got: Vec<u64> = back.chunks_exact(2).map(|w| if w[0] == record_tag(OP) { w[1] } else { u64::MAX }).collect();
    let wrong = if local.is_ok() { first_disagreement(&got, recv_counts) } else { None };
    let largest = sent.iter().chain(recv_counts).copied().max().unwrap_or(0) as u64;
    let (from, said, expected) = wrong.map_or((0, 0, 0), |(i, g, r)| (i as u64 + 1, g, r as u64));
    let mine = [record_tag(OP), u64::from(local.is_err()), from, said, expected, largest];
    let all = all_gather_words(comm, grp, &mine)?;
    local?;
    if let Some(i) = all.iter().position(|r| r[1] != 0) {
        return Err(mismatch(OP, format!("rank {} rejected its own arguments (see its error)", grp[i])));
    }
    if let Some((j, r)) = all.iter().enumerate().find(|(_, r)| r[0] != record_tag(OP) || r[2] != 0) {
        let from = r[2].checked_sub(1).and_then(|i| grp.get(i as usize)).copied();
        return Err(mismatch(
            OP,
            match from {
                Some(i) if r[3] == u64::MAX => format!("rank {i} called another collective than rank {}", grp[j]),
                Some(i) => {
                    format!("rank {i} sends rank {} {} bytes, which expects {} bytes from it", grp[j], r[3], r[4])
                }
                None => format!("rank {} called another collective", grp[j]),
            },
        ));
    }
    let m = all.iter().map(|r| r[5]).max().unwrap_or(0);
    let m = usize::try_from(m).map_err(|_| mismatch(OP, format!("a block of {m} bytes")))?;
    let mut blocks = vec![0u8; m * n];
    for (j, &run) in runs.iter().enumerate() {
        for (r, src) in block_runs(send, rows, runs, j).enumerate() {
            let at = j * m + r * run;
            blocks[at..at + run].copy_from_slice(src);
        }
    }
    let mut got = vec![0u8; m * n];
    comm.all_to_all(grp, Buf::Host(&blocks), (&mut got).into())?;
    for (i, (&c, o)) in recv_counts.iter().zip(offsets(recv_counts)).enumerate() {
        recv.write(o, &got[i * m..i * m + c]);
    }
    Ok(())
}
