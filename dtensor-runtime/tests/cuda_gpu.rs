//! GPU tests (feature `cuda`). Without a CUDA driver or device every test checks that the
//! failure is the typed `Error::Unavailable` (no cudarc panic), prints a skip message and
//! returns. On a GPU machine (scripts/gpu-check.sh) each prints one `GPUCHECK name | PASS | detail`
//! row for the summary table.

mod common;
mod cuda_device;
mod one_rank_comm;

use common::{coord_of, expected_shard, global};
use cuda_device::{device, down, up};
use dtensor_runtime::comm::nccl::NcclComm;
use dtensor_runtime::comm::{Buf, BufMut};
use dtensor_runtime::cuda::{self, CudaDevice};
use dtensor_runtime::ndarray::{ArrayD, Ix2, IxDyn};
use dtensor_runtime::op::{BinaryOp, Reduction, UnaryOp};
use dtensor_runtime::storage::{CudaStorage, Storage};
use dtensor_runtime::{
    distribute_tensor, from_local, zeros, Communicator, DType, DeviceMesh, Error, FromLocal, ReduceOp, Replicate,
    Shard, TensorOptions,
};
use dtensor_runtime::{Device, Target};
use one_rank_comm::OneRankComm;
use std::sync::Arc;

fn max_err(a: &ArrayD<f64>, b: &ArrayD<f64>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.iter().zip(b.iter()).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

fn cpu_matmul(a: &ArrayD<f64>, b: &ArrayD<f64>) -> ArrayD<f64> {
    let k = *a.shape().last().unwrap();
    let lead: Vec<usize> = a.shape()[..a.ndim() - 1].to_vec();
    // Rows from the leading dims, not len / k: with k = 0 that would be 0 rows.
    let a2 = a.to_shape((lead.iter().product::<usize>(), k)).unwrap().into_owned();
    let b2 = b.clone().into_dimensionality::<Ix2>().unwrap();
    let c = a2.dot(&b2);
    let mut shape = lead;
    shape.push(b.shape()[1]);
    c.into_shape_with_order(IxDyn(&shape)).unwrap()
}

#[test]
fn missing_cuda_is_a_typed_error_not_a_panic() {
    match cuda::availability() {
        Ok(()) => println!("GPUCHECK availability | PASS | {} device(s)", cuda::device_count().unwrap()),
        Err(e) => {
            assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
            let dev = CudaDevice::new(0).unwrap_err();
            assert!(matches!(dev, Error::Unavailable { .. }), "{dev:?}");
            eprintln!("no CUDA here, as expected on a CPU machine: {e}");
        }
    }
}

#[test]
fn host_round_trips() {
    let Some(dev) = device("host_round_trips") else { return };
    for shape in [&[5usize, 3][..], &[7], &[2, 0, 3], &[1, 1, 1]] {
        let g = global(shape, 1);
        let t = up(&dev, &g);
        assert_eq!(t.device(), Device::Cuda(0));
        assert_eq!(down(t), g, "f64 {shape:?}");
        let g32 = g.mapv(|x| x as f32);
        assert_eq!(down(up(&dev, &g32)), g32, "f32 {shape:?}");
        // Through the allocation target, as a mesh places shards.
        let placed = Storage::from_host(g.clone(), &Target::Cuda(Arc::clone(&dev))).unwrap();
        assert_eq!(placed, g, "placed {shape:?}");
    }
    println!("GPUCHECK host_round_trips | PASS | f32+f64, 4 shapes incl. empty");
}

#[test]
fn matmul_matches_cpu() {
    let Some(dev) = device("matmul_matches_cpu") else { return };
    let mut worst = 0.0f64;
    for (sa, sb) in
        [(&[5usize, 7][..], &[7usize, 3][..]), (&[2, 5, 7], &[7, 3]), (&[64, 128], &[128, 96]), (&[3, 0], &[0, 4])]
    {
        let a = global(sa, 2);
        let b = global(sb, 3);
        let want = cpu_matmul(&a, &b);
        let got = up(&dev, &a).matmul(&up(&dev, &b)).unwrap();
        let e = max_err(&down(got), &want);
        assert!(e <= 1e-9 * (1.0 + want.iter().fold(0.0f64, |m, x| m.max(x.abs()))), "f64 {sa:?}@{sb:?}: err {e}");
        let got32 = up(&dev, &a.mapv(|x| x as f32)).matmul(&up(&dev, &b.mapv(|x| x as f32))).unwrap();
        let e32 = max_err(&down(got32).mapv(|x| x as f64), &want);
        assert!(e32 <= 1e-3 * (1.0 + want.iter().fold(0.0f64, |m, x| m.max(x.abs()))), "f32 {sa:?}@{sb:?}: err {e32}");
        worst = worst.max(e32);
    }
    let bad = up(&dev, &global(&[2, 3], 0)).matmul(&up(&dev, &global(&[4, 2], 0)));
    assert!(matches!(bad, Err(Error::ShapeMismatch { .. })), "{bad:?}");
    let mixed = up(&dev, &global(&[2, 3], 0)).matmul(&Storage::Cpu(global(&[3, 2], 0)));
    assert!(matches!(mixed, Err(Error::DeviceMismatch { .. })), "{mixed:?}");
    println!("GPUCHECK matmul_matches_cpu | PASS | 4 shapes, f32 max err {worst:.1e}");
}

#[test]
fn elementwise_matches_cpu() {
    let Some(dev) = device("elementwise_matches_cpu") else { return };
    // The device kernels against the host kernels of the same op enums.
    let a = global(&[33, 31], 4).mapv(|x| x / 16.0);
    let b = global(&[33, 31], 5).mapv(|x| x + 100.0); // no zeros: div is safe
    let (ca, cb) = (Storage::Cpu(a.clone()), Storage::Cpu(b.clone()));
    let (ta, tb) = (up(&dev, &a), up(&dev, &b));
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
        let want = down(ca.binary(op, &cb).unwrap());
        assert!(max_err(&down(ta.binary(op, &tb).unwrap()), &want) <= 1e-12, "{op}");
    }
    for op in
        [UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Relu, UnaryOp::Gelu, UnaryOp::MulScalar(2.5), UnaryOp::AddScalar(-1.0)]
    {
        let want = down(ca.unary(op).unwrap());
        assert!(max_err(&down(ta.unary(op).unwrap()), &want) <= 1e-12, "{op}");
    }
    let bad = ta.binary(BinaryOp::Add, &up(&dev, &global(&[2], 0)));
    assert!(matches!(bad, Err(Error::ShapeMismatch { .. })), "{bad:?}");
    let sum = down(ta.reduce(Reduction::Sum, &[0], false).unwrap());
    assert!(max_err(&sum, &down(ca.reduce(Reduction::Sum, &[0], false).unwrap())) <= 1e-9);
    println!(
        "GPUCHECK elementwise_matches_cpu | PASS | add sub mul div neg exp relu gelu(tanh) scale add_scalar vs host"
    );
}

#[test]
fn nccl_one_rank_collectives() {
    let Some(dev) = device("nccl_one_rank_collectives") else { return };
    let comm = match NcclComm::single(&dev) {
        Ok(c) => c,
        Err(e) => {
            assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
            println!("GPUCHECK nccl_one_rank_collectives | SKIP | {e}");
            return;
        }
    };
    let g = [0usize];
    let xs: Vec<f32> = vec![1.5, -2.0, 3.25];
    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product] {
        let mut b: Vec<u8> = bytemuck::cast_slice(&xs).to_vec();
        comm.all_reduce(&g, (&mut b).into(), DType::F32, op).unwrap();
        assert_eq!(bytemuck::pod_collect_to_vec::<u8, f32>(&b), xs, "{op:?}");
        let mut r = vec![0u8; b.len()];
        comm.reduce_scatter(&g, bytemuck::cast_slice(&xs).into(), (&mut r).into(), DType::F32, op).unwrap();
        assert_eq!(bytemuck::pod_collect_to_vec::<u8, f32>(&r), xs, "reduce_scatter {op:?}");
    }
    let send: Vec<u8> = (0..10).collect();
    let mut out = vec![0u8; 10];
    comm.all_gather(&g, (&send).into(), (&mut out).into()).unwrap();
    assert_eq!(out, send);
    comm.all_to_all(&g, (&send).into(), (&mut out).into()).unwrap();
    assert_eq!(out, send);
    let mut bc = send.clone();
    comm.broadcast(&g, (&mut bc).into(), 0).unwrap();
    assert_eq!(bc, send);
    comm.scatter(&g, (&send).into(), (&mut out).into(), 0).unwrap();
    assert_eq!(out, send);
    comm.barrier(&g).unwrap();
    assert!(matches!(comm.barrier(&[0, 1]), Err(Error::RankOutOfRange { .. })));
    println!("GPUCHECK nccl_one_rank_collectives | PASS | all_reduce x5 ops, reduce_scatter, all_gather, all_to_all, broadcast, scatter, barrier");
}

#[test]
fn nccl_mesh_distribute_redistribute() {
    let Some(dev) = device("nccl_mesh_distribute_redistribute") else { return };
    let comm = match NcclComm::single(&dev) {
        Ok(c) => c,
        Err(e) => {
            println!("GPUCHECK nccl_mesh_distribute_redistribute | SKIP | {e}");
            return;
        }
    };
    let mesh = DeviceMesh::new(Arc::new(comm), &[1, 1], &["dp", "tp"]).unwrap();
    let g = global(&[5, 3], 9);
    let lists = [[Shard(0), Replicate], [Replicate, Shard(1)], [Shard(1), Shard(0)], [Replicate, Replicate]];
    for from in &lists {
        let dt = distribute_tensor(&g, &mesh, from, Some(0)).unwrap();
        for to in &lists {
            let r = dt.redistribute(to).unwrap();
            assert_eq!(
                r.to_host().unwrap(),
                expected_shard(&g, &[1, 1], &coord_of(0, &[1, 1]), to),
                "{from:?} -> {to:?}"
            );
        }
        assert_eq!(dt.full_tensor().unwrap(), g);
    }
    println!("GPUCHECK nccl_mesh_distribute_redistribute | PASS | 1x1 mesh over NCCL, 16 redistributions");
}

#[test]
fn mlp_chain_matches_cpu() {
    let Some(dev) = device("mlp_chain_matches_cpu") else { return };
    let x = global(&[16, 32], 11).mapv(|v| v / 48.0);
    let w1 = global(&[32, 64], 12).mapv(|v| v / 48.0);
    let w2 = global(&[64, 32], 13).mapv(|v| v / 48.0);
    let want = cpu_matmul(&cpu_matmul(&x, &w1).mapv(|v| v.max(0.0)), &w2).mapv(|v| v * 0.5);
    let up32 = |a: &ArrayD<f64>| up(&dev, &a.mapv(|v| v as f32));
    let got = up32(&x)
        .matmul(&up32(&w1))
        .and_then(|h| h.unary(UnaryOp::Relu))
        .and_then(|h| h.matmul(&up32(&w2)))
        .and_then(|y| y.unary(UnaryOp::MulScalar(0.5)))
        .unwrap();
    let e = max_err(&down(got).mapv(|v| v as f64), &want);
    assert!(e < 1e-4, "mlp chain err {e}");
    println!("GPUCHECK mlp_chain_matches_cpu | PASS | x@w1 -> relu -> @w2 -> *0.5 (f32), max err {e:.1e}");
}

#[test]
fn dtensors_live_on_the_mesh_device() {
    let Some(dev) = device("dtensors_live_on_the_mesh_device") else { return };
    let comm = OneRankComm { device: Device::Cuda(dev.ordinal()), handle: Some(Arc::clone(&dev)) };
    let mesh = DeviceMesh::new(Arc::new(comm), &[1], &["x"]).unwrap();
    assert_eq!(mesh.device(), Device::Cuda(dev.ordinal()));
    let a = global(&[6, 5], 21).mapv(|v| v / 32.0);
    let b = global(&[5, 4], 22).mapv(|v| v / 32.0);
    let x = distribute_tensor(&a, &mesh, &[Replicate], None).unwrap();
    let w = distribute_tensor(&b, &mesh, &[Replicate], Some(0)).unwrap();
    assert_eq!(x.device(), Device::Cuda(dev.ordinal()));
    assert!(matches!(x.local_cpu(), Err(Error::Unsupported { .. })));
    assert_eq!(x.to_host().unwrap(), a);
    assert_eq!(x.full_tensor().unwrap(), a);
    // Ops run on the device through the kernel surface, and agree with the host.
    let y = x.matmul(&w).unwrap().gelu().unwrap();
    let host = DeviceMesh::new(Arc::new(OneRankComm { device: Device::Cpu, handle: None }), &[1], &["x"]).unwrap();
    let (xh, wh) = (
        distribute_tensor(&a, &host, &[Replicate], None).unwrap(),
        distribute_tensor(&b, &host, &[Replicate], None).unwrap(),
    );
    let want = xh.matmul(&wh).unwrap().gelu().unwrap().full_tensor().unwrap();
    assert!(max_err(&y.full_tensor().unwrap(), &want) <= 1e-12);
    // Host data given to from_local is placed on the device; factories allocate there.
    let l = from_local(a.clone(), &mesh, &[Shard(0)], FromLocal::default()).unwrap();
    assert_eq!(l.device(), Device::Cuda(dev.ordinal()));
    let z = zeros::<f32>(&[3, 2], &TensorOptions::new().mesh(&mesh)).unwrap();
    assert_eq!(z.to_host().unwrap(), ArrayD::<f32>::zeros(IxDyn(&[3, 2])));
    // Mixing devices is a typed error, as mixing meshes is.
    assert!(matches!(x.add(&xh), Err(Error::DeviceMismatch { .. })));
    assert!((x.sum().unwrap().full_tensor().unwrap().sum() - a.sum()).abs() <= 1e-9);
    println!("GPUCHECK dtensors_live_on_the_mesh_device | PASS | distribute/from_local/zeros on the device, matmul+gelu vs host, typed errors");
}

/// Every redistribution of a 2-d mesh of `launch` ranks against the expected shard, and the
/// ranks' device; `None` with a printed SKIP row when the mode cannot run here.
fn launch_redistributes(test: &str, mode: dtensor_runtime::Launch, world: usize, mesh: [usize; 2]) -> Option<String> {
    let g = global(&[7, 5], 31);
    let lists = [[Shard(0), Replicate], [Replicate, Shard(1)], [Shard(1), Shard(0)], [Replicate, Replicate]];
    let out = dtensor_runtime::launch(mode, world, |ctx| {
        let m = ctx.init_device_mesh(&mesh, &["dp", "tp"])?;
        let mut n = 0;
        for from in &lists {
            let dt = distribute_tensor(&g, &m, from, Some(0))?;
            assert!(matches!(dt.device(), Device::Cuda(_)), "{test}: {:?}", dt.device());
            for to in &lists {
                let r = dt.redistribute(to)?;
                let want = expected_shard(&g, &mesh, &coord_of(ctx.rank(), &mesh), to);
                assert_eq!(r.to_host()?, want, "{test}: {from:?} -> {to:?} on rank {}", ctx.rank());
                n += 1;
            }
            assert_eq!(dt.full_tensor()?, g);
        }
        // Avg through the backend (ncclAvg where NCCL has it): the mean of the ranks' values.
        let mut v = [ctx.rank() as f32 + 1.0, -2.0 * ctx.rank() as f32];
        m.all_reduce(dtensor_runtime::Along::All, &mut v, ReduceOp::Avg)?;
        let w = world as f32;
        assert_eq!(v, [(w + 1.0) / 2.0, -(w - 1.0)], "{test}: Avg");
        Ok((ctx.device(), n))
    });
    match out {
        Ok(v) => Some(format!("{} rank(s) on {:?}, {} redistributions each", v.len(), v[0].0, v[0].1)),
        Err(e) => {
            assert!(matches!(e, Error::Unavailable { .. } | Error::TooFewDevices { .. }), "{test}: {e:?}");
            println!("GPUCHECK {test} | SKIP | {e}");
            None
        }
    }
}

#[test]
fn launch_nccl_world1_thread_mode() {
    let test = "launch_nccl_world1_thread_mode";
    if dtensor_runtime::launch::nccl::launched_by_env() {
        println!("GPUCHECK {test} | SKIP | a launcher's rank variables are set: this is process mode");
        return;
    }
    if let Some(detail) = launch_redistributes(test, dtensor_runtime::Launch::Nccl, 1, [1, 1]) {
        let v = dtensor_runtime::comm::nccl::version().unwrap();
        println!("GPUCHECK {test} | PASS | {detail}, NCCL {v} ({:?})", v.group_strategy());
    }
}

#[test]
fn launch_cuda_threads_2x2() {
    let test = "launch_cuda_threads_2x2";
    if let Some(detail) = launch_redistributes(test, dtensor_runtime::Launch::CudaThreads, 4, [2, 2]) {
        println!("GPUCHECK {test} | PASS | {detail}");
    }
}

/// Rank `r`'s `len` values of `T` as bytes: varied, and a NaN at element 3 of rank 1 for the
/// floats (max and min must propagate it as the host fold does).
fn rank_values<T: dtensor_runtime::Scalar>(r: usize, len: usize) -> Vec<u8> {
    let v: Vec<T> = (0..len)
        .map(|i| {
            let x = ((r * 7919 + i * 104_729) % 2001) as f64 * 0.37 - 370.0 + r as f64 * 1e-3;
            let x = if r == 1 && i == 3 && T::DTYPE.is_float() { f64::NAN } else { x };
            T::of_f64(x)
        })
        .collect();
    bytemuck::cast_slice(&v).to_vec()
}

/// Whether `got` and `want` (elements of `T`) have the same bits, except that a NaN matches
/// any NaN: the GPU's arithmetic returns its canonical NaN, the host's keeps an operand's bits.
fn same_bits<T: dtensor_runtime::Scalar>(got: &[u8], want: &[u8]) -> bool {
    let (g, w): (Vec<T>, Vec<T>) = (bytemuck::pod_collect_to_vec(got), bytemuck::pod_collect_to_vec(want));
    let nan = |x: &T| x.partial_cmp(x).is_none();
    g.len() == w.len()
        && g.iter().zip(&w).all(|(a, b)| (nan(a) && nan(b)) || bytemuck::bytes_of(a) == bytemuck::bytes_of(b))
}

/// `bytes` on `dev` as a flat storage of `T`.
fn dev_bytes<T: dtensor_runtime::Scalar>(dev: &Arc<CudaDevice>, bytes: &[u8]) -> CudaStorage<T> {
    let v: Vec<T> = bytemuck::pod_collect_to_vec(bytes);
    CudaStorage::from_slice(dev, &[v.len()], &v).unwrap()
}

/// The bytes of a device storage.
fn host_bytes<T: dtensor_runtime::Scalar>(s: &CudaStorage<T>) -> Vec<u8> {
    let a = s.to_host().unwrap();
    bytemuck::cast_slice(a.as_slice().unwrap()).to_vec()
}

/// Every collective of `comm` on buffers over `group` on device buffers of `k` elements per block,
/// against what the host computes: the copies bit for bit against the host buffers' result
/// (the inner thread backend), the reductions bit for bit (any NaN matching any NaN) against
/// the host fold of the members' inputs in group order (the order the device path folds in). Returns the number of
/// collectives checked.
fn buf_collectives_case<T: dtensor_runtime::Scalar>(
    comm: &Arc<dyn Communicator>,
    dev: &Arc<CudaDevice>,
    group: &[usize],
    k: usize,
    ops: &[ReduceOp],
) -> dtensor_runtime::Result<usize> {
    use dtensor_runtime::comm::{reduce, Buf, BufInOut, BufMut};
    let (n, es, dtype) = (group.len(), std::mem::size_of::<T>(), T::DTYPE);
    let me = group.iter().position(|&r| r == comm.rank()).unwrap();
    let ctx = format!("{dtype} k={k} group {group:?} rank {}", comm.rank());
    let mut checked = 0;
    let out = |len: usize| CudaStorage::<T>::zeros(dev, &[len]).unwrap();

    // all_gather: against the host buffers through the thread backend, and the members' inputs.
    let send = rank_values::<T>(comm.rank(), k);
    let d_send = dev_bytes::<T>(dev, &send);
    let mut d_recv = out(n * k);
    comm.all_gather(group, Buf::of_cuda(&d_send), BufMut::of_cuda(&mut d_recv)?)?;
    let mut h_recv = vec![0u8; n * k * es];
    comm.all_gather(group, Buf::Host(&send), BufMut::from(&mut h_recv))?;
    let want: Vec<u8> = group.iter().flat_map(|&r| rank_values::<T>(r, k)).collect();
    assert_eq!(h_recv, want, "all_gather host {ctx}");
    assert_eq!(host_bytes(&d_recv), want, "all_gather device {ctx}");
    checked += 1;

    // all_to_all of n blocks of k.
    let send = rank_values::<T>(comm.rank(), n * k);
    let d_send = dev_bytes::<T>(dev, &send);
    let mut d_recv = out(n * k);
    comm.all_to_all(group, Buf::of_cuda(&d_send), BufMut::of_cuda(&mut d_recv)?)?;
    let mut h_recv = vec![0u8; n * k * es];
    comm.all_to_all(group, Buf::Host(&send), BufMut::from(&mut h_recv))?;
    let block = |r: usize, i: usize| rank_values::<T>(r, n * k)[i * k * es..(i + 1) * k * es].to_vec();
    let want: Vec<u8> = group.iter().flat_map(|&r| block(r, me)).collect();
    assert_eq!(h_recv, want, "all_to_all host {ctx}");
    assert_eq!(host_bytes(&d_recv), want, "all_to_all device {ctx}");
    checked += 1;

    // broadcast from the last member.
    // (In place since issue 32 item 2a: the device buffer and the host one are overwritten.)
    let send = rank_values::<T>(comm.rank(), k);
    let mut d_recv = dev_bytes::<T>(dev, &send);
    comm.broadcast(group, BufInOut::of_cuda(&mut d_recv)?, n - 1)?;
    let mut h_recv = send.clone();
    comm.broadcast(group, BufInOut::Host(&mut h_recv), n - 1)?;
    let want = rank_values::<T>(group[n - 1], k);
    assert_eq!(h_recv, want, "broadcast host {ctx}");
    assert_eq!(host_bytes(&d_recv), want, "broadcast device {ctx}");
    checked += 1;

    // The reductions, against the host fold in group order.
    let fold = |blocks: Vec<Vec<u8>>, op: ReduceOp| {
        let mut acc = blocks[0].clone();
        for b in &blocks[1..] {
            reduce::accumulate(dtype, op, &mut acc, b).unwrap();
        }
        reduce::finish(dtype, op, &mut acc, n);
        acc
    };
    for &op in ops {
        let send = rank_values::<T>(comm.rank(), k);
        let d_send = dev_bytes::<T>(dev, &send);
        let mut d_recv = out(k);
        comm.all_reduce_into(group, Buf::of_cuda(&d_send), BufMut::of_cuda(&mut d_recv)?, dtype, op)?;
        let want = fold(group.iter().map(|&r| rank_values::<T>(r, k)).collect(), op);
        assert!(same_bits::<T>(&host_bytes(&d_recv), &want), "all_reduce {op} {ctx}");
        // In place on the device buffer (issue 32 item 2a): the same bits.
        let mut d_buf = dev_bytes::<T>(dev, &send);
        comm.all_reduce(group, BufInOut::of_cuda(&mut d_buf)?, dtype, op)?;
        assert!(same_bits::<T>(&host_bytes(&d_buf), &want), "all_reduce in place {op} {ctx}");

        let send = rank_values::<T>(comm.rank(), n * k);
        let d_send = dev_bytes::<T>(dev, &send);
        let mut d_recv = out(k);
        comm.reduce_scatter(group, Buf::of_cuda(&d_send), BufMut::of_cuda(&mut d_recv)?, dtype, op)?;
        let want = fold(group.iter().map(|&r| block(r, me)).collect(), op);
        assert!(same_bits::<T>(&host_bytes(&d_recv), &want), "reduce_scatter {op} {ctx}");
        checked += 3;
    }
    Ok(checked)
}

/// The collectives of `cuda-threads` on device buffers (the device-to-device path, or
/// host-staged with `DTENSOR_CUDA_THREADS_STAGE=host`) at 1 to 4 ranks, the whole world and, at 4, two groups of
/// two; blocks of 0 (empty shards), 1, 7 and 2049 elements; f32 with every op, bf16 and f64
/// sums and means on the device, i64 sums (staged through the host: no integer device kernel).
#[test]
fn cuda_threads_buf_collectives() {
    let test = "cuda_threads_buf_collectives";
    let all_ops = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product];
    let mut total = 0;
    for world in 1..=4 {
        let out = dtensor_runtime::launch(dtensor_runtime::Launch::CudaThreads, world, |ctx| {
            let comm = ctx.comm();
            let dev = comm.cuda_device().expect("a cuda-threads rank has a device");
            let mut groups = vec![(0..world).collect::<Vec<usize>>()];
            if world == 4 {
                groups.push(if ctx.rank() % 2 == 0 { vec![0, 2] } else { vec![1, 3] });
            }
            let mut checked = 0;
            for g in &groups {
                for k in [0, 1, 7, 2049] {
                    checked += buf_collectives_case::<f32>(comm, &dev, g, k, &all_ops)?;
                    checked += buf_collectives_case::<dtensor_runtime::bf16>(comm, &dev, g, k, &all_ops[..2])?;
                    checked += buf_collectives_case::<f64>(comm, &dev, g, k, &all_ops[..3])?;
                    checked += buf_collectives_case::<i64>(comm, &dev, g, k, &all_ops[..1])?;
                }
            }
            // A receive buffer of the wrong length is a typed error on every rank, no hang.
            let send = dev_bytes::<f32>(&dev, &rank_values::<f32>(ctx.rank(), 3));
            let mut short = CudaStorage::<f32>::zeros(&dev, &[3 * world + 1]).unwrap();
            let e = comm.all_gather(&groups[0], Buf::of_cuda(&send), BufMut::of_cuda(&mut short)?).unwrap_err();
            assert!(matches!(e, Error::BufferMismatch { .. }), "{e:?}");
            Ok(checked)
        });
        match out {
            Ok(v) => total += v.iter().sum::<usize>(),
            Err(e) => {
                assert!(matches!(e, Error::Unavailable { .. } | Error::TooFewDevices { .. }), "{test}: {e:?}");
                println!("GPUCHECK {test} | SKIP | {e}");
                return;
            }
        }
    }
    let path = if dtensor_runtime::comm::cuda_threads::device_path_from_env() {
        "device-to-device"
    } else {
        "host-staged (DTENSOR_CUDA_THREADS_STAGE=host)"
    };
    println!(
        "GPUCHECK {test} | PASS | {total} collectives over 1-4 ranks, {path}: copies bit-exact vs the host buffers, \
         reductions bit-exact (NaN = any NaN) vs the host fold in group order (f32 x5 ops, bf16/f64/i64)"
    );
}

/// Issue 32: the overlapped gradient reduction of device gradients runs on device buffers
/// (the started all-reduce takes them; nothing is copied to the host by the reducer). On
/// cuda-threads, 2 ranks × 2 mesh dims: gradients of `sum((x @ w)^2)` for a replicated and a
/// column-sharded weight, overlapped (every bucket size) against plain backward: equal bit for
/// bit, and on the rank's device.
#[test]
fn cuda_threads_overlapped_grad_reduce_stays_on_the_device() {
    let test = "cuda_threads_overlapped_grad_reduce_stays_on_the_device";
    let out = dtensor_runtime::launch(dtensor_runtime::Launch::CudaThreads, 4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let x = distribute_tensor(global(&[6, 5], 3), &mesh, &[Shard(0), Replicate], Some(0))?;
        let mut seen = Vec::new();
        for bucket in [None, Some(0), Some(64), Some(usize::MAX)] {
            let w =
                distribute_tensor(global(&[5, 4], 7), &mesh, &[Replicate, Replicate], Some(0))?.requires_grad_(true);
            let v =
                distribute_tensor(global(&[5, 4], 11), &mesh, &[Replicate, Shard(1)], Some(0))?.requires_grad_(true);
            let y = x.matmul(&w)?.add(&x.matmul(&v)?.redistribute(&[Shard(0), Replicate])?)?;
            let l = y.mul(&y)?.sum()?;
            match bucket {
                None => l.backward()?,
                Some(b) => l.backward_opts(&dtensor_runtime::BackwardOptions::new().overlap_grad_reduce(b))?,
            }
            let mut grads = Vec::new();
            for p in [&w, &v] {
                let g = p.grad().expect("a gradient");
                assert!(matches!(g.device(), Device::Cuda(_)), "{test}: gradient on {:?}", g.device());
                grads.push(g.full_tensor()?.iter().map(|v| v.to_bits()).collect::<Vec<u64>>());
            }
            seen.push(grads);
        }
        assert!(seen.iter().all(|g| *g == seen[0]), "{test}: overlapped gradients differ from plain backward");
        Ok(())
    });
    match out {
        Ok(v) => println!(
            "GPUCHECK {test} | PASS | {} ranks, 3 bucket sizes: bit-identical to plain backward, on the device",
            v.len()
        ),
        Err(e) => {
            assert!(matches!(e, Error::Unavailable { .. } | Error::TooFewDevices { .. }), "{test}: {e:?}");
            println!("GPUCHECK {test} | SKIP | {e}");
        }
    }
}
