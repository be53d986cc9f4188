//! The copy-saving paths of redistribution, each against the single-rank result: Shard(d) →
//! Shard(e) as one strided all-to-all when both dims split evenly (and the packed fallback
//! when not, or when shards are empty), Partial → Replicate reduced straight from a borrowed
//! shard or in place on an owned one, and the backend methods behind them, including the
//! trait's default implementations that the MPI and NCCL backends use.

mod common;

use common::{expected_shard, global};
use dtensor_runtime::comm::{Communicator, HostCollectives, RecvBuf};
use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::{
    distribute_tensor, from_local, run, CollectiveKind, CommDebugMode, DType, Error, FromLocal, Partial, Placement,
    ReduceOp, Replicate as R, Result, Shard as S, ThreadComm, ThreadWorld,
};
use std::sync::Arc;
use std::time::Duration;

/// Redistributes `g` (distributed as `from`) to `to` on `mesh_shape`; every rank's shard must
/// be the slice of `g` that `to` gives it, and the step must be one all-to-all.
fn check_shard_to_shard(mesh_shape: &[usize], shape: &[usize], from: &[Placement], to: &[Placement]) {
    let g = global(shape, 3);
    let world: usize = mesh_shape.iter().product();
    let out = run(world, |ctx| {
        let mesh = ctx.init_device_mesh(mesh_shape, &[])?;
        let x = distribute_tensor(&g, &mesh, from, None)?;
        let debug = CommDebugMode::new();
        let y = {
            let _on = debug.enter();
            x.redistribute(to)?
        };
        Ok((mesh.coordinate().to_vec(), y.to_local().to_host()?, debug.count(CollectiveKind::AllToAll)))
    })
    .unwrap();
    for (coord, local, all_to_all) in out {
        assert_eq!(local, expected_shard(&g, mesh_shape, &coord, to), "{shape:?} {from:?} -> {to:?} at {coord:?}");
        assert_eq!(all_to_all, 1, "{shape:?} {from:?} -> {to:?}: one all-to-all");
    }
}

#[test]
fn shard_to_shard_even_uneven_and_empty() {
    // Even on both dims (strided all-to-all), leading and trailing target dims.
    check_shard_to_shard(&[2], &[4, 8], &[S(0)], &[S(1)]);
    check_shard_to_shard(&[2], &[4, 8], &[S(1)], &[S(0)]);
    check_shard_to_shard(&[4], &[8, 4, 12], &[S(0)], &[S(2)]);
    check_shard_to_shard(&[3], &[6, 3, 9], &[S(2)], &[S(1)]);
    check_shard_to_shard(&[2], &[2, 6, 4], &[S(1)], &[S(2)]);
    // Uneven on either dim (one variable-size all-to-all, unpadded), leading and trailing
    // target dims, and dims before the source dim (the received blocks then interleave).
    check_shard_to_shard(&[2], &[5, 8], &[S(0)], &[S(1)]);
    check_shard_to_shard(&[2], &[4, 7], &[S(0)], &[S(1)]);
    check_shard_to_shard(&[4], &[3, 6], &[S(0)], &[S(1)]);
    check_shard_to_shard(&[3], &[7, 5], &[S(1)], &[S(0)]);
    check_shard_to_shard(&[2], &[3, 5, 3], &[S(1)], &[S(2)]);
    check_shard_to_shard(&[3], &[4, 5, 7], &[S(2)], &[S(0)]);
    check_shard_to_shard(&[4], &[2, 7, 3, 5], &[S(3)], &[S(1)]);
    check_shard_to_shard(&[2, 3], &[5, 7, 4], &[S(0), S(1)], &[S(0), S(2)]);
    // Empty: zero-sized dims (even: 0 splits into empty chunks) and empty shards.
    check_shard_to_shard(&[2], &[0, 8], &[S(0)], &[S(1)]);
    check_shard_to_shard(&[2], &[4, 0, 3], &[S(0)], &[S(1)]);
    check_shard_to_shard(&[4], &[2, 8], &[S(0)], &[S(1)]);
    // Nested: the inner mesh dim moves its split while the outer one keeps its own.
    check_shard_to_shard(&[2, 2], &[4, 8, 4], &[S(0), S(1)], &[S(0), S(2)]);
    check_shard_to_shard(&[2, 2], &[4, 6, 4], &[S(2), S(0)], &[S(2), S(1)]);
}

#[test]
fn partial_to_replicate_from_borrowed_and_owned_shards() {
    // Small (one rendezvous) and large (> 64 KiB: reduced by ranges) buffers, every op.
    for shape in [vec![3, 5], vec![130, 70]] {
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product] {
            let n = 3;
            let locals: Vec<ArrayD<f64>> = (0..n).map(|r| global(&shape, r as u64).mapv(|v| v / 16.0)).collect();
            let mut want = locals[0].clone();
            for l in &locals[1..] {
                want.zip_mut_with(l, |a, &b| {
                    *a = match op {
                        ReduceOp::Sum | ReduceOp::Avg => *a + b,
                        ReduceOp::Max => a.max(b),
                        ReduceOp::Min => a.min(b),
                        ReduceOp::Product => *a * b,
                    }
                });
            }
            if op == ReduceOp::Avg {
                want.mapv_inplace(|v| v / n as f64);
            }
            let out = run(n, |ctx| {
                let mesh = ctx.init_device_mesh(&[n], &[])?;
                let x = from_local(locals[ctx.rank()].clone(), &mesh, &[Partial(op)], FromLocal::default())?;
                // First step: reads the caller's shard (borrowed).
                let borrowed = x.redistribute(&[R])?.to_local().to_host()?;
                // The input is left as it was.
                assert_eq!(x.to_local().to_host()?, locals[ctx.rank()]);
                Ok(borrowed)
            })
            .unwrap();
            for got in out {
                let close = got.iter().zip(want.iter()).all(|(a, b)| (a - b).abs() <= 1e-9 * b.abs().max(1.0));
                assert!(close, "{shape:?} {op}");
            }
        }
    }
    // Second step of a plan (an owned buffer, reduced in place): [P, S(0)] -> [R, R].
    let g = global(&[6, 40], 5);
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &[])?;
        let x = distribute_tensor(&g, &mesh, &[R, S(0)], None)?.redistribute(&[Partial(ReduceOp::Sum), S(0)])?;
        x.redistribute(&[R, R])?.to_local().to_host()
    })
    .unwrap();
    out.iter().for_each(|l| assert_eq!(l, &g));
}

/// Forwards the required methods only, so that the trait's default `all_reduce_into` and
/// `all_to_all_strided` run (as on the MPI and NCCL backends).
#[derive(Debug)]
struct Defaults(ThreadComm);

// SAFETY: every collective forwards to the thread backend, which upholds the contract.
unsafe impl HostCollectives for Defaults {
    fn rank(&self) -> usize {
        HostCollectives::rank(&self.0)
    }
    fn world_size(&self) -> usize {
        HostCollectives::world_size(&self.0)
    }
    fn backend(&self) -> &'static str {
        "defaults"
    }
    fn all_gather(&self, g: &[usize], send: &[u8], recv: RecvBuf<'_>) -> Result<()> {
        HostCollectives::all_gather(&self.0, g, send, recv)
    }
    fn all_reduce(&self, g: &[usize], buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        HostCollectives::all_reduce(&self.0, g, buf, dtype, op)
    }
    fn reduce_scatter(&self, g: &[usize], send: &[u8], recv: RecvBuf<'_>, dtype: DType, op: ReduceOp) -> Result<()> {
        HostCollectives::reduce_scatter(&self.0, g, send, recv, dtype, op)
    }
    fn all_to_all(&self, g: &[usize], send: &[u8], recv: RecvBuf<'_>) -> Result<()> {
        HostCollectives::all_to_all(&self.0, g, send, recv)
    }
    fn broadcast(&self, g: &[usize], buf: &mut [u8], root: usize) -> Result<()> {
        HostCollectives::broadcast(&self.0, g, buf, root)
    }
    fn scatter(&self, g: &[usize], send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        HostCollectives::scatter(&self.0, g, send, recv, root)
    }
    fn barrier(&self, g: &[usize]) -> Result<()> {
        HostCollectives::barrier(&self.0, g)
    }
}

/// Runs `f(rank, comm)` on `n` threads, once with the thread backend's own methods and once
/// with the trait defaults; returns both runs' results by rank.
fn both_backends<R: Send>(n: usize, f: impl Fn(usize, &dyn Communicator) -> R + Sync) -> [Vec<R>; 2] {
    [false, true].map(|defaults| {
        let world = ThreadWorld::new(n, Duration::from_secs(20));
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let (world, f) = (Arc::clone(&world), &f);
                    s.spawn(move || {
                        let c = world.communicator(r).unwrap();
                        if defaults {
                            f(r, &Defaults(c))
                        } else {
                            f(r, &c)
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    })
}

#[test]
fn strided_all_to_all_matches_packed_blocks() {
    for (n, rows, run) in [(2usize, 3usize, 2usize), (3, 4, 1), (4, 1, 5), (3, 0, 2), (2, 3, 0), (1, 2, 3)] {
        let group: Vec<usize> = (0..n).collect();
        let send = |r: usize| -> Vec<u8> { (0..rows * n * run).map(|i| (i * 7 + r * 31) as u8).collect() };
        let results = both_backends(n, |r, c| {
            let mut recv = vec![0u8; rows * n * run];
            c.all_to_all_strided(&group, (&send(r)).into(), rows, run, (&mut recv).into()).map(|()| recv)
        });
        for got in results {
            for (me, recv) in got.into_iter().enumerate() {
                // Block j: run `me` of every row of member j's send.
                let want: Vec<u8> = (0..n)
                    .flat_map(|j| {
                        let s = send(j);
                        (0..rows).flat_map(move |row| s[(row * n + me) * run..(row * n + me + 1) * run].to_vec())
                    })
                    .collect();
                assert_eq!(recv.unwrap(), want, "n {n} rows {rows} run {run} member {me}");
            }
        }
    }
    // A layout that does not tile the buffer is an error on every member, not a panic.
    for got in
        both_backends(2, |_, c| c.all_to_all_strided(&[0, 1], (&[0u8; 10]).into(), 2, 3, (&mut [0u8; 10]).into()))
    {
        got.into_iter().for_each(|r| assert!(matches!(r, Err(Error::BufferMismatch { .. })), "{r:?}"));
    }
    // Members that split the same bytes into different runs: an error on every member of the
    // thread backend (the default packs locally and cannot tell).
    let [threads, _] = both_backends(2, |r, c| {
        let (rows, run) = if r == 0 { (3, 2) } else { (2, 3) };
        c.all_to_all_strided(&[0, 1], (&[0u8; 12]).into(), rows, run, (&mut [0u8; 12]).into())
    });
    threads.into_iter().for_each(|r| assert!(matches!(r, Err(Error::BufferMismatch { .. })), "{r:?}"));
}

#[test]
fn out_of_place_all_reduce_matches_in_place() {
    // 5 f64 (small path) and 20 000 f64 (ranges, uneven over 3 members).
    for len in [5usize, 20_000] {
        let n = 3;
        let group: Vec<usize> = (0..n).collect();
        let input = |r: usize| -> Vec<f64> { (0..len).map(|i| ((i * 13 + r * 7) % 29) as f64 - 14.0).collect() };
        let results = both_backends(n, |r, c| {
            let send = input(r);
            let mut recv = vec![0f64; len];
            let mut inplace = send.clone();
            let into = bytemuck::cast_slice_mut::<f64, u8>(&mut recv).into();
            c.all_reduce_into(&group, bytemuck::cast_slice(&send).into(), into, DType::F64, ReduceOp::Sum)?;
            c.all_reduce(&group, bytemuck::cast_slice_mut(&mut inplace).into(), DType::F64, ReduceOp::Sum)?;
            Ok::<_, Error>((send == input(r), recv, inplace))
        });
        let want: Vec<f64> = (0..len).map(|i| (0..n).map(|r| input(r)[i]).sum()).collect();
        for got in results {
            for res in got {
                let (untouched, recv, inplace) = res.unwrap();
                assert!(untouched, "all_reduce_into leaves its input as it was");
                assert_eq!(recv, want, "len {len}");
                assert_eq!(inplace, want, "len {len}");
            }
        }
    }
    // Lengths that differ between send and recv are an error, not a panic.
    for got in both_backends(2, |_, c| {
        c.all_reduce_into(&[0, 1], (&[0u8; 8]).into(), (&mut [0u8; 4]).into(), DType::F32, ReduceOp::Sum)
    }) {
        got.into_iter().for_each(|r| assert!(matches!(r, Err(Error::BufferMismatch { .. })), "{r:?}"));
    }
}

/// Uneven Shard → Replicate and Partial → Shard on the host: one variable-size collective
/// each, which moves every shard unpadded, so the bytes recorded are the shard's own (and what
/// the plan says); values against the single-rank result, empty shards included.
#[test]
fn uneven_gather_and_reduce_scatter_move_shards_unpadded() {
    let cases: &[(&[usize], &[usize], usize)] = &[
        (&[3], &[7, 3], 0),
        (&[4], &[2, 5, 3], 1),
        (&[2], &[3, 4, 5], 2),
        (&[4], &[3, 2], 0),
        (&[2, 3], &[5, 8, 4], 1),
    ];
    for &(mesh_shape, shape, d) in cases {
        let g = global(shape, 5);
        let world: usize = mesh_shape.iter().product();
        let inner = mesh_shape.len() - 1;
        // The inner mesh dim splits `d` (the outer one, if any, dim 0 or 2).
        let mut sharded: Vec<Placement> = vec![R; mesh_shape.len()];
        sharded[inner] = S(d as isize);
        if inner > 0 {
            sharded[0] = S(if d == 0 { 2 } else { 0 });
        }
        let mut replicated = sharded.clone();
        replicated[inner] = R;
        let out = run(world, |ctx| {
            let mesh = ctx.init_device_mesh(mesh_shape, &[])?;
            let x = distribute_tensor(&g, &mesh, &sharded, None)?;
            let mut records = Vec::new();
            let mut check = |from: &dtensor_runtime::DTensor<f64>, to: &[Placement]| -> Result<_> {
                let plan = from.plan_redistribute(to)?;
                let debug = CommDebugMode::new();
                let y = debug.scope(|| from.redistribute(to))?;
                let recorded: Vec<_> = debug.records().iter().map(|r| (r.kind, r.bytes)).collect();
                let planned: Vec<_> = plan.steps.iter().map(|s| (s.collective.unwrap(), s.bytes)).collect();
                records.push((recorded, planned, from.to_local().len() * 8));
                Ok(y)
            };
            let gathered = check(&x, &replicated)?;
            // Partial → Shard: every rank holds a third/quarter... of the value, summed back.
            let parts = gathered.redistribute(&with_partial(&replicated, inner))?;
            let scattered = check(&parts, &sharded)?;
            Ok((mesh.coordinate().to_vec(), gathered.to_local().to_host()?, scattered.to_local().to_host()?, records))
        })
        .unwrap();
        for (coord, gathered, scattered, records) in out {
            let at = format!("{mesh_shape:?} {shape:?} dim {d} at {coord:?}");
            assert_eq!(gathered, expected_shard(&g, mesh_shape, &coord, &replicated), "{at}");
            assert_eq!(scattered, expected_shard(&g, mesh_shape, &coord, &sharded), "{at}");
            let kinds = [CollectiveKind::AllGather, CollectiveKind::ReduceScatter];
            for ((recorded, planned, shard_bytes), kind) in records.into_iter().zip(kinds) {
                assert_eq!(recorded, vec![(kind, shard_bytes)], "{at}: one {kind} of the unpadded shard");
                assert_eq!(recorded, planned, "{at}: the plan says what is recorded");
            }
        }
    }
}

/// `placements` with mesh dim `i` made `Partial(sum)` (Replicate → Partial is local).
fn with_partial(placements: &[Placement], i: usize) -> Vec<Placement> {
    let mut p = placements.to_vec();
    p[i] = Partial(ReduceOp::Sum);
    p
}

/// Issue 32 (size-1 mesh dim shortcut, PyTorch's `num_chunks == 1` in
/// `redistribute_local_tensor`): on a mesh dim of one rank every transition is the identity, so
/// no collective is issued or recorded, and the plan says so (local steps, 0 bytes). Tries every
/// source/target pair of {R, S(0), S(1), P(sum), P(max)} that is a legal redistribution, on the
/// size-1 dim of meshes [1], [1, 2], [2, 1] and [2, 1, 3] (the other dims Shard(1) or Replicate),
/// on a [5, 3] tensor (uneven over 2 and 3): 3 x 16 pairs x up to 2 layouts of the other dims.
/// Values: the shard is unchanged, and matches the single-rank result (for a Partial target,
/// its full tensor does).
#[test]
fn size_one_mesh_dim_issues_no_collective() {
    let shape = [5, 3];
    let g = global(&shape, 11);
    let choices = [R, S(0), S(1), Partial(ReduceOp::Sum), Partial(ReduceOp::Max)];
    let meshes: &[(&[usize], usize)] = &[(&[1], 0), (&[1, 2], 0), (&[2, 1], 1), (&[2, 1, 3], 1)];
    let mut tried = 0;
    for &(mesh_shape, j) in meshes {
        for other in [R, S(1)] {
            if mesh_shape.len() == 1 && other != R {
                continue;
            }
            for from_j in choices {
                for to_j in choices {
                    let legal = from_j != to_j
                        && !(from_j.is_partial() && to_j.is_partial())
                        && !(from_j.shard_dim().is_some() && to_j == Partial(ReduceOp::Max));
                    if !legal {
                        continue;
                    }
                    let mut from = vec![other; mesh_shape.len()];
                    from[j] = from_j;
                    let mut to = from.clone();
                    to[j] = to_j;
                    check_size_one(&g, mesh_shape, &from, &to);
                    tried += 1;
                }
            }
        }
    }
    assert_eq!(tried, 16 * 7, "every legal pair on every mesh and layout");
}

fn check_size_one(g: &ArrayD<f64>, mesh_shape: &[usize], from: &[Placement], to: &[Placement]) {
    let world: usize = mesh_shape.iter().product();
    let at = format!("{mesh_shape:?} {from:?} -> {to:?}");
    let out = run(world, |ctx| {
        let mesh = ctx.init_device_mesh(mesh_shape, &[])?;
        // A Partial source: distribute without it, then make it Partial (local).
        let plain: Vec<Placement> = from.iter().map(|p| if p.is_partial() { R } else { *p }).collect();
        let x = distribute_tensor(g, &mesh, &plain, None)?.redistribute(from)?;
        let plan = x.plan_redistribute(to)?;
        let debug = CommDebugMode::new();
        let y = debug.scope(|| x.redistribute(to))?;
        let full = y.full_tensor()?;
        let planned = (plan.steps.len(), plan.num_collectives(), plan.bytes(), plan.wire_bytes());
        let locals = (x.to_local().to_host()?, y.to_local().to_host()?);
        Ok((mesh.coordinate().to_vec(), locals, full, debug.total(), planned))
    })
    .unwrap();
    for (coord, (before, after), full, recorded, (steps, collectives, bytes, wire)) in out {
        assert_eq!(recorded, 0, "{at} at {coord:?}: no collective on a size-1 mesh dim");
        assert_eq!((steps, collectives, bytes, wire), (1, 0, 0, 0), "{at} at {coord:?}: one local step");
        assert_eq!(after, before, "{at} at {coord:?}: the shard is unchanged");
        if !to.iter().any(|p| p.is_partial()) {
            assert_eq!(after, expected_shard(g, mesh_shape, &coord, to), "{at} at {coord:?}");
        }
        assert_eq!(&full, g, "{at} at {coord:?}: the full tensor");
    }
}
