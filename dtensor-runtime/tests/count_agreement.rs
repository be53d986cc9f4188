//! Issue 33, finding 2 (as a class): members of a collective that disagree on a count, a
//! length, an element type, a reduction or a root get a typed error on every member — never
//! `Ok` with wrong data, never a hang — on every backend a CPU runs: the thread backend (which
//! compares what the members publish) and a communicator with only the equal-block
//! collectives, so the trait's padded variable-size defaults run (what NCCL uses; they
//! exchange the counts first). The disagreeing cases keep the totals equal (and, for the
//! padded defaults, the largest blocks), which a check of totals alone would miss. The MPI
//! backend's cases are in `mpi_collectives.rs` (`disagreeing_counts_are_typed_errors`).

mod equal_blocks;

use dtensor_runtime::{run, Along, Communicator, DType, Error, ReduceOp, ThreadWorld};
use equal_blocks::EqualBlocksOnly;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which implementation of the variable-size collectives runs.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Threads,
    PaddedDefaults,
}

const BACKENDS: [Backend; 2] = [Backend::Threads, Backend::PaddedDefaults];

/// Runs `f(rank, comm)` on `n` thread ranks and returns every rank's result. The timeout is
/// generous; a case must still finish far below it (no member waits for one that left).
fn on_ranks<R: Send>(
    n: usize,
    backend: Backend,
    f: impl Fn(usize, &dyn Communicator) -> Result<R, Error> + Sync,
) -> Vec<Result<R, Error>> {
    let world = ThreadWorld::new(n, Duration::from_secs(30));
    let comms: Vec<Arc<dyn Communicator>> = (0..n)
        .map(|r| {
            let c = world.communicator(r).unwrap();
            match backend {
                Backend::Threads => Arc::new(c) as Arc<dyn Communicator>,
                Backend::PaddedDefaults => Arc::new(EqualBlocksOnly(c)),
            }
        })
        .collect();
    let start = Instant::now();
    let out = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let f = &f;
                s.spawn(move || f(r, c.as_ref()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(start.elapsed() < Duration::from_secs(10), "{backend:?}: took {:?}", start.elapsed());
    out
}

/// Every member failed with a typed disagreement error (never `Ok`): a size or count
/// mismatch, or a mismatch of another argument (`field`, when given).
fn all_disagree<R: std::fmt::Debug>(what: &str, results: Vec<Result<R, Error>>, field: Option<&str>) {
    for (r, res) in results.into_iter().enumerate() {
        match (&res, field) {
            (Err(Error::BufferMismatch { .. }), None) => {}
            (Err(Error::CollectiveMismatch { field: f, .. }), Some(want)) if f == want => {}
            _ => panic!("{what}, rank {r}: expected a typed disagreement ({field:?}), got {res:?}"),
        }
    }
}

/// Finding 2: `all_gather_v` whose members' counts differ but add up to the same total (and
/// share the largest count), each member consistent with its own buffers.
#[test]
fn all_gather_v_counts_that_disagree_with_equal_totals() {
    for backend in BACKENDS {
        for views in [vec![vec![2, 1], vec![1, 2]], vec![vec![2, 2, 1], vec![2, 1, 2], vec![2, 2, 1]]] {
            let n = views.len();
            let g: Vec<usize> = (0..n).collect();
            let out = on_ranks(n, backend, |r, comm| {
                let counts = &views[r];
                let send = vec![r as u8 + 1; counts[r]];
                let mut recv = vec![0u8; counts.iter().sum()];
                comm.all_gather_v(&g, (&send).into(), counts, (&mut recv).into()).map(|()| recv)
            });
            all_disagree(&format!("{backend:?} all_gather_v {views:?}"), out, None);
        }
    }
}

/// Finding 2: `reduce_scatter_v` with counts that differ between members, equal totals.
#[test]
fn reduce_scatter_v_counts_that_disagree_with_equal_totals() {
    for backend in BACKENDS {
        for views in [vec![vec![4, 8], vec![8, 4]], vec![vec![8, 4, 4], vec![4, 8, 4], vec![8, 4, 4]]] {
            let n = views.len();
            let g: Vec<usize> = (0..n).collect();
            let out = on_ranks(n, backend, |r, comm| {
                let counts = &views[r];
                let send = vec![0u8; counts.iter().sum()];
                let mut recv = vec![0u8; counts[r]];
                comm.reduce_scatter_v(&g, (&send).into(), counts, (&mut recv).into(), DType::F32, ReduceOp::Sum)
                    .map(|()| recv)
            });
            all_disagree(&format!("{backend:?} reduce_scatter_v {views:?}"), out, None);
        }
    }
}

/// One member's all-to-all-v layout: rows, runs, recv counts.
type Layout = (usize, Vec<usize>, Vec<usize>);

/// One member's side of a collective call.
type Call<'a> = dyn Fn(usize, &dyn Communicator) -> Result<(), Error> + Sync + 'a;

/// Finding 2: `all_to_all_v` where rank 0 sends rank 1 three bytes but rank 1 expects two
/// (and rank 1 sends rank 0 two where it expects three): every member's send and receive
/// totals are equal, only the pairs disagree. Also with many rows of empty runs on one side.
#[test]
fn all_to_all_v_pairs_that_disagree_with_equal_totals() {
    for backend in BACKENDS {
        // (rows, runs, recv counts) of each member.
        let cases: [[Layout; 2]; 2] = [
            [(1, vec![1, 3], vec![1, 2]), (1, vec![3, 1], vec![2, 1])],
            // Rank 0: 2 rows of [1, 1]; rank 1 believes it gets 1 byte from rank 0 and 3 from itself.
            [(2, vec![1, 1], vec![2, 2]), (1, vec![2, 2], vec![1, 3])],
        ];
        for case in &cases {
            let g = [0, 1];
            let out = on_ranks(2, backend, |r, comm| {
                let (rows, runs, recv_counts) = &case[r];
                let send = vec![r as u8 + 1; rows * runs.iter().sum::<usize>()];
                let mut recv = vec![0u8; recv_counts.iter().sum()];
                comm.all_to_all_v(&g, (&send).into(), *rows, runs, (&mut recv).into(), recv_counts).map(|()| recv)
            });
            all_disagree(&format!("{backend:?} all_to_all_v {case:?}"), out, None);
        }
    }
}

/// Finding 2, the equal-block collectives: members whose buffers differ in length (each
/// consistent with itself) all fail, on every collective.
#[test]
fn equal_block_collectives_with_lengths_that_disagree() {
    let g = [0, 1];
    let len = |r: usize| if r == 0 { 8 } else { 4 };
    let cases: Vec<(&str, Box<Call<'_>>)> = vec![
        ("all_gather", Box::new(|r, c| c.all_gather(&g, (&vec![1; len(r)]).into(), (&mut vec![0; 2 * len(r)]).into()))),
        ("all_reduce", Box::new(|r, c| c.all_reduce(&g, (&mut vec![0; len(r)]).into(), DType::F32, ReduceOp::Sum))),
        (
            "all_reduce (large)",
            Box::new(|r, c| c.all_reduce(&g, (&mut vec![0; (1 << 20) * len(r)]).into(), DType::F32, ReduceOp::Sum)),
        ),
        (
            "all_reduce_into",
            Box::new(|r, c| {
                c.all_reduce_into(
                    &g,
                    (&vec![0; len(r)]).into(),
                    (&mut vec![0; len(r)]).into(),
                    DType::F32,
                    ReduceOp::Sum,
                )
            }),
        ),
        (
            "reduce_scatter",
            Box::new(|r, c| {
                c.reduce_scatter(
                    &g,
                    (&vec![0; 2 * len(r)]).into(),
                    (&mut vec![0; len(r)]).into(),
                    DType::F32,
                    ReduceOp::Sum,
                )
            }),
        ),
        ("all_to_all", Box::new(|r, c| c.all_to_all(&g, (&vec![0; len(r)]).into(), (&mut vec![0; len(r)]).into()))),
        (
            // The same bytes split into runs of 2 on one member and of 1 on the other.
            "all_to_all_strided",
            Box::new(|r, c| {
                let (rows, run) = if r == 0 { (2, 2) } else { (4, 1) };
                c.all_to_all_strided(&g, (&[0; 8]).into(), rows, run, (&mut [0; 8]).into())
            }),
        ),
        ("broadcast", Box::new(|r, c| c.broadcast(&g, (&mut vec![0; len(r)]).into(), 0))),
        ("scatter", Box::new(|r, c| c.scatter(&g, (&vec![0; 2 * len(r)]).into(), (&mut vec![0; len(r)]).into(), 0))),
    ];
    for (name, f) in &cases {
        all_disagree(name, on_ranks(2, Backend::Threads, f), None);
    }
}

/// Finding 5 at the backend: element types of equal size (bf16 and f16, i32 and f32),
/// reductions and roots that differ are typed errors on every member of the thread backend
/// (which compares them itself, with or without the fingerprint check), never each member's
/// own reading of the bytes.
#[test]
fn element_types_reductions_and_roots_that_disagree() {
    let g = [0, 1];
    let pairs = [(DType::BF16, DType::F16), (DType::F32, DType::I32), (DType::F64, DType::I64)];
    for (a, b) in pairs {
        for len in [8, 1 << 20] {
            let out = on_ranks(2, Backend::Threads, |r, c| {
                c.all_reduce(&g, (&mut vec![0; len]).into(), if r == 0 { a } else { b }, ReduceOp::Sum)
            });
            all_disagree(&format!("all_reduce {a} vs {b}"), out, Some("dtype"));
        }
        let out = on_ranks(2, Backend::Threads, |r, c| {
            c.reduce_scatter(&g, (&[0; 16]).into(), (&mut [0; 8]).into(), if r == 0 { a } else { b }, ReduceOp::Max)
        });
        all_disagree(&format!("reduce_scatter {a} vs {b}"), out, Some("dtype"));
        for backend in BACKENDS {
            let out = on_ranks(2, backend, |r, c| {
                let dtype = if r == 0 { a } else { b };
                c.reduce_scatter_v(&g, (&[0; 16]).into(), &[8, 8], (&mut [0; 8]).into(), dtype, ReduceOp::Sum)
            });
            all_disagree(&format!("{backend:?} reduce_scatter_v {a} vs {b}"), out, Some("dtype"));
        }
    }
    let out = on_ranks(2, Backend::Threads, |r, c| {
        c.all_reduce(&g, (&mut [0; 8]).into(), DType::F32, if r == 0 { ReduceOp::Sum } else { ReduceOp::Max })
    });
    all_disagree("all_reduce sum vs max", out, Some("reduce op"));
    let out = on_ranks(2, Backend::Threads, |r, c| c.broadcast(&g, (&mut [r as u8; 4]).into(), r));
    all_disagree("broadcast from two roots", out, Some("root"));
    let out = on_ranks(2, Backend::Threads, |r, c| c.scatter(&g, (&[r as u8; 8]).into(), (&mut [0; 4]).into(), r));
    all_disagree("scatter from two roots", out, Some("root"));
}

/// The same calls with every member agreeing still succeed with the right data (the checks
/// reject only disagreement).
#[test]
fn agreeing_members_still_get_the_right_data() {
    for backend in BACKENDS {
        let g = [0, 1, 2];
        let counts = [2, 0, 3];
        let out = on_ranks(3, backend, |r, comm| {
            let send = vec![r as u8 + 1; counts[r]];
            let mut recv = vec![0u8; 5];
            comm.all_gather_v(&g, (&send).into(), &counts, (&mut recv).into()).map(|()| recv)
        });
        for got in out {
            assert_eq!(got.unwrap(), vec![1, 1, 3, 3, 3], "{backend:?}");
        }
        let out = on_ranks(3, backend, |r, comm| {
            // Member i sends member j (i + j) % 3 bytes of value 10 i + j, in 1 row.
            let runs: Vec<usize> = (0..3).map(|j| (r + j) % 3).collect();
            let send: Vec<u8> = (0..3).flat_map(|j| vec![(10 * r + j) as u8; runs[j]]).collect();
            let recv_counts: Vec<usize> = (0..3).map(|i| (i + r) % 3).collect();
            let mut recv = vec![0u8; recv_counts.iter().sum()];
            comm.all_to_all_v(&g, (&send).into(), 1, &runs, (&mut recv).into(), &recv_counts).map(|()| recv)
        });
        for (j, got) in out.into_iter().enumerate() {
            let want: Vec<u8> = (0..3).flat_map(|i| vec![(10 * i + j) as u8; (i + j) % 3]).collect();
            assert_eq!(got.unwrap(), want, "{backend:?} rank {j}");
        }
    }
}

/// A member whose own arguments are bad while its peers' are fine: with the padded defaults it
/// still takes part in the agreement, so every member fails at once (its peers name it); on
/// the thread backend its peers fail as soon as it leaves (`PeerFailed`). Never `Ok`.
#[test]
fn one_member_with_bad_arguments_fails_every_member() {
    let out = on_ranks(2, Backend::PaddedDefaults, |r, comm| {
        let send = vec![0u8; if r == 0 { 3 } else { 2 }];
        comm.all_gather_v(&[0, 1], (&send).into(), &[2, 2], (&mut [0u8; 4]).into())
    });
    all_disagree("padded all_gather_v, rank 0's send too long", out, None);
    let out = on_ranks(2, Backend::PaddedDefaults, |r, comm| {
        let recv_counts = if r == 0 { vec![1] } else { vec![1, 1] };
        comm.all_to_all_v(&[0, 1], (&[0u8; 2]).into(), 1, &[1, 1], (&mut [0u8; 2]).into(), &recv_counts)
    });
    all_disagree("padded all_to_all_v, rank 0's recv counts too few", out, None);
    let err = run(2, |ctx| {
        let send = vec![0u8; if ctx.rank() == 0 { 3 } else { 2 }];
        ctx.comm().all_gather_v(&[0, 1], (&send).into(), &[2, 2], (&mut [0u8; 4]).into())
    })
    .unwrap_err();
    assert!(matches!(err, Error::BufferMismatch { .. }), "{err:?}");
}

/// Through the typed mesh collectives with the fingerprint check off (the default): the
/// backend's own comparison still fails every member of an uneven all-gather whose counts
/// disagree with equal totals.
#[test]
fn mesh_collectives_with_the_check_off_fail_on_disagreeing_counts() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        assert!(!mesh.collective_checks());
        let counts = if ctx.rank() == 0 { [2, 1] } else { [1, 2] };
        let mine = vec![ctx.rank() as f32; 2];
        Ok(mesh.all_gather_v(Along::Dim(0), &mine, &counts))
    })
    .unwrap();
    all_disagree("mesh all_gather_v", out, None);
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let (runs, recv) = if ctx.rank() == 0 { ([1, 3], [1, 2]) } else { ([3, 1], [2, 1]) };
        Ok(mesh.all_to_all_v(Along::Dim(0), &[1.0f64; 4], 1, &runs, &recv))
    })
    .unwrap();
    all_disagree("mesh all_to_all_v", out, None);
}
