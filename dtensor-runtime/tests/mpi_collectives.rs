//! MPI suite 1: every collective of the MPI `Communicator` against values computed
//! independently on each rank, over the world, prepared mesh-dim groups, and groups that were
//! never prepared (created lazily). Run under `mpirun -np 4` (scripts/mpi-tests.sh).

mod mpi_harness;

use dtensor_runtime::{bf16, f16, launch, Along, DType, Error, Launch, RankCtx, ReduceOp};
use mpi_harness::{fail, Outcome, TestFn};
use std::time::{Duration, Instant};

const OPS: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product];

/// Value rank `r` contributes at element `i` in `dtype` (small multiples of 1/2: exact sums/products in
/// every dtype, bf16 and f16 included, which MPI reduces by gathering and folding locally;
/// whole numbers for the integers, non-negative and small enough for u8's products).
fn val(dtype: DType, r: usize, i: usize) -> f64 {
    match dtype {
        DType::U8 => ((r * 7 + i * 3) % 4) as f64,
        DType::I64 | DType::I32 => ((r * 7 + i * 3) % 5) as f64 - 2.0,
        _ => ((r * 7 + i * 3) % 5) as f64 - 2.0 + (r % 2) as f64 * 0.5,
    }
}

/// Whether `op` is defined on `dtype` (the average of integers is refused, as PyTorch does).
fn defined(dtype: DType, op: ReduceOp) -> bool {
    dtype.is_float() || op != ReduceOp::Avg
}

fn fold(op: ReduceOp, xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    match op {
        ReduceOp::Sum => v.iter().sum(),
        ReduceOp::Avg => v.iter().sum::<f64>() / v.len() as f64,
        ReduceOp::Min => v.iter().cloned().fold(f64::INFINITY, f64::min),
        ReduceOp::Max => v.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Product => v.iter().product(),
    }
}

fn to_bytes(dtype: DType, xs: &[f64]) -> Vec<u8> {
    match dtype {
        DType::F32 => xs.iter().flat_map(|&x| (x as f32).to_ne_bytes()).collect(),
        DType::F64 => xs.iter().flat_map(|&x| x.to_ne_bytes()).collect(),
        DType::BF16 => xs.iter().flat_map(|&x| bf16::from_f64(x).to_ne_bytes()).collect(),
        DType::F16 => xs.iter().flat_map(|&x| f16::from_f64(x).to_ne_bytes()).collect(),
        DType::I64 => xs.iter().flat_map(|&x| (x as i64).to_ne_bytes()).collect(),
        DType::I32 => xs.iter().flat_map(|&x| (x as i32).to_ne_bytes()).collect(),
        DType::U8 => xs.iter().map(|&x| x as u8).collect(),
    }
}

fn from_bytes(dtype: DType, b: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F32 => b.chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap()) as f64).collect(),
        DType::F64 => b.chunks(8).map(|c| f64::from_ne_bytes(c.try_into().unwrap())).collect(),
        DType::BF16 => b.chunks(2).map(|c| bf16::from_ne_bytes(c.try_into().unwrap()).to_f64()).collect(),
        DType::F16 => b.chunks(2).map(|c| f16::from_ne_bytes(c.try_into().unwrap()).to_f64()).collect(),
        DType::I64 => b.chunks(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap()) as f64).collect(),
        DType::I32 => b.chunks(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap()) as f64).collect(),
        DType::U8 => b.iter().map(|&x| x as f64).collect(),
    }
}

fn close(got: &[f64], want: &[f64], what: &str) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, expected {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(a, b)| (a - b).abs() > 1e-5 * (1.0 + b.abs())) {
        Some(i) => Err(format!("{what}: element {i} is {} but expected {}", got[i], want[i])),
        None => Ok(()),
    }
}

/// The groups every test runs over: the world, its reverse (never prepared: lazy
/// MPI_Comm_create_group), and the parity classes of the ranks (never prepared either).
fn groups(ctx: &RankCtx) -> Vec<Vec<usize>> {
    let n = ctx.world_size();
    let me = ctx.rank();
    let world: Vec<usize> = (0..n).collect();
    let reverse: Vec<usize> = (0..n).rev().collect();
    let parity: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).collect();
    vec![world, reverse, parity]
}

fn all_reduce_every_op(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    for g in groups(ctx) {
        for dtype in DType::ALL {
            for op in OPS {
                let len = 7;
                let mine: Vec<f64> = (0..len).map(|i| val(dtype, ctx.rank(), i)).collect();
                let mut buf = to_bytes(dtype, &mine);
                let r = c.all_reduce(&g, (&mut buf).into(), dtype, op);
                if !defined(dtype, op) {
                    match r {
                        Err(Error::Unsupported { .. }) => continue,
                        other => return Err(format!("all_reduce {op:?} {dtype}: {other:?}, expected Unsupported")),
                    }
                }
                r.map_err(fail)?;
                let want: Vec<f64> = (0..len).map(|i| fold(op, g.iter().map(|&r| val(dtype, r, i)))).collect();
                close(&from_bytes(dtype, &buf), &want, &format!("all_reduce {op:?} {dtype} on {g:?}"))?;
            }
        }
    }
    Ok(Outcome::Pass)
}

fn reduce_scatter_every_op(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    for g in groups(ctx) {
        let n = g.len();
        let me = g.iter().position(|&r| r == ctx.rank()).unwrap();
        let block = 3;
        for dtype in DType::ALL {
            for op in OPS {
                let mine: Vec<f64> = (0..block * n).map(|i| val(dtype, ctx.rank(), i)).collect();
                let send = to_bytes(dtype, &mine);
                let mut recv = vec![0u8; send.len() / n];
                let r = c.reduce_scatter(&g, (&send).into(), (&mut recv).into(), dtype, op);
                if !defined(dtype, op) {
                    match r {
                        Err(Error::Unsupported { .. }) => continue,
                        other => return Err(format!("reduce_scatter {op:?} {dtype}: {other:?}, expected Unsupported")),
                    }
                }
                r.map_err(fail)?;
                let want: Vec<f64> =
                    (me * block..(me + 1) * block).map(|i| fold(op, g.iter().map(|&r| val(dtype, r, i)))).collect();
                close(&from_bytes(dtype, &recv), &want, &format!("reduce_scatter {op:?} {dtype} on {g:?}"))?;
            }
        }
    }
    Ok(Outcome::Pass)
}

/// Byte pattern of (sender, block, byte index) so misrouted blocks are visible.
fn pat(from: usize, block: usize, k: usize) -> u8 {
    (from * 31 + block * 7 + k) as u8
}

fn all_gather_in_group_order(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    for g in groups(ctx) {
        let l = 5;
        let send: Vec<u8> = (0..l).map(|k| pat(ctx.rank(), 0, k)).collect();
        let mut recv = vec![0u8; l * g.len()];
        c.all_gather(&g, (&send).into(), (&mut recv).into()).map_err(fail)?;
        let want: Vec<u8> = g.iter().flat_map(|&r| (0..l).map(move |k| pat(r, 0, k))).collect();
        if recv != want {
            return Err(format!("all_gather on {g:?}: got {recv:?}, expected {want:?}"));
        }
    }
    Ok(Outcome::Pass)
}

fn all_to_all_routes_blocks(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    for g in groups(ctx) {
        let n = g.len();
        let me = g.iter().position(|&r| r == ctx.rank()).unwrap();
        let l = 4;
        let send: Vec<u8> = (0..n).flat_map(|j| (0..l).map(move |k| pat(me, j, k))).collect();
        let mut recv = vec![0u8; send.len()];
        c.all_to_all(&g, (&send).into(), (&mut recv).into()).map_err(fail)?;
        let want: Vec<u8> = (0..n).flat_map(|i| (0..l).map(move |k| pat(i, me, k))).collect();
        if recv != want {
            return Err(format!("all_to_all on {g:?}: got {recv:?}, expected {want:?}"));
        }
    }
    Ok(Outcome::Pass)
}

/// Uneven counts of a group of `n` (member `i`'s), zeros included; `k` varies them.
fn uneven_counts(n: usize, k: usize) -> Vec<usize> {
    (0..n).map(|i| (i * 3 + k) % 4).collect()
}

/// The variable-size collectives: MPI_Allgatherv, MPI_Alltoallv (rows of runs packed first)
/// and the padded reduce-scatter, with empty blocks and members with nothing at all.
fn variable_size_collectives(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    for g in groups(ctx) {
        let n = g.len();
        let me = g.iter().position(|&r| r == ctx.rank()).unwrap();
        for k in 0..3 {
            let counts = uneven_counts(n, k);
            let send: Vec<u8> = (0..counts[me]).map(|b| pat(me, 0, b)).collect();
            let mut recv = vec![0u8; counts.iter().sum()];
            c.all_gather_v(&g, (&send).into(), &counts, (&mut recv).into()).map_err(fail)?;
            let want: Vec<u8> = (0..n).flat_map(|i| (0..counts[i]).map(move |b| pat(i, 0, b))).collect();
            if recv != want {
                return Err(format!("all_gather_v {counts:?} on {g:?}: got {recv:?}, expected {want:?}"));
            }
            for dtype in [DType::F32, DType::I64, DType::BF16] {
                let total: usize = counts.iter().sum();
                let mine: Vec<f64> = (0..total).map(|i| val(dtype, ctx.rank(), i)).collect();
                let es = dtype.size_of();
                let bytes: Vec<usize> = counts.iter().map(|x| x * es).collect();
                let mut recv = vec![0u8; bytes[me]];
                c.reduce_scatter_v(
                    &g,
                    (&to_bytes(dtype, &mine)).into(),
                    &bytes,
                    (&mut recv).into(),
                    dtype,
                    ReduceOp::Sum,
                )
                .map_err(fail)?;
                let at: usize = counts[..me].iter().sum();
                let want: Vec<f64> =
                    (at..at + counts[me]).map(|i| fold(ReduceOp::Sum, g.iter().map(|&r| val(dtype, r, i)))).collect();
                close(&from_bytes(dtype, &recv), &want, &format!("reduce_scatter_v {dtype} {counts:?} on {g:?}"))?;
            }
            // Member i: rows (i + k) % 3, run for member j (i + j + k) % 3 bytes.
            let rows = |i: usize| (i + k) % 3;
            let run = |i: usize, j: usize| (i + j + k) % 3;
            let mut send = Vec::new();
            for r in 0..rows(me) {
                for j in 0..n {
                    send.extend((0..run(me, j)).map(|b| pat(me, j, r * 3 + b)));
                }
            }
            let runs: Vec<usize> = (0..n).map(|j| run(me, j)).collect();
            let recv_counts: Vec<usize> = (0..n).map(|i| rows(i) * run(i, me)).collect();
            let mut recv = vec![0u8; recv_counts.iter().sum()];
            c.all_to_all_v(&g, (&send).into(), rows(me), &runs, (&mut recv).into(), &recv_counts).map_err(fail)?;
            let want: Vec<u8> = (0..n)
                .flat_map(|i| (0..rows(i)).flat_map(move |r| (0..run(i, me)).map(move |b| pat(i, me, r * 3 + b))))
                .collect();
            if recv != want {
                return Err(format!("all_to_all_v (k {k}) on {g:?}: got {recv:?}, expected {want:?}"));
            }
        }
    }
    Ok(Outcome::Pass)
}

fn broadcast_from_every_root(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    for g in groups(ctx) {
        for root in 0..g.len() {
            let mut buf: Vec<u8> = (0..6).map(|k| pat(ctx.rank(), root, k)).collect();
            c.broadcast(&g, (&mut buf).into(), root).map_err(fail)?;
            let want: Vec<u8> = (0..6).map(|k| pat(g[root], root, k)).collect();
            if buf != want {
                return Err(format!("broadcast root {root} on {g:?}: got {buf:?}, expected {want:?}"));
            }
        }
    }
    Ok(Outcome::Pass)
}

fn scatter_from_every_root(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    for g in groups(ctx) {
        let n = g.len();
        let me = g.iter().position(|&r| r == ctx.rank()).unwrap();
        for root in 0..n {
            let l = 3;
            // Only the root's send matters; others pass garbage of another length.
            let send: Vec<u8> =
                if me == root { (0..n).flat_map(|j| (0..l).map(move |k| pat(root, j, k))).collect() } else { vec![9] };
            let mut recv = vec![0u8; l];
            c.scatter(&g, (&send).into(), (&mut recv).into(), root).map_err(fail)?;
            let want: Vec<u8> = (0..l).map(|k| pat(root, me, k)).collect();
            if recv != want {
                return Err(format!("scatter root {root} on {g:?}: got {recv:?}, expected {want:?}"));
            }
        }
    }
    Ok(Outcome::Pass)
}

fn barrier_waits_for_the_slowest(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    for g in groups(ctx) {
        c.barrier(&g).map_err(fail)?;
        let t0 = Instant::now();
        if ctx.rank() == g[g.len() - 1] {
            std::thread::sleep(Duration::from_millis(300));
        }
        c.barrier(&g).map_err(fail)?;
        let waited = t0.elapsed();
        if waited < Duration::from_millis(250) {
            return Err(format!("barrier on {g:?} returned after {waited:?}, before the last member arrived"));
        }
    }
    Ok(Outcome::Pass)
}

/// Typed mesh collectives over the prepared per-dim sub-communicators (MPI_Comm_split).
fn mesh_dim_collectives(ctx: &RankCtx) -> Result<Outcome, String> {
    let n = ctx.world_size();
    if !n.is_multiple_of(2) {
        return Ok(Outcome::Skip(format!("needs an even number of ranks, has {n}")));
    }
    let mesh = ctx.init_device_mesh(&[2, n / 2], &["dp", "tp"]).map_err(fail)?;
    for d in 0..2 {
        let g = mesh.group(d).to_vec();
        let mine: Vec<f32> = (0..4).map(|i| val(DType::F32, ctx.rank(), i) as f32).collect();
        let got = mesh.all_gather(Along::Dim(d), &mine).map_err(fail)?;
        let want: Vec<f64> = g.iter().flat_map(|&r| (0..4).map(move |i| val(DType::F32, r, i))).collect();
        close(&got.iter().map(|&x| x as f64).collect::<Vec<_>>(), &want, &format!("mesh all_gather dim {d}"))?;
        let mut buf: Vec<f64> = (0..4).map(|i| val(DType::F64, ctx.rank(), i)).collect();
        mesh.all_reduce(Along::Dim(d), &mut buf, ReduceOp::Sum).map_err(fail)?;
        let want: Vec<f64> = (0..4).map(|i| g.iter().map(|&r| val(DType::F64, r, i)).sum()).collect();
        close(&buf, &want, &format!("mesh all_reduce dim {d}"))?;
    }
    let mut all: Vec<f64> = vec![ctx.rank() as f64 + 1.0];
    mesh.all_reduce(Along::All, &mut all, ReduceOp::Product).map_err(fail)?;
    close(&all, &[(1..=n).map(|x| x as f64).product()], "mesh all_reduce over the whole mesh")?;
    Ok(Outcome::Pass)
}

/// `all_gather_v_start` (MPI_Iallgatherv) gives what the blocking `all_gather_v` gives, over
/// both dims of a mesh and the whole world, with uneven and empty counts, two started at once
/// on one group and a blocking collective on the other group while they run; one member
/// starting while the others run it blocking is a typed mismatch on every member; FSDP with
/// prefetch (its gathers started ahead) gives the gradients of FSDP without.
fn started_all_gather_matches_blocking(ctx: &RankCtx) -> Result<Outcome, String> {
    use dtensor_runtime::fsdp::{fully_shard, FullyShardOptions};
    use dtensor_runtime::module::{Forward, Linear, Module, Sequential};
    let n = ctx.world_size();
    if !n.is_multiple_of(2) {
        return Ok(Outcome::Skip(format!("needs an even number of ranks, has {n}")));
    }
    let mesh = ctx.init_device_mesh(&[2, n / 2], &["dp", "tp"]).map_err(fail)?;
    for along in [Along::Dim(0), Along::Dim(1), Along::All] {
        let g: Vec<usize> = match along {
            Along::Dim(d) => mesh.group(d).to_vec(),
            Along::All => mesh.ranks().to_vec(),
        };
        let me = g.iter().position(|&r| r == ctx.rank()).ok_or("not in my group")?;
        let (a, b) = (uneven_counts(g.len(), 3), vec![0; g.len()]);
        let mine = |counts: &[usize], k: usize| -> Vec<f64> {
            (0..counts[me]).map(|i| val(DType::F64, ctx.rank(), i + k)).collect()
        };
        let first = mesh.all_gather_v_start(along, mine(&a, 0), &a).map_err(fail)?;
        let second = mesh.all_gather_v_start(along, mine(&b, 1), &b).map_err(fail)?;
        if let Along::Dim(d) = along {
            // a blocking collective on the other group while the started ones run
            let mut x = vec![1.0f64];
            mesh.all_reduce(Along::Dim(1 - d), &mut x, ReduceOp::Sum).map_err(fail)?;
            close(&x, &[mesh.group(1 - d).len() as f64], "blocking all_reduce beside started gathers")?;
        }
        let want = |counts: &[usize], k: usize| -> Vec<f64> {
            g.iter().zip(counts).flat_map(|(&r, &c)| (0..c).map(move |i| val(DType::F64, r, i + k))).collect()
        };
        close(&first.wait().map_err(fail)?, &want(&a, 0), &format!("started all_gather_v {along:?}"))?;
        close(&second.wait().map_err(fail)?, &want(&b, 1), &format!("started empty all_gather_v {along:?}"))?;
        let blocking = mesh.all_gather_v(along, &mine(&a, 0), &a).map_err(fail)?;
        close(&blocking, &want(&a, 0), &format!("blocking all_gather_v {along:?}"))?;
    }
    // one member starts while the others run it blocking: a typed mismatch on every member
    let mine: Vec<f64> = vec![1.0; 2];
    let counts = vec![2; mesh.group(0).len()];
    let r = match mesh.coordinate()[0] {
        0 => mesh.all_gather_v_start(Along::Dim(0), mine, &counts).and_then(|p| p.wait()),
        _ => mesh.all_gather_v(Along::Dim(0), &mine, &counts),
    };
    match r {
        Err(Error::CollectiveMismatch { field, detail, .. }) if field == "kind" => {
            if !detail.contains("MPI_Iallgatherv") {
                return Err(format!("mismatch detail: {detail}"));
            }
        }
        other => return Err(format!("started against blocking: {other:?}")),
    }
    let dp = ctx.init_device_mesh(&[n], &["dp"]).map_err(fail)?;
    let grads = |prefetch: bool| -> Result<Vec<f64>, String> {
        dtensor_runtime::manual_seed(5);
        let units = (0..3)
            .map(|i| {
                let opts = FullyShardOptions::on("dp").named(&format!("layers.{i}")).prefetch(prefetch);
                fully_shard(Linear::<f64>::new(6, 6, true)?, &dp, &opts)
            })
            .collect::<dtensor_runtime::Result<Vec<_>>>()
            .map_err(fail)?;
        let model = Sequential(units);
        let x = dtensor_runtime::ndarray::ArrayD::from_shape_fn(vec![n, 6], |i| (i[0] * 6 + i[1]) as f64 / 17.0);
        let x = dtensor_runtime::distribute_tensor(&x, &dp, &[dtensor_runtime::Shard(0)], None).map_err(fail)?;
        let y = model.forward(&x).map_err(fail)?;
        y.mul(&y).map_err(fail)?.sum().map_err(fail)?.backward().map_err(fail)?;
        let mut out = vec![];
        for (_, p) in model.named_parameters() {
            out.extend(p.grad().ok_or("no gradient")?.full_tensor().map_err(fail)?.iter().copied());
        }
        Ok(out)
    };
    close(&grads(true)?, &grads(false)?, "FSDP with prefetch against without")?;
    Ok(Outcome::Pass)
}

/// A mesh dim split in two after the mesh was made (`DeviceMesh::unflatten`: its groups are
/// created then, collectively) runs collectives over each half; FSDP resharding after the
/// forward to groups of 2 (which splits its dim so) gives the gradients of resharding to all.
fn unflattened_mesh_collectives(ctx: &RankCtx) -> Result<Outcome, String> {
    use dtensor_runtime::fsdp::{fully_shard, FullyShardOptions};
    use dtensor_runtime::module::{Forward, Linear, Module};
    let n = ctx.world_size();
    if n < 4 || !n.is_multiple_of(2) {
        return Ok(Outcome::Skip(format!("needs an even number of ranks, at least 4, has {n}")));
    }
    let mesh = ctx.init_device_mesh(&[n], &["dp"]).map_err(fail)?;
    let split = mesh.unflatten("dp", &[n / 2, 2], &["node", "local"]).map_err(fail)?;
    for d in 0..2 {
        let g = split.group(d).to_vec();
        let mine: Vec<f64> = (0..3).map(|i| val(DType::F64, ctx.rank(), i)).collect();
        let got = split.all_gather(Along::Dim(d), &mine).map_err(fail)?;
        let want: Vec<f64> = g.iter().flat_map(|&r| (0..3).map(move |i| val(DType::F64, r, i))).collect();
        close(&got, &want, &format!("unflattened mesh all_gather dim {d}"))?;
    }
    let grads = |opts: FullyShardOptions| -> Result<Vec<f64>, String> {
        dtensor_runtime::manual_seed(3);
        let lin = fully_shard(Linear::<f64>::new(5, 7, true).map_err(fail)?, &mesh, &opts).map_err(fail)?;
        let x = dtensor_runtime::ndarray::ArrayD::from_shape_fn(vec![n, 5], |i| (i[0] * 5 + i[1]) as f64 / 9.0);
        let x = dtensor_runtime::distribute_tensor(&x, &mesh, &[dtensor_runtime::Shard(0)], None).map_err(fail)?;
        let y = lin.forward(&x).map_err(fail)?;
        y.mul(&y).map_err(fail)?.sum().map_err(fail)?.backward().map_err(fail)?;
        let mut out = vec![];
        for (_, p) in lin.named_parameters() {
            out.extend(p.grad().ok_or("no gradient")?.full_tensor().map_err(fail)?.iter().copied());
        }
        Ok(out)
    };
    let whole = grads(FullyShardOptions::on("dp").reshard_after_forward(true))?;
    let group = grads(FullyShardOptions::on("dp").reshard_after_forward_to(2))?;
    close(&group, &whole, "FSDP resharding to groups of 2 against resharding to all")?;
    Ok(Outcome::Pass)
}

/// `all_reduce_start` (MPI_Iallreduce for the native dtypes; blocking for 16-bit floats and
/// max/min) equals the blocking all-reduce (on values whose sums are exact in any order, since
/// MPI may choose another summation order per call), over both dims of a mesh and the whole
/// world, at sizes from 0 up; a blocking call on the same group does not overtake a started
/// one, one on the other group runs alongside.
fn started_all_reduce_matches_blocking(ctx: &RankCtx) -> Result<Outcome, String> {
    let n = ctx.world_size();
    if !n.is_multiple_of(2) {
        return Ok(Outcome::Skip(format!("needs an even number of ranks, has {n}")));
    }
    let mesh = ctx.init_device_mesh(&[2, n / 2], &["dp", "tp"]).map_err(fail)?;
    let me = ctx.rank();
    fn check<T: dtensor_runtime::Scalar>(
        mesh: &dtensor_runtime::DeviceMesh,
        me: usize,
        op: ReduceOp,
        dtype: DType,
    ) -> Result<(), String> {
        for along in [Along::Dim(0), Along::Dim(1), Along::All] {
            for len in [0usize, 1, 7, 70_001] {
                let mine: Vec<T> = (0..len).map(|i| T::of_f64(val(dtype, me, i))).collect();
                let mut want = mine.clone();
                mesh.all_reduce(along, &mut want, op).map_err(fail)?;
                let got = mesh.all_reduce_start(along, mine, op).map_err(fail)?.wait().map_err(fail)?;
                if got != want {
                    return Err(format!("{dtype} {op:?} {along:?} len {len}: started ≠ blocking"));
                }
            }
        }
        Ok(())
    }
    for op in OPS {
        for dtype in [DType::F32, DType::F64, DType::I64, DType::BF16] {
            if !defined(dtype, op) {
                continue;
            }
            match dtype {
                DType::F32 => check::<f32>(&mesh, me, op, dtype)?,
                DType::F64 => check::<f64>(&mesh, me, op, dtype)?,
                DType::I64 => check::<i64>(&mesh, me, op, dtype)?,
                _ => check::<bf16>(&mesh, me, op, dtype)?,
            }
        }
    }
    // Order: two started on dp, a blocking dp and a blocking tp one in between, waits reversed.
    let v = |salt: usize| -> Vec<f64> { (0..1000).map(|i| val(DType::F64, me + salt, i)).collect() };
    let sum = |d: usize, salt: usize| -> Vec<f64> {
        (0..1000).map(|i| mesh.group(d).iter().map(|&r| val(DType::F64, r + salt, i)).sum()).collect()
    };
    let a = mesh.all_reduce_start(Along::Dim(0), v(0), ReduceOp::Sum).map_err(fail)?;
    let b = mesh.all_reduce_start(Along::Dim(0), v(1), ReduceOp::Sum).map_err(fail)?;
    let mut c = v(2);
    mesh.all_reduce(Along::Dim(0), &mut c, ReduceOp::Sum).map_err(fail)?;
    let mut d = v(3);
    mesh.all_reduce(Along::Dim(1), &mut d, ReduceOp::Sum).map_err(fail)?;
    let (b, a) = (b.wait().map_err(fail)?, a.wait().map_err(fail)?);
    close(&a, &sum(0, 0), "first started")?;
    close(&b, &sum(0, 1), "second started")?;
    close(&c, &sum(0, 2), "blocking dp after two started")?;
    close(&d, &sum(1, 3), "blocking tp alongside")?;
    // A started all-gather (FSDP's prefetch; run at once on MPI) equals the blocking one,
    // uneven and empty blocks included, behind a started all-reduce of the same group.
    for along in [Along::Dim(0), Along::Dim(1), Along::All] {
        let (k, n) = match along {
            Along::Dim(d) => (mesh.coordinate()[d], mesh.size(d)),
            _ => (me, mesh.ranks().len()),
        };
        for base in [0usize, 1, 3, 10_000] {
            let counts: Vec<usize> = (0..n).map(|j| base * j / 2 + j % 2).collect();
            let mine: Vec<f64> = (0..counts[k]).map(|i| val(DType::F64, me, i)).collect();
            let want = mesh.all_gather_v(along, &mine, &counts).map_err(fail)?;
            let before = mesh.all_reduce_start(along, v(4), ReduceOp::Sum).map_err(fail)?;
            let got = mesh.all_gather_v_start(along, mine, &counts).map_err(fail)?.wait().map_err(fail)?;
            before.wait().map_err(fail)?;
            if got != want {
                return Err(format!("all_gather_v_start {along:?} counts {counts:?}: started ≠ blocking"));
            }
        }
    }
    Ok(Outcome::Pass)
}

/// Collectives of zero bytes (an empty shard's) complete on every rank: Open MPI rejects a
/// zero-length call whose two empty buffers share an address (`MPI_ERR_ARG`, fatal), so none
/// reaches MPI. 16-bit all-reduces (gathered) and reduce-scatters (all-to-all) included.
fn empty_collectives_complete(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    let world: Vec<usize> = (0..ctx.world_size()).collect();
    let mut none: Vec<u8> = Vec::new();
    c.all_gather(&world, (&[]).into(), (&mut none).into()).map_err(fail)?;
    c.all_to_all(&world, (&[]).into(), (&mut none).into()).map_err(fail)?;
    c.broadcast(&world, (&mut none).into(), 0).map_err(fail)?;
    c.scatter(&world, (&[]).into(), (&mut none).into(), 0).map_err(fail)?;
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::I64] {
        for op in OPS.into_iter().filter(|&op| defined(dtype, op)) {
            c.all_reduce(&world, (&mut none).into(), dtype, op).map_err(fail)?;
            c.reduce_scatter(&world, (&[]).into(), (&mut none).into(), dtype, op).map_err(fail)?;
        }
    }
    // Still a typed error for a rank outside the group.
    let others: Vec<usize> = world.iter().copied().filter(|&r| r != ctx.rank()).collect();
    if !others.is_empty() && c.all_reduce(&others, (&mut none).into(), DType::F32, ReduceOp::Sum).is_ok() {
        return Err("an empty all-reduce over a group without this rank succeeded".into());
    }
    Ok(Outcome::Pass)
}

/// Bad input gets a typed error on every rank, before any message moves.
fn bad_input_is_a_typed_error(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    let n = ctx.world_size();
    let world: Vec<usize> = (0..n).collect();
    let others: Vec<usize> = (0..n).filter(|&r| r != ctx.rank()).collect();
    let mut recv = vec![0u8; 3];
    let e = c.all_gather(&world, (&[1, 2]).into(), (&mut recv).into()).unwrap_err();
    if !matches!(e, Error::BufferMismatch { .. }) && n != 1 {
        return Err(format!("wrong recv size gave {e:?}"));
    }
    if !others.is_empty() {
        let e = c.barrier(&others).unwrap_err();
        if !matches!(e, Error::NotInGroup { .. }) {
            return Err(format!("non-member group gave {e:?}"));
        }
    }
    let e = c.broadcast(&world, (&mut [0u8; 4]).into(), n).unwrap_err();
    if !matches!(e, Error::RankOutOfRange { .. }) {
        return Err(format!("root out of range gave {e:?}"));
    }
    let e = c.barrier(&[n + 3]).unwrap_err();
    if !matches!(e, Error::RankOutOfRange { .. }) {
        return Err(format!("rank out of world gave {e:?}"));
    }
    let e = c.prepare_groups(&[vec![vec![0, 0]]]).unwrap_err();
    if !matches!(e, Error::InvalidArgument { .. }) {
        return Err(format!("non-partition gave {e:?}"));
    }
    let e = c.all_reduce(&world, (&mut [0u8; 5]).into(), DType::F32, ReduceOp::Sum).unwrap_err();
    if !matches!(e, Error::BufferMismatch { .. }) {
        return Err(format!("5 bytes of f32 gave {e:?}"));
    }
    Ok(Outcome::Pass)
}

/// Max and min with a NaN operand give NaN (as PyTorch), though MPI_MAX/MPI_MIN drop it.
fn max_min_propagate_nan(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    let n = ctx.world_size();
    let world: Vec<usize> = (0..n).collect();
    let last = n - 1;
    for op in [ReduceOp::Max, ReduceOp::Min] {
        for dtype in DType::FLOATS {
            // Element 0 is NaN on the last rank only; element 1 is finite everywhere.
            let mine = [if ctx.rank() == last { f64::NAN } else { 1.0 }, ctx.rank() as f64];
            let mut buf = to_bytes(dtype, &mine);
            c.all_reduce(&world, (&mut buf).into(), dtype, op).map_err(|e| e.to_string())?;
            let got = from_bytes(dtype, &buf);
            let finite = if op == ReduceOp::Max { last as f64 } else { 0.0 };
            if !got[0].is_nan() || got[1] != finite {
                return Err(format!("all_reduce {op:?} {dtype}: got {got:?}, expected [NaN, {finite}]"));
            }
            let send: Vec<f64> = (0..n).flat_map(|_| mine).collect();
            let mut recv = to_bytes(dtype, &[0.0, 0.0]);
            c.reduce_scatter(&world, (&to_bytes(dtype, &send)).into(), (&mut recv).into(), dtype, op)
                .map_err(|e| e.to_string())?;
            let got = from_bytes(dtype, &recv);
            if !got[0].is_nan() || got[1] != finite {
                return Err(format!("reduce_scatter {op:?} {dtype}: got {got:?}, expected [NaN, {finite}]"));
            }
        }
    }
    Ok(Outcome::Pass)
}

/// With the fingerprint check on, ranks that broadcast from different roots or all-reduce
/// with different ops all get CollectiveMismatch (MPI alone would diverge or abort).
fn fingerprint_check_names_the_mismatch(ctx: &RankCtx) -> Result<Outcome, String> {
    let n = ctx.world_size();
    if n < 2 {
        return Ok(Outcome::Skip("needs two ranks".into()));
    }
    let mesh = ctx.init_device_mesh(&[n], &["x"]).map_err(fail)?;
    mesh.set_collective_checks(true);
    let mut buf = [1.0f32; 4];
    mesh.broadcast(Along::All, &mut buf, 0).map_err(fail)?;
    let e = mesh.broadcast(Along::All, &mut buf, ctx.rank() % 2).unwrap_err();
    if !matches!(&e, Error::CollectiveMismatch { field, .. } if field == "root") {
        return Err(format!("different roots gave {e:?}"));
    }
    let op = if ctx.rank() == n - 1 { ReduceOp::Max } else { ReduceOp::Sum };
    let e = mesh.all_reduce(Along::All, &mut buf, op).unwrap_err();
    if !matches!(&e, Error::CollectiveMismatch { field, .. } if field == "reduce op") {
        return Err(format!("different reduce ops gave {e:?}"));
    }
    mesh.all_reduce(Along::All, &mut buf, ReduceOp::Sum).map_err(fail)?;
    close(&buf.iter().map(|&x| x as f64).collect::<Vec<_>>(), &[n as f64; 4], "all_reduce after the mismatches")?;
    Ok(Outcome::Pass)
}

/// Every rank got a typed disagreement error (never `Ok`, never an abort): `BufferMismatch`
/// for sizes and counts, `CollectiveMismatch` on `field` for the other arguments.
fn typed_disagreement<T: std::fmt::Debug>(what: &str, r: Result<T, Error>, field: Option<&str>) -> Result<(), String> {
    match (&r, field) {
        (Err(Error::BufferMismatch { .. }), None) => Ok(()),
        (Err(Error::CollectiveMismatch { field: f, .. }), Some(want)) if f == want => Ok(()),
        _ => Err(format!("{what}: expected a typed disagreement ({field:?}), got {r:?}")),
    }
}

/// Issue 33, finding 2 on MPI: variable-size collectives whose members disagree on counts
/// with equal totals returned wrong data on every rank (only totals or block counts were
/// compared); every rank now gets a typed error before any data moves, over every group, and
/// the communicator stays usable.
fn disagreeing_counts_are_typed_errors(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    if ctx.world_size() < 2 {
        return Ok(Outcome::Skip("needs two ranks".into()));
    }
    for g in groups(ctx) {
        let n = g.len();
        if n < 2 {
            continue;
        }
        let me = g.iter().position(|&r| r == ctx.rank()).unwrap();
        // Member 0 believes the counts are [2, 1, 1, ..], the others [1, 2, 1, ..]: equal totals.
        let counts: Vec<usize> = (0..n).map(|i| if i == usize::from(me != 0) { 2 } else { 1 }).collect();
        let send = vec![me as u8; counts[me]];
        let mut recv = vec![0u8; counts.iter().sum()];
        typed_disagreement("all_gather_v", c.all_gather_v(&g, (&send).into(), &counts, (&mut recv).into()), None)?;
        let bytes: Vec<usize> = counts.iter().map(|x| 4 * x).collect();
        let send = vec![0u8; bytes.iter().sum()];
        let mut recv = vec![0u8; bytes[me]];
        let r = c.reduce_scatter_v(&g, (&send).into(), &bytes, (&mut recv).into(), DType::F32, ReduceOp::Sum);
        typed_disagreement("reduce_scatter_v", r, None)?;
        // All-to-all-v: member 0 sends member 1 two bytes where member 1 expects one, and
        // member 1 expects two from itself where it sends one: every member sends and
        // receives n + 1 bytes, only the pairs disagree.
        let runs: Vec<usize> = (0..n).map(|j| if (me == 0 && j == 1) || (me == 1 && j == 0) { 2 } else { 1 }).collect();
        let recv_counts: Vec<usize> = (0..n).map(|i| if me <= 1 && i == 1 { 2 } else { 1 }).collect();
        let send = vec![me as u8; runs.iter().sum()];
        let mut recv = vec![0u8; recv_counts.iter().sum()];
        let r = c.all_to_all_v(&g, (&send).into(), 1, &runs, (&mut recv).into(), &recv_counts);
        typed_disagreement("all_to_all_v", r, None)?;
        // Still usable: the same collectives with agreeing counts deliver.
        let counts: Vec<usize> = (0..n).map(|i| i % 2 + 1).collect();
        let send: Vec<u8> = (0..counts[me]).map(|b| pat(me, 0, b)).collect();
        let mut recv = vec![0u8; counts.iter().sum()];
        c.all_gather_v(&g, (&send).into(), &counts, (&mut recv).into()).map_err(fail)?;
        let want: Vec<u8> = (0..n).flat_map(|i| (0..counts[i]).map(move |b| pat(i, 0, b))).collect();
        if recv != want {
            return Err(format!("all_gather_v after the mismatches on {g:?}: {recv:?}, expected {want:?}"));
        }
    }
    Ok(Outcome::Pass)
}

/// Issue 33, finding 2 on MPI (equal blocks): members that pass buffers of different
/// lengths, element types of one size (bf16 and f16), reductions or roots ended with wrong
/// data or a crash; each is now a typed error on every rank before any data moves. A member
/// with nothing to move meeting one with bytes (which returned early before) and a member
/// whose own arguments are bad (its peers waited in MPI for it) included.
fn disagreeing_arguments_are_typed_errors(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    let n = ctx.world_size();
    if n < 2 {
        return Ok(Outcome::Skip("needs two ranks".into()));
    }
    let w: Vec<usize> = (0..n).collect();
    let me = ctx.rank();
    for len in [if me == 0 { 8 } else { 4 }, if me == 0 { 0 } else { 4 }] {
        let all = |what: &str, r: Result<(), Error>| typed_disagreement(&format!("{what} ({len} bytes)"), r, None);
        all("all_gather", c.all_gather(&w, (&vec![1; len]).into(), (&mut vec![0; n * len]).into()))?;
        all("all_reduce", c.all_reduce(&w, (&mut vec![0; len]).into(), DType::F32, ReduceOp::Sum))?;
        all("all_reduce bf16", c.all_reduce(&w, (&mut vec![0; len]).into(), DType::BF16, ReduceOp::Sum))?;
        let mut out = vec![0; len];
        all(
            "reduce_scatter",
            c.reduce_scatter(&w, (&vec![0; n * len]).into(), (&mut out).into(), DType::F32, ReduceOp::Sum),
        )?;
        all("all_to_all", c.all_to_all(&w, (&vec![0; n * len]).into(), (&mut vec![0; n * len]).into()))?;
        all("broadcast", c.broadcast(&w, (&mut vec![0; len]).into(), 0))?;
        all("scatter", c.scatter(&w, (&vec![0; n * len]).into(), (&mut vec![0; len]).into(), 0))?;
        let started = ctx.comm().all_reduce_start(&w, Box::new(vec![0f32; len / 4]), DType::F32, ReduceOp::Sum);
        all("all_reduce_start", started.and_then(|p| p.wait()).map(|_| ()))?;
    }
    let (rows, run) = if me == 0 { (2, 2) } else { (4, 1) };
    let r = c.all_to_all_strided(&w, (&vec![0; 4 * n]).into(), rows, run, (&mut vec![0; 4 * n]).into());
    typed_disagreement("all_to_all_strided", r, None)?;
    let dtype = if me == 0 { DType::BF16 } else { DType::F16 };
    typed_disagreement("bf16 vs f16", c.all_reduce(&w, (&mut [0; 8]).into(), dtype, ReduceOp::Sum), Some("dtype"))?;
    let dtype = if me == 0 { DType::F32 } else { DType::I32 };
    typed_disagreement("f32 vs i32", c.all_reduce(&w, (&mut [0; 8]).into(), dtype, ReduceOp::Max), Some("dtype"))?;
    let op = if me == 0 { ReduceOp::Sum } else { ReduceOp::Max };
    typed_disagreement("sum vs max", c.all_reduce(&w, (&mut [0; 8]).into(), DType::F64, op), Some("reduce op"))?;
    typed_disagreement("two roots", c.broadcast(&w, (&mut [0; 4]).into(), me % 2), Some("root"))?;
    // A started all-reduce (MPI_Iallreduce) never matches a blocking one (MPI_Allreduce).
    let r = if me == 0 {
        c.all_reduce(&w, (&mut [0; 8]).into(), DType::F32, ReduceOp::Sum)
    } else {
        c.all_reduce_start(&w, Box::new(vec![0f32; 2]), DType::F32, ReduceOp::Sum).and_then(|p| p.wait()).map(|_| ())
    };
    typed_disagreement("started vs blocking all_reduce", r, Some("kind"))?;
    typed_disagreement(
        "two scatter roots",
        c.scatter(&w, (&vec![0; 4 * n]).into(), (&mut [0; 4]).into(), me % 2),
        Some("root"),
    )?;
    // Rank 0 passes a recv buffer of the wrong size: it gets its own error, its peers one
    // naming it, nobody waits.
    let recv_len = if me == 0 { 3 } else { 2 * n };
    let r = c.all_gather(&w, (&[0, 0]).into(), (&mut vec![0; recv_len]).into());
    typed_disagreement("one member's bad recv", r, None)?;
    let root = if me == 0 { n } else { 0 };
    match c.broadcast(&w, (&mut [0; 4]).into(), root) {
        Err(Error::RankOutOfRange { .. }) if me == 0 => {}
        Err(Error::BufferMismatch { .. }) if me != 0 => {}
        other => return Err(format!("one member's root out of range: {other:?}")),
    }
    // Still usable afterwards.
    let mut b = [1.0f32; 3];
    c.all_reduce(&w, bytemuck::cast_slice_mut(&mut b).into(), DType::F32, ReduceOp::Sum).map_err(fail)?;
    close(&b.map(f64::from), &[n as f64; 3], "all_reduce after the mismatches")?;
    Ok(Outcome::Pass)
}

/// Issue 33, finding 3 on MPI: an all-to-all-v of 2^40 rows of empty runs (an empty shard
/// with a huge leading dim) finishes at once.
fn empty_rows_are_bounded(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    let n = ctx.world_size();
    let w: Vec<usize> = (0..n).collect();
    let t0 = Instant::now();
    c.all_to_all_v(&w, (&[]).into(), 1 << 40, &vec![0; n], (&mut []).into(), &vec![0; n]).map_err(fail)?;
    c.all_to_all_strided(&w, (&[]).into(), 1 << 40, 0, (&mut []).into()).map_err(fail)?;
    if t0.elapsed() > Duration::from_secs(2) {
        return Err(format!("2^40 empty rows took {:?}", t0.elapsed()));
    }
    Ok(Outcome::Pass)
}

/// What the agreement every collective now starts with costs: the time of a small all-reduce
/// and of a barrier (the agreement alone), printed by rank 0 (always passes).
fn agreement_cost(ctx: &RankCtx) -> Result<Outcome, String> {
    let c = ctx.comm();
    let w: Vec<usize> = (0..ctx.world_size()).collect();
    let time = |iters: usize, f: &mut dyn FnMut() -> Result<(), Error>| -> Result<f64, String> {
        c.barrier(&w).map_err(fail)?;
        let t0 = Instant::now();
        for _ in 0..iters {
            f().map_err(fail)?;
        }
        Ok(t0.elapsed().as_secs_f64() / iters as f64 * 1e6)
    };
    let mut small = [0u8; 8];
    let reduce = time(2000, &mut || c.all_reduce(&w, (&mut small).into(), DType::F32, ReduceOp::Sum))?;
    let barrier = time(2000, &mut || c.barrier(&w))?;
    let mut gathered = vec![0u8; 8 * w.len()];
    let gather = time(2000, &mut || c.all_gather(&w, (&small).into(), (&mut gathered).into()))?;
    let mut big = vec![0u8; 1 << 20];
    let large = time(40, &mut || c.all_reduce(&w, (&mut big).into(), DType::F32, ReduceOp::Sum))?;
    if ctx.rank() == 0 {
        println!(
            "  {} ranks: barrier {barrier:.1} us, all_reduce 8 B {reduce:.1} us, all_gather 8 B {gather:.1} us, \
             all_reduce 1 MiB {large:.0} us",
            w.len()
        );
    }
    Ok(Outcome::Pass)
}

fn backend_name_and_world(ctx: &RankCtx) -> Result<Outcome, String> {
    let n: usize = std::env::var("OMPI_COMM_WORLD_SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    if ctx.comm().backend() != "mpi" || ctx.world_size() != n || ctx.rank() >= n {
        return Err(format!(
            "backend {} rank {} of {}, mpirun says {n}",
            ctx.comm().backend(),
            ctx.rank(),
            ctx.world_size()
        ));
    }
    Ok(Outcome::Pass)
}

/// `launch(Launch::Mpi, n, ..)` with `n` different from mpirun's `-np`: a typed error on
/// every rank, before the closure runs.
fn launch_rejects_a_wrong_world_size(ctx: &RankCtx) -> Result<Outcome, String> {
    let n = ctx.world_size();
    match launch(Launch::Mpi, n + 1, |_| -> dtensor_runtime::Result<()> { panic!("must not run") }) {
        Err(Error::InvalidArgument { .. }) => Ok(Outcome::Pass),
        other => Err(format!("launch with {} ranks under -np {n} gave {other:?}", n + 1)),
    }
}

fn main() {
    let tests: &[(&str, TestFn)] = &[
        ("backend_name_and_world", backend_name_and_world),
        ("all_reduce_every_op", all_reduce_every_op),
        ("reduce_scatter_every_op", reduce_scatter_every_op),
        ("all_gather_in_group_order", all_gather_in_group_order),
        ("all_to_all_routes_blocks", all_to_all_routes_blocks),
        ("variable_size_collectives", variable_size_collectives),
        ("broadcast_from_every_root", broadcast_from_every_root),
        ("scatter_from_every_root", scatter_from_every_root),
        ("barrier_waits_for_the_slowest", barrier_waits_for_the_slowest),
        ("mesh_dim_collectives", mesh_dim_collectives),
        ("unflattened_mesh_collectives", unflattened_mesh_collectives),
        ("started_all_reduce_matches_blocking", started_all_reduce_matches_blocking),
        ("started_all_gather_matches_blocking", started_all_gather_matches_blocking),
        ("empty_collectives_complete", empty_collectives_complete),
        ("bad_input_is_a_typed_error", bad_input_is_a_typed_error),
        ("max_min_propagate_nan", max_min_propagate_nan),
        ("fingerprint_check_names_the_mismatch", fingerprint_check_names_the_mismatch),
        ("launch_rejects_a_wrong_world_size", launch_rejects_a_wrong_world_size),
        ("disagreeing_counts_are_typed_errors", disagreeing_counts_are_typed_errors),
        ("disagreeing_arguments_are_typed_errors", disagreeing_arguments_are_typed_errors),
        ("empty_rows_are_bounded", empty_rows_are_bounded),
        ("agreement_cost", agreement_cost),
    ];
    mpi_harness::main("mpi_collectives", tests);
}
