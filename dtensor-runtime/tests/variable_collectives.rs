//! The variable-size collectives (`all_gather_v`, `reduce_scatter_v`, `all_to_all_v`) on the
//! thread backend, which places blocks directly, and on a communicator that only has the
//! equal-block collectives, so the trait's padded defaults run: every result against one
//! computed from the definitions on a single rank, empty blocks and 1..=5 ranks included, and
//! the mismatches a member can make, each a typed error on every member.

mod equal_blocks;

use dtensor_runtime::{Communicator, DType, Error, ReduceOp, ThreadWorld};
use equal_blocks::EqualBlocksOnly;
use std::sync::Arc;
use std::time::Duration;

/// Runs `f(rank, comm)` on `n` thread ranks, the thread backend itself (`padded = false`) or
/// wrapped so that the defaults run; returns every rank's result.
fn on_ranks<R: Send>(
    n: usize,
    padded: bool,
    f: impl Fn(usize, &dyn Communicator) -> Result<R, Error> + Sync,
) -> Vec<Result<R, Error>> {
    let world = ThreadWorld::new(n, Duration::from_secs(20));
    let comms: Vec<Arc<dyn Communicator>> = (0..n)
        .map(|r| {
            let c = world.communicator(r).unwrap();
            if padded {
                Arc::new(EqualBlocksOnly(c)) as Arc<dyn Communicator>
            } else {
                Arc::new(c)
            }
        })
        .collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let f = &f;
                s.spawn(move || f(r, c.as_ref()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A small deterministic generator (the cases must be the same on every rank).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// Element `idx` of rank `r`'s data.
fn value(r: usize, idx: usize) -> f32 {
    (r * 1000 + idx) as f32
}

fn f32s(b: &[u8]) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(b)
}

/// Counts for a group of `n`: zeros included, sometimes all of them.
fn counts(rng: &mut Lcg, n: usize) -> Vec<usize> {
    let zeros = rng.below(5) == 0;
    (0..n).map(|_| if zeros { 0 } else { rng.below(4) * rng.below(4) }).collect()
}

#[test]
fn all_gather_v_places_every_block() {
    let mut rng = Lcg(1);
    for padded in [false, true] {
        for n in 1..=5 {
            for _ in 0..6 {
                let c = counts(&mut rng, n);
                let want: Vec<f32> = (0..n).flat_map(|i| (0..c[i]).map(move |k| value(i, k))).collect();
                let group: Vec<usize> = (0..n).collect();
                for got in on_ranks(n, padded, |r, comm| {
                    let send: Vec<f32> = (0..c[r]).map(|k| value(r, k)).collect();
                    let mut recv = vec![0u8; 4 * want.len()];
                    let bytes: Vec<usize> = c.iter().map(|x| 4 * x).collect();
                    comm.all_gather_v(&group, bytemuck::cast_slice(&send).into(), &bytes, (&mut recv).into())?;
                    Ok(f32s(&recv))
                }) {
                    assert_eq!(got.unwrap(), want, "padded {padded} n {n} counts {c:?}");
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_v_reduces_every_block() {
    let mut rng = Lcg(2);
    for padded in [false, true] {
        for n in 1..=5 {
            for _ in 0..6 {
                let c = counts(&mut rng, n);
                let total: usize = c.iter().sum();
                let group: Vec<usize> = (0..n).collect();
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                    // Reference: the reduction over ranks of every element, on one rank.
                    let reduced: Vec<f32> = (0..total)
                        .map(|k| {
                            let vals = (0..n).map(|r| value(r, k));
                            match op {
                                ReduceOp::Sum => vals.sum(),
                                ReduceOp::Max => vals.fold(f32::MIN, f32::max),
                                _ => vals.sum::<f32>() / n as f32,
                            }
                        })
                        .collect();
                    let results = on_ranks(n, padded, |r, comm| {
                        let send: Vec<f32> = (0..total).map(|k| value(r, k)).collect();
                        let mut recv = vec![0u8; 4 * c[r]];
                        let bytes: Vec<usize> = c.iter().map(|x| 4 * x).collect();
                        comm.reduce_scatter_v(
                            &group,
                            bytemuck::cast_slice(&send).into(),
                            &bytes,
                            (&mut recv).into(),
                            DType::F32,
                            op,
                        )?;
                        Ok(f32s(&recv))
                    });
                    let mut at = 0;
                    for (r, got) in results.into_iter().enumerate() {
                        assert_eq!(got.unwrap(), reduced[at..at + c[r]], "padded {padded} n {n} {op:?} counts {c:?}");
                        at += c[r];
                    }
                }
            }
        }
    }
}

/// Code of the element at position `p` of row `row` of rank `i`'s run for rank `j`.
fn code(i: usize, j: usize, row: usize, p: usize) -> f32 {
    (((i * 8 + j) * 16 + row) * 16 + p) as f32
}

#[test]
fn all_to_all_v_delivers_every_run() {
    let mut rng = Lcg(3);
    for padded in [false, true] {
        for n in 1..=5 {
            for _ in 0..6 {
                // Every rank its own rows and runs (rows 0 and runs 0 included).
                let rows: Vec<usize> = (0..n).map(|_| rng.below(4)).collect();
                let runs: Vec<Vec<usize>> = (0..n).map(|_| (0..n).map(|_| rng.below(4)).collect()).collect();
                let group: Vec<usize> = (0..n).collect();
                let results = on_ranks(n, padded, |me, comm| {
                    let mut send = Vec::new();
                    for row in 0..rows[me] {
                        for (j, &run) in runs[me].iter().enumerate() {
                            send.extend((0..run).map(|p| code(me, j, row, p)));
                        }
                    }
                    let recv_counts: Vec<usize> = (0..n).map(|i| 4 * rows[i] * runs[i][me]).collect();
                    let mut recv = vec![0u8; recv_counts.iter().sum()];
                    let run_bytes: Vec<usize> = runs[me].iter().map(|x| 4 * x).collect();
                    comm.all_to_all_v(
                        &group,
                        bytemuck::cast_slice(&send).into(),
                        rows[me],
                        &run_bytes,
                        (&mut recv).into(),
                        &recv_counts,
                    )?;
                    Ok(f32s(&recv))
                });
                for (j, got) in results.into_iter().enumerate() {
                    let want: Vec<f32> = (0..n)
                        .flat_map(|i| {
                            let run = runs[i][j];
                            (0..rows[i]).flat_map(move |row| (0..run).map(move |p| code(i, j, row, p)))
                        })
                        .collect();
                    assert_eq!(got.unwrap(), want, "padded {padded} n {n} rank {j} rows {rows:?} runs {runs:?}");
                }
            }
        }
    }
}

/// Every rank of `results` failed with a `BufferMismatch` whose reason mentions `needle`.
fn all_mismatch<R: std::fmt::Debug>(results: Vec<Result<R, Error>>, needle: &str) {
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Err(Error::BufferMismatch { reason, .. }) => assert!(reason.contains(needle), "rank {r}: {reason}"),
            other => panic!("rank {r}: expected a BufferMismatch about {needle}, got {other:?}"),
        }
    }
}

#[test]
fn members_that_disagree_all_get_a_typed_error() {
    let g = [0, 1];
    // Counts that differ between the members (each consistent with its own buffers).
    all_mismatch(
        on_ranks(2, false, |r, comm| {
            let counts = if r == 0 { [2, 1] } else { [2, 2] };
            let send = vec![0u8; counts[r]];
            let mut recv = vec![0u8; counts.iter().sum()];
            comm.all_gather_v(&g, (&send).into(), &counts, (&mut recv).into())
        }),
        "passed counts",
    );
    all_mismatch(
        on_ranks(2, false, |r, comm| {
            let counts = if r == 0 { [4, 4] } else { [4, 8] };
            let send = vec![0u8; counts.iter().sum()];
            let mut recv = vec![0u8; counts[r]];
            comm.reduce_scatter_v(&g, (&send).into(), &counts, (&mut recv).into(), DType::F32, ReduceOp::Sum)
        }),
        "passed counts",
    );
    // Rank 0 sends rank 1 three bytes; rank 1 expects two.
    all_mismatch(
        on_ranks(2, false, |r, comm| {
            let (runs, recv_counts) = if r == 0 { ([1, 3], [1, 1]) } else { ([1, 1], [2, 1]) };
            let send = vec![0u8; runs.iter().sum()];
            let mut recv = vec![0u8; recv_counts.iter().sum()];
            comm.all_to_all_v(&g, (&send).into(), 1, &runs, (&mut recv).into(), &recv_counts)
        }),
        "expects 2 bytes",
    );
}

#[test]
fn bad_arguments_are_typed_errors_before_anything_moves() {
    // Every member makes the same bad call, so none waits for a peer that never comes.
    for padded in [false, true] {
        all_mismatch(
            on_ranks(2, padded, |_, comm| {
                comm.all_gather_v(&[0, 1], (&[0u8; 3]).into(), &[2, 2], (&mut [0u8; 4]).into())
            }),
            "counts[",
        );
        all_mismatch(
            on_ranks(2, padded, |_, comm| comm.all_gather_v(&[0, 1], (&[0u8; 2]).into(), &[2], (&mut [0u8; 2]).into())),
            "1 counts for a group of 2",
        );
        all_mismatch(
            on_ranks(2, padded, |_, comm| {
                comm.reduce_scatter_v(
                    &[0, 1],
                    (&[0u8; 6]).into(),
                    &[3, 3],
                    (&mut [0u8; 3]).into(),
                    DType::F32,
                    ReduceOp::Sum,
                )
            }),
            "whole number",
        );
        all_mismatch(
            on_ranks(2, padded, |_, comm| {
                comm.all_to_all_v(&[0, 1], (&[0u8; 5]).into(), 2, &[1, 1], (&mut [0u8; 4]).into(), &[2, 2])
            }),
            "2 rows of runs",
        );
        all_mismatch(
            on_ranks(2, padded, |_, comm| {
                comm.all_to_all_v(&[0, 1], (&[0u8; 4]).into(), 2, &[1, 1], (&mut [0u8; 3]).into(), &[2, 2])
            }),
            "recv counts add up to 4",
        );
    }
}
