//! Every kernel of the storage surface on a CUDA device against the host kernels of the same op
//! enums (f64 bit-exact where both devices compute the same IEEE operations, else a relative
//! tolerance), Philox fills bit for bit, pack plans, and a small model's forward, backward and
//! optimizer steps on a one-rank CUDA mesh against the same on a one-rank host mesh.
//!
//! Each test prints one `GPUCHECK name | result | detail` line (scripts/gpu-check.sh collects
//! them). Without a CUDA driver or device every test prints the reason and passes.
#![cfg(feature = "cuda")]

mod common;
mod cuda_device;
mod one_rank_comm;

use common::{adamw_step_at, cat_shapes, global};
use cuda_device::{device, down as host, up};
use dtensor_runtime::cuda::CudaDevice;
use dtensor_runtime::layout::pack;
use dtensor_runtime::module::{distribute_module, Forward, Linear, Module};
use dtensor_runtime::ndarray::{ArrayD, Axis, IxDyn};
use dtensor_runtime::op::{BinaryOp, Distribution, RandomFill, Reduction, SgdStep, SoftmaxKind, UnaryOp};
use dtensor_runtime::optim::{AdamW, Sgd};
use dtensor_runtime::storage::CudaStorage;
use dtensor_runtime::Target;
use dtensor_runtime::{
    bf16, distribute_tensor, f16, manual_seed, rand, randn, DTensor, Device, DeviceMesh, Element, Error, Replicate,
    Scalar, Storage, TensorOptions,
};
use one_rank_comm::OneRankComm;
use std::sync::Arc;

/// Largest `|a - b| / (1 + |b|)` (NaN-aware: NaN only matches NaN); panics on a shape mismatch.
fn rel_err<T: Element>(a: &ArrayD<T>, b: &ArrayD<T>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let (x, y) = (x.as_f64(), y.as_f64());
            match (x.is_nan(), y.is_nan()) {
                (true, true) => 0.0,
                (false, false) if x == y => 0.0,
                (false, false) => (x - y).abs() / (1.0 + y.abs()),
                _ => f64::INFINITY,
            }
        })
        .fold(0.0, f64::max)
}

/// Same bits (NaN payloads aside).
fn same_bits<T: Element>(a: &ArrayD<T>, b: &ArrayD<T>) -> bool {
    a.shape() == b.shape() && a.iter().zip(b).all(|(&x, &y)| x == y || (x.is_nan() && y.is_nan()))
}

fn f32s(a: &ArrayD<f64>) -> ArrayD<f32> {
    a.mapv(|v| v as f32)
}

#[test]
fn unary_ops_and_their_gradients() {
    let Some(dev) = device("unary_ops_and_their_gradients") else { return };
    let x = global(&[37, 29], 1).mapv(|v| v / 12.0); // in [-4, 4]
    let pos = x.mapv(|v| v.abs() + 0.25);
    let ops = [
        (UnaryOp::Neg, true, false),
        (UnaryOp::Exp, false, false),
        (UnaryOp::Log, false, true),
        (UnaryOp::Relu, true, false),
        (UnaryOp::Gelu, false, false),
        (UnaryOp::Tanh, false, false),
        (UnaryOp::Sqrt, true, true),
        (UnaryOp::AddScalar(1.25), true, false),
        (UnaryOp::MulScalar(-0.75), true, false),
        (UnaryOp::ReluGrad, true, false),
        (UnaryOp::GeluGrad, false, false),
        (UnaryOp::TanhGrad, true, false),
        (UnaryOp::SqrtGrad, true, true),
        (UnaryOp::Silu, false, false),
        (UnaryOp::SiluGrad, false, false),
        (UnaryOp::Sigmoid, false, false),
        (UnaryOp::SigmoidGrad, true, false),
        (UnaryOp::Softplus { beta: 1.5, threshold: 2.0 }, false, false),
        (UnaryOp::SoftplusGrad { beta: 1.5, threshold: 2.0 }, false, false),
        (UnaryOp::Pow(2.5), false, true),
        (UnaryOp::PowGrad(2.5), false, true),
        (UnaryOp::PowGrad(0.0), true, true),
        (UnaryOp::Rsqrt, true, true),
        (UnaryOp::RsqrtGrad, true, false),
        (UnaryOp::Abs, true, false),
        (UnaryOp::Sign, true, false),
        (UnaryOp::Clamp { lo: -0.25, hi: 0.5 }, true, false),
        (UnaryOp::Clamp { lo: 0.5, hi: -0.25 }, true, false),
        (UnaryOp::ClampGrad { lo: -0.25, hi: 0.5 }, true, false),
        (UnaryOp::GeluErf, false, false),
        (UnaryOp::GeluErfGrad, false, false),
        (UnaryOp::DropoutScale(0.3), true, false),
        (UnaryOp::NonZero, true, false),
    ];
    let (mut worst64, mut worst32) = (0.0f64, 0.0f64);
    for (op, exact, positive) in ops {
        let input = if positive { &pos } else { &x };
        let want = host(Storage::Cpu(input.clone()).unary(op).unwrap());
        let got = host(up(&dev, input).unary(op).unwrap());
        let want32 = host(Storage::Cpu(f32s(input)).unary(op).unwrap());
        let got32 = host(up(&dev, &f32s(input)).unary(op).unwrap());
        if exact {
            assert!(same_bits(&got, &want), "{op} f64 not bit-exact");
            assert!(same_bits(&got32, &want32), "{op} f32 not bit-exact");
        } else {
            let (e64, e32) = (rel_err(&got, &want), rel_err(&got32, &want32));
            assert!(e64 <= 1e-14, "{op} f64 error {e64:e}");
            assert!(e32 <= 1e-6, "{op} f32 error {e32:e}");
            worst64 = worst64.max(e64);
            worst32 = worst32.max(e32);
        }
    }
    println!(
        "GPUCHECK unary_ops_and_their_gradients | PASS | {} ops x f32/f64; exact ones bit-exact, transcendental max rel err f64 {worst64:.1e} f32 {worst32:.1e}",
        ops.len()
    );
}

#[test]
fn binary_ops_broadcast_by_strides() {
    let Some(dev) = device("binary_ops_broadcast_by_strides") else { return };
    let pairs: [(&[usize], &[usize]); 6] = [
        (&[2, 3, 4], &[3, 1]),
        (&[4, 1], &[1, 5]),
        (&[5], &[2, 5]),
        (&[], &[3]),
        (&[0, 3], &[1, 3]),
        (&[6, 7], &[6, 7]),
    ];
    let mut cases = 0;
    for (sa, sb) in pairs {
        let a = global(sa, 2).mapv(|v| v / 8.0);
        let b = global(sb, 3).mapv(|v| if v == 0.0 { 0.5 } else { v / 4.0 });
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Eq,
            BinaryOp::Ne,
            BinaryOp::Lt,
            BinaryOp::Le,
            BinaryOp::Gt,
            BinaryOp::Ge,
            BinaryOp::Maximum,
            BinaryOp::Minimum,
        ] {
            let want = host(Storage::Cpu(a.clone()).binary(op, &Storage::Cpu(b.clone())).unwrap());
            let got = host(up(&dev, &a).binary(op, &up(&dev, &b)).unwrap());
            assert!(same_bits(&got, &want), "{op} {sa:?} {sb:?} f64");
            let want32 = host(Storage::Cpu(f32s(&a)).binary(op, &Storage::Cpu(f32s(&b))).unwrap());
            let got32 = host(up(&dev, &f32s(&a)).binary(op, &up(&dev, &f32s(&b))).unwrap());
            assert!(same_bits(&got32, &want32), "{op} {sa:?} {sb:?} f32");
            cases += 2;
        }
    }
    let bad = up(&dev, &global(&[2, 3], 0)).binary(BinaryOp::Add, &up(&dev, &global(&[4], 0)));
    assert!(matches!(bad, Err(Error::ShapeMismatch { .. })), "{bad:?}");
    let mixed = up(&dev, &global(&[2, 3], 0)).binary(BinaryOp::Add, &Storage::Cpu(global(&[2, 3], 0)));
    assert!(matches!(mixed, Err(Error::DeviceMismatch { .. })), "{mixed:?}");
    println!("GPUCHECK binary_ops_broadcast_by_strides | PASS | {cases} cases (12 ops, 6 shape pairs incl. 0-d and empty, f32/f64) bit-exact");
}

#[test]
fn reductions_over_dims_and_nan() {
    let Some(dev) = device("reductions_over_dims_and_nan") else { return };
    let a = global(&[3, 4, 70], 4).mapv(|v| v / 3.0);
    let dims: [&[usize]; 7] = [&[0], &[1], &[2], &[0, 2], &[1, 2], &[0, 1, 2], &[]];
    let mut worst = 0.0f64;
    for kind in [Reduction::Sum, Reduction::Mean, Reduction::Max, Reduction::Min] {
        for d in dims {
            for keep in [false, true] {
                let want = host(Storage::Cpu(a.clone()).reduce(kind, d, keep).unwrap());
                let got = host(up(&dev, &a).reduce(kind, d, keep).unwrap());
                let want32 = host(Storage::Cpu(f32s(&a)).reduce(kind, d, keep).unwrap());
                let got32 = host(up(&dev, &f32s(&a)).reduce(kind, d, keep).unwrap());
                if matches!(kind, Reduction::Max | Reduction::Min) {
                    assert!(same_bits(&got, &want) && same_bits(&got32, &want32), "{kind:?} {d:?}");
                } else {
                    // Summation order differs (tree vs sequential).
                    let (e, e32) = (rel_err(&got, &want), rel_err(&got32, &want32));
                    assert!(e <= 1e-13 && e32 <= 1e-5, "{kind:?} {d:?} keepdim {keep}: {e:e} / {e32:e}");
                    worst = worst.max(e32);
                }
            }
        }
    }
    // NaN propagates through max and min; empty dims give the identities.
    let mut n = global(&[4, 5], 5);
    n[[2, 3]] = f64::NAN;
    for kind in [Reduction::Max, Reduction::Min, Reduction::Sum] {
        let want = host(Storage::Cpu(n.clone()).reduce(kind, &[1], false).unwrap());
        let got = host(up(&dev, &n).reduce(kind, &[1], false).unwrap());
        assert!(got[[2]].is_nan() && same_bits(&got, &want), "{kind:?} with NaN: {got:?}");
    }
    let e = ArrayD::<f64>::zeros(IxDyn(&[3, 0]));
    for kind in [Reduction::Sum, Reduction::Max, Reduction::Min] {
        let want = host(Storage::Cpu(e.clone()).reduce(kind, &[1], false).unwrap());
        assert!(same_bits(&host(up(&dev, &e).reduce(kind, &[1], false).unwrap()), &want), "{kind:?} empty");
    }
    println!("GPUCHECK reductions_over_dims_and_nan | PASS | sum/mean/max/min x 7 dim sets x keepdim; max/min exact, NaN propagates; sum f32 rel err {worst:.1e}");
}

#[test]
fn softmax_and_log_softmax_with_backward() {
    let Some(dev) = device("softmax_and_log_softmax_with_backward") else { return };
    let mut worst = 0.0f64;
    for shape in [&[3usize, 5, 7][..], &[2, 1000], &[1]] {
        let x = global(shape, 6).mapv(|v| v / 10.0);
        let g = global(shape, 7).mapv(|v| v / 30.0);
        for dim in 0..shape.len() {
            for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
                let y = Storage::Cpu(x.clone()).softmax(dim, kind).unwrap();
                let gx = host(y.softmax_backward(&Storage::Cpu(g.clone()), dim, kind).unwrap());
                let dy = up(&dev, &x).softmax(dim, kind).unwrap();
                let dgx = host(dy.softmax_backward(&up(&dev, &g), dim, kind).unwrap());
                let (ef, eb) = (rel_err(&host(dy), y.as_cpu().unwrap()), rel_err(&dgx, &gx));
                assert!(ef <= 1e-14 && eb <= 1e-14, "{kind:?} dim {dim} of {shape:?}: {ef:e} {eb:e}");
                let y32 = host(Storage::Cpu(f32s(&x)).softmax(dim, kind).unwrap());
                let d32 = host(up(&dev, &f32s(&x)).softmax(dim, kind).unwrap());
                let e32 = rel_err(&d32, &y32);
                assert!(e32 <= 1e-5, "{kind:?} f32 dim {dim}: {e32:e}");
                worst = worst.max(e32);
            }
        }
    }
    println!("GPUCHECK softmax_and_log_softmax_with_backward | PASS | 3 shapes, every dim, fwd+bwd f64 rel <= 1e-14, f32 fwd {worst:.1e}");
}

#[test]
fn matmul_gemm_and_strided_batched() {
    let Some(dev) = device("matmul_gemm_and_strided_batched") else { return };
    let cases: [(&[usize], &[usize]); 5] = [
        (&[5, 7], &[7, 3]),
        (&[2, 5, 7], &[7, 3]),
        (&[2, 5, 7], &[2, 7, 3]),
        (&[3, 2, 64, 48], &[3, 2, 48, 40]),
        (&[3, 0], &[0, 4]),
    ];
    let mut worst = 0.0f64;
    for (sa, sb) in cases {
        let (a, b) = (global(sa, 8).mapv(|v| v / 16.0), global(sb, 9).mapv(|v| v / 16.0));
        let want = host(Storage::Cpu(a.clone()).matmul(&Storage::Cpu(b.clone())).unwrap());
        let got = host(up(&dev, &a).matmul(&up(&dev, &b)).unwrap());
        assert!(rel_err(&got, &want) <= 1e-13, "f64 {sa:?}@{sb:?}");
        let got32 = host(up(&dev, &f32s(&a)).matmul(&up(&dev, &f32s(&b))).unwrap()).mapv(|v| v as f64);
        let e = rel_err(&got32, &want);
        assert!(e <= 1e-4, "f32 {sa:?}@{sb:?}: {e:e}");
        worst = worst.max(e);
    }
    println!("GPUCHECK matmul_gemm_and_strided_batched | PASS | 2-D, batched lhs, strided-batched (3-D, 4-D), empty k; f32 rel err {worst:.1e}");
}

#[test]
fn pack_plans_transpose_slice_pad_broadcast() {
    let Some(dev) = device("pack_plans_transpose_slice_pad_broadcast") else { return };
    let a = global(&[5, 6, 7], 10);
    let (c, d) = (Storage::Cpu(a.clone()), up(&dev, &a));
    let mut n = 0;
    let mut check = |name: &str, w: Storage<f64>, g: Storage<f64>| {
        assert!(same_bits(&host(g), &host(w)), "{name}");
        n += 1;
    };
    check("transpose", c.transpose(0, 2).unwrap(), d.transpose(0, 2).unwrap());
    check("permute", c.permute(&[1, 2, 0]).unwrap(), d.permute(&[1, 2, 0]).unwrap());
    check("slice", c.slice(&[1, 2, 3], &[3, 4, 2]).unwrap(), d.slice(&[1, 2, 3], &[3, 4, 2]).unwrap());
    let row = global(&[1, 7], 11);
    check(
        "broadcast",
        Storage::Cpu(row.clone()).broadcast_to(&[5, 6, 7]).unwrap(),
        up(&dev, &row).broadcast_to(&[5, 6, 7]).unwrap(),
    );
    // Redistribution's plans: uneven splits padded to the chunk size, and joins back.
    for (dim, parts) in [(0usize, 2usize), (1, 4), (2, 3), (0, 8)] {
        let chunk = a.shape()[dim].div_ceil(parts);
        let mut block = a.shape().to_vec();
        block[dim] = chunk;
        let split = pack::split(a.shape(), dim, parts, &block);
        check("split", c.pack(&split).unwrap(), d.pack(&split).unwrap());
        let join = pack::join(&block, parts, dim, a.shape());
        let packed = c.pack(&split).unwrap();
        let dpacked = d.pack(&split).unwrap();
        check("join", packed.pack(&join).unwrap(), dpacked.pack(&join).unwrap());
        assert_eq!(host(dpacked.pack(&join).unwrap()), a, "split+join is the identity");
    }
    let empty = ArrayD::<f64>::zeros(IxDyn(&[0, 3]));
    let p = pack::split(&[0, 3], 0, 2, &[1, 3]);
    check("empty", Storage::Cpu(empty.clone()).pack(&p).unwrap(), up(&dev, &empty).pack(&p).unwrap());
    println!("GPUCHECK pack_plans_transpose_slice_pad_broadcast | PASS | {n} plans (transpose, permute, slice, broadcast, padded splits, joins, empty) bit-exact");
}

#[test]
fn embedding_gather_scatter_add_one_hot() {
    let Some(dev) = device("embedding_gather_scatter_add_one_hot") else { return };
    let table = global(&[6, 5], 12);
    let ids = ArrayD::from_shape_vec(IxDyn(&[2, 4]), vec![3i64, 0, 7, 3, 9, 2, 3, 8]).unwrap();
    let g = global(&[2, 4, 5], 13).mapv(|v| v / 7.0);
    // The shard holding rows 2..8 of a 10-row table.
    let (ct, dt) = (Storage::Cpu(table.clone()), up(&dev, &table));
    let (ci, di) = (Storage::Cpu(ids.clone()), up(&dev, &ids));
    assert!(same_bits(&host(dt.embedding(&di, 2, 10).unwrap()), &host(ct.embedding(&ci, 2, 10).unwrap())));
    let want = host(Storage::Cpu(g.clone()).embedding_backward(&ci, 6, 2, 10).unwrap());
    let got = host(up(&dev, &g).embedding_backward(&di, 6, 2, 10).unwrap());
    // Duplicate ids add in any order on the device.
    assert!(rel_err(&got, &want) <= 1e-15, "embedding_backward");
    assert!(same_bits(&host(di.one_hot::<f64>(10).unwrap()), &host(ci.one_hot::<f64>(10).unwrap())));
    for bad in [vec![-1i64], vec![10], vec![i64::MIN], vec![1 << 40]] {
        let b = up(&dev, &ArrayD::from_shape_vec(IxDyn(&[1]), bad.clone()).unwrap());
        assert!(matches!(dt.embedding(&b, 2, 10), Err(Error::InvalidArgument { .. })), "{bad:?}");
        assert!(matches!(
            up(&dev, &global(&[1, 5], 0)).embedding_backward(&b, 6, 2, 10),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(b.one_hot::<f64>(10), Err(Error::InvalidArgument { .. })), "{bad:?}");
    }
    println!("GPUCHECK embedding_gather_scatter_add_one_hot | PASS | gather exact, atomicAdd scatter rel <= 1e-15, one_hot exact, 4 bad ids typed");
}

/// Every case of `indexing_ops_match_the_host` in one element type: the device result bit for
/// bit against the host's (copies, and sums in the host's order), or both the same typed error.
fn indexing_cases<T: Element>(dev: &Arc<CudaDevice>) -> usize {
    let v = |shape: &[usize], seed: u64, scale: f64| global(shape, seed).mapv(|x| T::of_f64(x * scale));
    let ids =
        |shape: &[usize], n: usize, seed: u64| global(shape, seed).mapv(|x| (x + 48.0).rem_euclid(n as f64) as i64);
    // argmax / argmin: i64 indices, exact (a lane of 300: in bf16 an index above 256 would round).
    let mut a = v(&[7, 300, 5], 25, 1.0 / 16.0).mapv(|x| T::of_f64(x.as_f64().floor()));
    a[[1, 200, 3]] = T::nan();
    a[[2, 257, 1]] = T::of_f64(1e3);
    let mut cases = 0;
    for dim in 0..3 {
        for (max, keep) in [(true, false), (false, true)] {
            let want = Storage::Cpu(a.clone()).arg_reduce(dim, max, keep).unwrap().into_host().unwrap();
            let got = up(dev, &a).arg_reduce(dim, max, keep).unwrap().into_host().unwrap();
            assert_eq!(got, want, "arg_reduce dim {dim} max {max}");
            cases += 1;
        }
    }
    let mut check = |what: String, want: Result<Storage<T>, Error>, got: Result<Storage<T>, Error>| {
        match (want, got) {
            (Ok(w), Ok(g)) => assert!(same_bits(&host(g), &host(w)), "{what}"),
            (Err(w), Err(g)) => {
                assert_eq!(std::mem::discriminant(&w), std::mem::discriminant(&g), "{what}: {w} vs {g}")
            }
            (w, g) => panic!("{what}: host {:?} vs device {:?}", w.map(|_| ()), g.map(|_| ())),
        }
        cases += 1;
    };
    let shapes: [(&[usize], &[usize], &[usize]); 4] =
        [(&[2, 3, 4], &[3, 1], &[4]), (&[4, 1], &[1, 5], &[]), (&[33, 17], &[33, 17], &[17]), (&[0, 3], &[3], &[1])];
    for (sc, sa, sb) in shapes {
        let mut c = v(sc, 21, 1.0).mapv(|x| if x.as_f64().rem_euclid(3.0) == 0.0 { T::zero() } else { x });
        if let Some(x) = c.iter_mut().nth(1) {
            *x = T::nan();
        }
        let (a, b) = (v(sa, 22, 0.5), v(sb, 23, 0.25));
        let want = Storage::Cpu(c.clone()).where_(&Storage::Cpu(a.clone()), &Storage::Cpu(b.clone()));
        check(format!("where {sc:?} {sa:?} {sb:?}"), want, up(dev, &c).where_(&up(dev, &a), &up(dev, &b)));
    }
    for shape in [&[37usize, 29][..], &[2, 5, 4], &[0, 4]] {
        let a = v(shape, 24, 1.0);
        for (lower, diagonal, row0, col0) in [(true, 0, 0, 0), (true, -2, 8, 4), (false, 1, 0, 8), (false, 3, 5, 0)] {
            let want = Storage::Cpu(a.clone()).tri(lower, diagonal, row0, col0);
            check(format!("tri {shape:?}"), want, up(dev, &a).tri(lower, diagonal, row0, col0));
        }
    }
    for dim in 0..3 {
        let parts: Vec<ArrayD<T>> =
            cat_shapes(&[2, 3, 4], dim, &[3, 0, 1, 2]).iter().map(|sh| v(sh, 30 + sh[dim] as u64, 1.0)).collect();
        let (hp, dp): (Vec<Storage<T>>, Vec<Storage<T>>) =
            parts.iter().map(|p| (Storage::Cpu(p.clone()), up(dev, p))).unzip();
        let want = Storage::cat(&hp.iter().collect::<Vec<_>>(), dim);
        check(format!("cat dim {dim}"), want, Storage::cat(&dp.iter().collect::<Vec<_>>(), dim));
    }
    let a = v(&[4, 5, 3], 40, 1.0 / 7.0);
    for dim in 0..3 {
        let len = a.shape()[dim];
        for nids in [0usize, 7] {
            let i = ids(&[nids], len, 41);
            let (hi, di) = (Storage::Cpu(i.clone()), up(dev, &i));
            check(
                format!("index_select dim {dim}"),
                Storage::Cpu(a.clone()).index_select(dim, &hi),
                up(dev, &a).index_select(dim, &di),
            );
            let mut gs = a.shape().to_vec();
            gs[dim] = nids;
            let g = v(&gs, 42, 1.0 / 3.0);
            let (want, got) =
                (Storage::Cpu(g.clone()).index_add(dim, &hi, len + 1), up(dev, &g).index_add(dim, &di, len + 1));
            check(format!("index_add dim {dim}"), want, got);
        }
        for ishape in [[3usize, 6, 2], [2, 0, 3]] {
            let mut ishape = ishape.to_vec();
            ishape.swap(1, dim);
            let i = ids(&ishape, len, 50);
            let (hi, di) = (Storage::Cpu(i.clone()), up(dev, &i));
            check(format!("gather dim {dim}"), Storage::Cpu(a.clone()).gather(dim, &hi), up(dev, &a).gather(dim, &di));
            let g = v(&ishape, 51, 1.0 / 5.0);
            let want = Storage::Cpu(g.clone()).scatter_add(dim, &hi, a.shape());
            check(format!("scatter_add dim {dim}"), want, up(dev, &g).scatter_add(dim, &di, a.shape()));
        }
    }
    // Invalid ids: the host's typed error on the device too, for every indexing op.
    for bad in [-1i64, 4, i64::MIN, i64::MAX] {
        let i = ArrayD::from_shape_vec(IxDyn(&[2]), vec![0, bad]).unwrap();
        let i2 = i.clone().into_shape_with_order(IxDyn(&[1, 2])).unwrap();
        let (hi, di, hi2, di2) = (Storage::Cpu(i.clone()), up(dev, &i), Storage::Cpu(i2.clone()), up(dev, &i2));
        let a = v(&[4, 2], 3, 1.0);
        let g = v(&[1, 2], 4, 1.0);
        check(
            format!("index_select id {bad}"),
            Storage::Cpu(a.clone()).index_select(0, &hi),
            up(dev, &a).index_select(0, &di),
        );
        check(
            format!("index_add id {bad}"),
            Storage::Cpu(a.clone()).index_add(1, &hi, 4),
            up(dev, &a).index_add(1, &di, 4),
        );
        check(format!("gather id {bad}"), Storage::Cpu(a.clone()).gather(0, &hi2), up(dev, &a).gather(0, &di2));
        let want = Storage::Cpu(g.clone()).scatter_add(0, &hi2, &[4, 2]);
        check(format!("scatter_add id {bad}"), want, up(dev, &g).scatter_add(0, &di2, &[4, 2]));
    }
    cases
}

#[test]
fn indexing_ops_match_the_host() {
    let Some(dev) = device("indexing_ops_match_the_host") else { return };
    let n = indexing_cases::<f64>(&dev)
        + indexing_cases::<f32>(&dev)
        + indexing_cases::<bf16>(&dev)
        + indexing_cases::<f16>(&dev);
    println!("GPUCHECK indexing_ops_match_the_host | PASS | {n} cases of where, tril/triu, argmax/argmin, cat, index_select, index_add, gather, scatter_add (uneven, empty, bad ids) bit-exact or the same typed error, f32/f64/bf16/f16");
}

/// The copy kernels of one dtype on the device against the host, bit for bit.
fn copy_cases<T: Scalar>(dev: &Arc<CudaDevice>) -> usize {
    let v = |shape: &[usize], seed: u64| global(shape, seed).mapv(|x| T::of_f64(x + 48.0));
    let dup = |a: &ArrayD<T>| Storage::Cuda(CudaStorage::from_host(dev, a).unwrap());
    let a = v(&[5, 6, 7], 60);
    let mut cases = 0;
    let mut plans = vec![pack::permute(&[5, 6, 7], &[2, 0, 1]), pack::pad(&[5, 6, 7], &[6, 8, 7], &[1, 1, 0])];
    for (dim, parts) in [(0usize, 2usize), (1, 4), (0, 8)] {
        let mut block: Vec<usize> = vec![5, 6, 7];
        block[dim] = block[dim].div_ceil(parts);
        plans.push(pack::split(&[5, 6, 7], dim, parts, &block));
    }
    for plan in &plans {
        let want = Storage::Cpu(a.clone()).pack(plan).unwrap().into_host().unwrap();
        assert_eq!(dup(&a).pack(plan).unwrap().into_host().unwrap(), want, "pack {plan:?} {}", T::DTYPE);
        cases += 1;
    }
    for dim in 0..3 {
        let parts: Vec<ArrayD<T>> =
            cat_shapes(&[2, 3, 4], dim, &[3, 0, 2]).iter().map(|sh| v(sh, 61 + sh[dim] as u64)).collect();
        let (hp, dp): (Vec<Storage<T>>, Vec<Storage<T>>) =
            parts.iter().map(|p| (Storage::Cpu(p.clone()), dup(p))).unzip();
        let want = Storage::cat(&hp.iter().collect::<Vec<_>>(), dim).unwrap().into_host().unwrap();
        let got = Storage::cat(&dp.iter().collect::<Vec<_>>(), dim).unwrap().into_host().unwrap();
        assert_eq!(got, want, "cat dim {dim} {}", T::DTYPE);
        cases += 1;
    }
    // index_select and gather only move elements: every dtype, at i64 ids.
    let a = v(&[4, 5, 3], 62);
    for dim in 0..3 {
        let len = a.shape()[dim];
        let i = global(&[7], 63).mapv(|x| (x + 48.0).rem_euclid(len as f64) as i64);
        let (hi, di) = (Storage::Cpu(i.clone()), up(dev, &i));
        let want = Storage::Cpu(a.clone()).index_select(dim, &hi).unwrap().into_host().unwrap();
        assert_eq!(dup(&a).index_select(dim, &di).unwrap().into_host().unwrap(), want, "index_select {}", T::DTYPE);
        let mut ishape = vec![3usize, 6, 2];
        ishape.swap(1, dim);
        let i = global(&ishape, 64).mapv(|x| (x + 48.0).rem_euclid(len as f64) as i64);
        let (hi, di) = (Storage::Cpu(i.clone()), up(dev, &i));
        let want = Storage::Cpu(a.clone()).gather(dim, &hi).unwrap().into_host().unwrap();
        assert_eq!(dup(&a).gather(dim, &di).unwrap().into_host().unwrap(), want, "gather {}", T::DTYPE);
        cases += 2;
    }
    let target = Target::Cuda(Arc::clone(dev));
    let want = ArrayD::from_elem(IxDyn(&[3, 4]), T::of_f64(7.0));
    assert_eq!(Storage::<T>::full(&target, &[3, 4], T::of_f64(7.0)).unwrap().into_host().unwrap(), want);
    cases + 1
}

#[test]
fn copy_kernels_of_every_dtype() {
    let Some(dev) = device("copy_kernels_of_every_dtype") else { return };
    let n = copy_cases::<f32>(&dev)
        + copy_cases::<f64>(&dev)
        + copy_cases::<bf16>(&dev)
        + copy_cases::<f16>(&dev)
        + copy_cases::<i64>(&dev)
        + copy_cases::<i32>(&dev)
        + copy_cases::<u8>(&dev);
    println!("GPUCHECK copy_kernels_of_every_dtype | PASS | {n} fill/pack/cat/index_select/gather cases of f32 f64 bf16 f16 i64 i32 u8 bit-exact vs host");
}

/// The unary and binary ops of a 16-bit float on the device against the host: every bit
/// pattern through the exact ops bit for bit, the transcendental ones within `ulp`.
fn half_cases<T: Element>(dev: &Arc<CudaDevice>, from_bits: fn(u16) -> T, ulp: f64) -> usize {
    let all = ArrayD::from_shape_vec(IxDyn(&[256, 256]), (0..=u16::MAX).map(from_bits).collect()).unwrap();
    let x = global(&[37, 29], 1).mapv(|v| T::of_f64(v / 12.0));
    let mut cases = 0;
    let exact = [UnaryOp::MulScalar(1.0 + 1.0 / 3.0), UnaryOp::AddScalar(0.1), UnaryOp::Abs, UnaryOp::Sqrt];
    for op in exact {
        let want = host(Storage::Cpu(all.clone()).unary(op).unwrap());
        assert!(same_bits(&host(up(dev, &all).unary(op).unwrap()), &want), "{op} {} every bit pattern", T::DTYPE);
        cases += 1;
    }
    for op in [UnaryOp::Exp, UnaryOp::Gelu, UnaryOp::Tanh, UnaryOp::GeluErf] {
        let want = host(Storage::Cpu(x.clone()).unary(op).unwrap());
        let err = rel_err(&host(up(dev, &x).unary(op).unwrap()), &want);
        assert!(err <= ulp, "{op} {} error {err:e}", T::DTYPE);
        cases += 1;
    }
    let b = global(&[256], 3).mapv(|v| T::of_f64(v / 4.0 + 0.5));
    for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Lt, BinaryOp::Maximum] {
        let want = host(Storage::Cpu(all.clone()).binary(op, &Storage::Cpu(b.clone())).unwrap());
        assert!(same_bits(&host(up(dev, &all).binary(op, &up(dev, &b)).unwrap()), &want), "{op} {}", T::DTYPE);
        cases += 1;
    }
    cases
}

#[test]
fn half_float_unary_and_binary() {
    let Some(dev) = device("half_float_unary_and_binary") else { return };
    let n = half_cases(&dev, bf16::from_bits, 1.0 / 128.0) + half_cases(&dev, f16::from_bits, 1.0 / 1024.0);
    println!("GPUCHECK half_float_unary_and_binary | PASS | {n} bf16/f16 cases: exact ops over all 65536 bit patterns bit-exact vs host, transcendental within one rounding step");
}

/// `a` cast to `B` on the device against the host (bit for bit, NaN payloads aside).
fn cast_matches<A: Scalar, B: Scalar>(dev: &Arc<CudaDevice>, a: &ArrayD<A>) -> usize {
    let want = Storage::Cpu(a.clone()).cast::<B>().unwrap().into_host().unwrap();
    let src = Storage::Cuda(CudaStorage::from_host(dev, a).unwrap());
    let got = src.cast::<B>().unwrap().into_host().unwrap();
    let nan = |x: &B| x.as_f64().is_nan();
    let differs = |(x, y): (&B, &B)| bytemuck::bytes_of(x) != bytemuck::bytes_of(y) && !(nan(x) && nan(y));
    let at = got.iter().zip(&want).position(differs);
    assert!(at.is_none(), "cast {} -> {} differs at {at:?}", A::DTYPE, B::DTYPE);
    1
}

/// `a` cast to every dtype on the device against the host.
fn casts_from<A: Scalar>(dev: &Arc<CudaDevice>, a: &ArrayD<A>) -> usize {
    cast_matches::<A, f32>(dev, a)
        + cast_matches::<A, f64>(dev, a)
        + cast_matches::<A, bf16>(dev, a)
        + cast_matches::<A, f16>(dev, a)
        + cast_matches::<A, i64>(dev, a)
        + cast_matches::<A, i32>(dev, a)
        + cast_matches::<A, u8>(dev, a)
}

#[test]
fn casts_between_every_float() {
    let Some(dev) = device("casts_between_every_float") else { return };
    let b = ArrayD::from_shape_vec(IxDyn(&[65536]), (0..=u16::MAX).map(bf16::from_bits).collect()).unwrap();
    let h = ArrayD::from_shape_vec(IxDyn(&[65536]), (0..=u16::MAX).map(f16::from_bits).collect()).unwrap();
    // Every high half with low halves at bf16's rounding points, which are also f16's.
    let w: Vec<f32> = (0..=u16::MAX as u32)
        .flat_map(|hi| {
            [0u32, 1, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001].map(|lo| f32::from_bits((hi << 16) | lo))
        })
        .collect();
    let f = ArrayD::from_shape_vec(IxDyn(&[w.len()]), w).unwrap();
    let d = f.mapv(|x| f64::from(x) * (1.0 + 1e-12));
    let n = casts_from(&dev, &b) + casts_from(&dev, &h) + casts_from(&dev, &f) + casts_from(&dev, &d);
    println!("GPUCHECK casts_between_every_float | PASS | {n} casts from f32 f64 bf16 f16 to every dtype bit-exact vs host (NaN payloads aside) over every 16-bit pattern and f32/f64 rounding points");
}

#[test]
fn cast_and_fill() {
    let Some(dev) = device("cast_and_fill") else { return };
    let a = global(&[9, 11], 14).mapv(|v| v / 3.0 + 1e-9);
    let d = up(&dev, &a);
    assert!(same_bits(&host(d.cast::<f32>().unwrap()), &host(Storage::Cpu(a.clone()).cast::<f32>().unwrap())));
    let d32 = d.cast::<f32>().unwrap();
    assert!(same_bits(&host(d32.cast::<f64>().unwrap()), &host(d32.cast::<f32>().unwrap()).mapv(f64::from)));
    let target = Target::Cuda(Arc::clone(&dev));
    for v in [0.0, 2.5, -1e300] {
        assert_eq!(host(Storage::<f64>::full(&target, &[3, 4], v).unwrap()), ArrayD::from_elem(IxDyn(&[3, 4]), v));
    }
    assert_eq!(host(Storage::<f32>::full(&target, &[0, 4], 1.0).unwrap()).shape(), &[0, 4]);
    println!("GPUCHECK cast_and_fill | PASS | f64->f32->f64 bit-exact vs host, fills incl. empty");
}

#[test]
fn optimizer_updates_bit_exact() {
    let Some(dev) = device("optimizer_updates_bit_exact") else { return };
    fn run<T: Element>(dev: &Arc<CudaDevice>) {
        let w0 = global(&[7, 9], 15).mapv(|v| T::of_f64(v / 10.0));
        let g = global(&[7, 9], 16).mapv(|v| T::of_f64(v / 20.0));
        let sgd = [
            SgdStep { lr: 0.1, momentum: 0.0, weight_decay: 0.0, first: true },
            SgdStep { lr: 0.05, momentum: 0.9, weight_decay: 0.01, first: true },
            SgdStep { lr: 0.05, momentum: 0.9, weight_decay: 0.01, first: false },
        ];
        let (mut hw, mut dw) = (Storage::Cpu(w0.clone()), up(dev, &w0));
        let (mut hb, mut db) = (hw.new_full(&[7, 9], T::zero()).unwrap(), dw.new_full(&[7, 9], T::zero()).unwrap());
        let (hg, dg) = (Storage::Cpu(g.clone()), up(dev, &g));
        for s in sgd {
            let (hbuf, dbuf) = if s.momentum != 0.0 { (Some(&mut hb), Some(&mut db)) } else { (None, None) };
            hw.sgd_step(&hg, hbuf, &s).unwrap();
            dw.sgd_step(&dg, dbuf, &s).unwrap();
            assert!(same_bits(&host(dw.clone()), &host(hw.clone())), "sgd {s:?} {}", T::DTYPE);
        }
        let (mut hm, mut hv) = (hw.new_full(&[7, 9], T::zero()).unwrap(), hw.new_full(&[7, 9], T::zero()).unwrap());
        let (mut dm, mut dv) = (dw.new_full(&[7, 9], T::zero()).unwrap(), dw.new_full(&[7, 9], T::zero()).unwrap());
        for t in 1..=3 {
            let p = adamw_step_at(t);
            hw.adamw_step(&hg, &mut hm, &mut hv, &p).unwrap();
            dw.adamw_step(&dg, &mut dm, &mut dv, &p).unwrap();
            assert!(same_bits(&host(dw.clone()), &host(hw.clone())), "adamw step {t} {}", T::DTYPE);
            assert!(same_bits(&host(dv.clone()), &host(hv.clone())), "adamw v step {t}");
        }
        // A shared buffer is copied before the in-place update (the clone keeps its data).
        let before = dw.clone();
        let snapshot = host(before.clone());
        dw.sgd_step(&dg, None, &sgd[0]).unwrap();
        assert_eq!(host(before), snapshot);
    }
    run::<f64>(&dev);
    run::<f32>(&dev);
    run::<bf16>(&dev);
    run::<f16>(&dev);
    println!("GPUCHECK optimizer_updates_bit_exact | PASS | sgd (plain, momentum, first/later) and 3 adamw steps, f32/f64/bf16/f16 bit-exact");
}

#[test]
fn philox_fills_bit_identical_to_host() {
    let Some(dev) = device("philox_fills_bit_identical_to_host") else { return };
    let target = Target::Cuda(Arc::clone(&dev));
    let mut n = 0;
    for (seed, offset) in [(0u64, 0u64), (1234, 5), (u64::MAX, (1 << 32) - 3)] {
        for dist in [Distribution::Uniform, Distribution::Normal] {
            let fill = RandomFill { seed, offset, dist };
            let global_shape = [37usize, 41];
            for (off, shape) in [([0usize, 0], [37usize, 41]), ([5, 7], [13, 20]), ([36, 0], [1, 41])] {
                let h = Storage::<f64>::random(&Target::Cpu, &fill, &global_shape, &off, &shape).unwrap();
                let d = Storage::<f64>::random(&target, &fill, &global_shape, &off, &shape).unwrap();
                assert!(same_bits(&host(d), &host(h)), "f64 {fill:?} at {off:?}");
                let h32 = Storage::<f32>::random(&Target::Cpu, &fill, &global_shape, &off, &shape).unwrap();
                let d32 = Storage::<f32>::random(&target, &fill, &global_shape, &off, &shape).unwrap();
                assert!(same_bits(&host(d32), &host(h32)), "f32 {fill:?} at {off:?}");
                let hb = Storage::<bf16>::random(&Target::Cpu, &fill, &global_shape, &off, &shape).unwrap();
                let db = Storage::<bf16>::random(&target, &fill, &global_shape, &off, &shape).unwrap();
                assert!(same_bits(&host(db), &host(hb)), "bf16 {fill:?} at {off:?}");
                n += 3;
            }
        }
    }
    println!("GPUCHECK philox_fills_bit_identical_to_host | PASS | {n} fills (3 seeds/offsets x uniform/normal x 3 shards x f32/f64/bf16) bit-identical");
}

/// A one-rank mesh on `dev` and one on the host.
fn meshes(dev: &Arc<CudaDevice>) -> (DeviceMesh, DeviceMesh) {
    let cuda = OneRankComm { device: Device::Cuda(dev.ordinal()), handle: Some(Arc::clone(dev)) };
    let cpu = OneRankComm { device: Device::Cpu, handle: None };
    (DeviceMesh::new(Arc::new(cuda), &[1], &["x"]).unwrap(), DeviceMesh::new(Arc::new(cpu), &[1], &["x"]).unwrap())
}

struct Mlp {
    w1: Linear<f64>,
    w2: Linear<f64>,
}

impl Module<f64> for Mlp {
    fn named_parameters(&self) -> Vec<(String, &DTensor<f64>)> {
        let mut v = dtensor_runtime::module::prefixed("w1", self.w1.named_parameters());
        v.extend(dtensor_runtime::module::prefixed("w2", self.w2.named_parameters()));
        v
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<f64>)> {
        let mut v = dtensor_runtime::module::prefixed_mut("w1", self.w1.named_parameters_mut());
        v.extend(dtensor_runtime::module::prefixed_mut("w2", self.w2.named_parameters_mut()));
        v
    }
}

impl Forward<f64> for Mlp {
    fn forward(&self, x: &DTensor<f64>) -> dtensor_runtime::Result<DTensor<f64>> {
        self.w2.forward(&self.w1.forward(x)?.gelu()?.tanh()?)
    }
}

/// Losses and final weights of 5 training steps on `mesh`.
fn train(mesh: &DeviceMesh, adamw: bool) -> (Vec<f64>, Vec<ArrayD<f64>>) {
    manual_seed(77);
    let m = Mlp { w1: Linear::new(6, 9, true).unwrap(), w2: Linear::new(9, 4, true).unwrap() };
    let mut m = distribute_module(m, mesh, None, None, None).unwrap();
    let x = randn::<f64>(&[11, 6], &TensorOptions::new().mesh(mesh)).unwrap();
    let y = distribute_tensor(ArrayD::from_shape_fn(IxDyn(&[11]), |i| (i[0] % 4) as f64), mesh, &[Replicate], None)
        .unwrap();
    let (mut sgd, mut adam) = (Sgd::new(0.1).momentum(0.9), AdamW::new(0.01));
    let mut losses = vec![];
    for _ in 0..5 {
        m.zero_grad();
        let loss = m.forward(&x).unwrap().cross_entropy(&y).unwrap();
        loss.backward().unwrap();
        if adamw {
            adam.step(&mut m).unwrap();
        } else {
            sgd.step(&mut m).unwrap();
        }
        losses.push(loss.full_tensor().unwrap().sum());
    }
    (losses, m.named_parameters().into_iter().map(|(_, p)| p.full_tensor().unwrap()).collect())
}

#[test]
fn training_on_a_cuda_mesh_matches_the_host() {
    let Some(dev) = device("training_on_a_cuda_mesh_matches_the_host") else { return };
    let (cuda, cpu) = meshes(&dev);
    // Factories on the device mesh draw the host generator's numbers.
    manual_seed(5);
    let r = rand::<f32>(&[9, 10], &TensorOptions::new().mesh(&cuda)).unwrap();
    assert_eq!(r.device(), Device::Cuda(dev.ordinal()));
    manual_seed(5);
    let rh = rand::<f32>(&[9, 10], &TensorOptions::new().mesh(&cpu)).unwrap();
    assert!(same_bits(&r.full_tensor().unwrap(), &rh.full_tensor().unwrap()));
    let mut worst = 0.0f64;
    for adamw in [false, true] {
        let (ld, wd) = train(&cuda, adamw);
        let (lh, wh) = train(&cpu, adamw);
        assert!(lh[4] < lh[0], "the model learns: {lh:?}");
        for (a, b) in ld.iter().zip(&lh) {
            // cuBLAS and the host gemm sum in different orders; AdamW rescales small gradients.
            assert!((a - b).abs() <= 1e-10 * b.abs(), "losses {ld:?} vs {lh:?}");
        }
        for (a, b) in wd.iter().zip(&wh) {
            let e = rel_err(a, b);
            assert!(e <= 1e-9, "weights differ by {e:e}");
            worst = worst.max(e);
        }
    }
    println!("GPUCHECK training_on_a_cuda_mesh_matches_the_host | PASS | MLP (linear, gelu, tanh, cross-entropy) fwd+bwd, 5 sgd + 5 adamw steps f64; weights rel err {worst:.1e}");
}

/// Losses and final weights of 3 steps of a bf16 linear classifier (gelu, cross-entropy with
/// i64 targets) trained by SGD with momentum on f32 master weights (the AMP recipe) on `mesh`.
fn train_bf16(mesh: &DeviceMesh) -> (Vec<f64>, Vec<ArrayD<bf16>>) {
    manual_seed(78);
    let mut m = distribute_module(Linear::<bf16>::new(6, 4, true).unwrap(), mesh, None, None, None).unwrap();
    let x = randn::<bf16>(&[11, 6], &TensorOptions::new().mesh(mesh)).unwrap();
    let y = ArrayD::from_shape_fn(IxDyn(&[11]), |i| (i[0] % 4) as i64);
    let y = distribute_tensor(y, mesh, &[Replicate], None).unwrap();
    let mut sgd = Sgd::<bf16>::new(0.1).momentum(0.9).master_weights(true);
    let mut losses = vec![];
    for _ in 0..3 {
        m.zero_grad();
        let loss = m.forward(&x).unwrap().gelu().unwrap().cross_entropy(&y).unwrap();
        loss.backward().unwrap();
        sgd.step(&mut m).unwrap();
        losses.push(loss.full_tensor().unwrap().iter().map(|v| v.to_f64()).sum());
    }
    (losses, m.named_parameters().into_iter().map(|(_, p)| p.full_tensor().unwrap()).collect())
}

#[test]
fn bf16_training_with_master_weights_on_a_cuda_mesh() {
    let Some(dev) = device("bf16_training_with_master_weights_on_a_cuda_mesh") else { return };
    let (cuda, cpu) = meshes(&dev);
    let ((ld, wd), (lh, wh)) = (train_bf16(&cuda), train_bf16(&cpu));
    // Both compute in f32 and round to bf16; the orders of their sums differ, so a result may
    // round one bf16 step (2^-8) the other way.
    for (a, b) in ld.iter().zip(&lh) {
        assert!((a - b).abs() <= 2e-2 * b.abs(), "losses {ld:?} vs {lh:?}");
    }
    let worst = wd.iter().zip(&wh).map(|(a, b)| rel_err(a, b)).fold(0.0, f64::max);
    assert!(worst <= 1.0 / 32.0, "weights differ by {worst:e}");
    println!("GPUCHECK bf16_training_with_master_weights_on_a_cuda_mesh | PASS | bf16 linear+gelu+cross_entropy(i64 targets), 3 sgd steps on f32 master weights vs host: losses {ld:?} vs {lh:?}, weights rel err {worst:.1e}");
}

#[test]
fn each_rank_handle_owns_a_stream() {
    let Some(dev) = device("each_rank_handle_owns_a_stream") else { return };
    let other = CudaDevice::new(0).unwrap();
    let (a, b) = (dev.stream().cu_stream(), other.stream().cu_stream());
    // Never the legacy null stream; two handles (two ranks on one GPU) never share one.
    assert!(!a.is_null() && !b.is_null() && a != b);
    // Work of both handles on one buffer pair stays ordered per stream.
    let x = global(&[64, 64], 17);
    let s1 = up(&dev, &x).matmul(&up(&dev, &x)).unwrap();
    let s2 = up(&other, &x).matmul(&up(&other, &x)).unwrap();
    assert_eq!(host(s1), host(s2));
    println!("GPUCHECK each_rank_handle_owns_a_stream | PASS | two handles on device 0: distinct non-null streams, same results");
}

/// The arithmetic kernels of a 16-bit float on the device (f32 inside, one rounding) against the
/// host's: max/min, gathers and one-hot bit for bit, sums, softmax, matmul and the atomic
/// embedding backward within `ulp` (summation orders differ), bad ids the host's typed error.
fn half_kernel_cases<T: Element>(dev: &Arc<CudaDevice>, ulp: f64) -> usize {
    let v = |shape: &[usize], seed: u64, scale: f64| global(shape, seed).mapv(|x| T::of_f64(x * scale));
    let mut n = 0;
    let mut a = v(&[3, 4, 70], 4, 1.0 / 3.0);
    let dims: [&[usize]; 5] = [&[0], &[2], &[0, 2], &[0, 1, 2], &[]];
    for kind in [Reduction::Sum, Reduction::Mean, Reduction::Max, Reduction::Min] {
        for d in dims {
            let want = host(Storage::Cpu(a.clone()).reduce(kind, d, false).unwrap());
            let got = host(up(dev, &a).reduce(kind, d, false).unwrap());
            let exact = matches!(kind, Reduction::Max | Reduction::Min);
            assert!(if exact { same_bits(&got, &want) } else { rel_err(&got, &want) <= ulp }, "{kind:?} {d:?}");
            n += 1;
        }
    }
    a[[1, 2, 3]] = T::nan();
    for kind in [Reduction::Max, Reduction::Min] {
        let got = host(up(dev, &a).reduce(kind, &[2], false).unwrap());
        assert!(
            got[[1, 2]].is_nan() && same_bits(&got, &host(Storage::Cpu(a.clone()).reduce(kind, &[2], false).unwrap()))
        );
        n += 1;
    }
    for shape in [&[3usize, 5, 7][..], &[2, 1000]] {
        let (x, g) = (v(shape, 6, 0.1), v(shape, 7, 1.0 / 30.0));
        for dim in 0..shape.len() {
            for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
                let y = Storage::Cpu(x.clone()).softmax(dim, kind).unwrap();
                let gx = host(y.softmax_backward(&Storage::Cpu(g.clone()), dim, kind).unwrap());
                let dy = up(dev, &x).softmax(dim, kind).unwrap();
                // The backward from the host's output: a rounding step of the 16-bit output
                // would be amplified by the backward's formula.
                let dgx = host(up(dev, y.as_cpu().unwrap()).softmax_backward(&up(dev, &g), dim, kind).unwrap());
                let (ef, eb) = (rel_err(&host(dy), y.as_cpu().unwrap()), rel_err(&dgx, &gx));
                assert!(ef <= ulp && eb <= ulp, "{kind:?} dim {dim} of {shape:?}: {ef:e} {eb:e}");
                n += 2;
            }
        }
    }
    let cases: [(&[usize], &[usize]); 4] =
        [(&[5, 7], &[7, 3]), (&[2, 5, 7], &[7, 3]), (&[3, 2, 64, 48], &[3, 2, 48, 40]), (&[3, 0], &[0, 4])];
    for (sa, sb) in cases {
        let (x, y) = (v(sa, 8, 1.0 / 16.0), v(sb, 9, 1.0 / 16.0));
        let want = host(Storage::Cpu(x.clone()).matmul(&Storage::Cpu(y.clone())).unwrap());
        let e = rel_err(&host(up(dev, &x).matmul(&up(dev, &y)).unwrap()), &want);
        assert!(e <= ulp, "matmul {sa:?}@{sb:?}: {e:e}");
        n += 1;
    }
    let table = v(&[6, 5], 12, 1.0);
    let ids = ArrayD::from_shape_vec(IxDyn(&[2, 4]), vec![3i64, 0, 7, 3, 9, 2, 3, 8]).unwrap();
    let g = v(&[2, 4, 5], 13, 1.0 / 7.0);
    let (ct, dt, ci, di) = (Storage::Cpu(table.clone()), up(dev, &table), Storage::Cpu(ids.clone()), up(dev, &ids));
    assert!(same_bits(&host(dt.embedding(&di, 2, 10).unwrap()), &host(ct.embedding(&ci, 2, 10).unwrap())));
    let want = host(Storage::Cpu(g.clone()).embedding_backward(&ci, 6, 2, 10).unwrap());
    assert!(rel_err(&host(up(dev, &g).embedding_backward(&di, 6, 2, 10).unwrap()), &want) <= ulp);
    assert!(same_bits(&host(di.one_hot::<T>(10).unwrap()), &host(ci.one_hot::<T>(10).unwrap())));
    for bad in [-1i64, 10, i64::MIN, 1 << 40] {
        let b = up(dev, &ArrayD::from_elem(IxDyn(&[1]), bad));
        assert!(matches!(dt.embedding(&b, 2, 10), Err(Error::InvalidArgument { .. })), "{bad}");
        let g1 = up(dev, &v(&[1, 5], 0, 1.0));
        assert!(matches!(g1.embedding_backward(&b, 6, 2, 10), Err(Error::InvalidArgument { .. })), "{bad}");
        assert!(matches!(b.one_hot::<T>(10), Err(Error::InvalidArgument { .. })), "{bad}");
    }
    // Issue 33: ids past the integers a 16-bit float holds reach their own rows and classes.
    // A 6-row shard at row 2^24 - 2 of a vocabulary of 2^25 (no table that large needed).
    let row0 = (1i64 << 24) - 2;
    let ids = ArrayD::from_shape_vec(IxDyn(&[6]), vec![row0 + 3, 257, row0 + 5, 2049, (1 << 24) + 1, row0]).unwrap();
    let t6 = v(&[6, 3], 14, 1.0);
    let (hi, di) = (Storage::Cpu(ids.clone()), up(dev, &ids));
    let want = host(Storage::Cpu(t6.clone()).embedding(&hi, row0 as usize, 1 << 25).unwrap());
    assert!(same_bits(&host(up(dev, &t6).embedding(&di, row0 as usize, 1 << 25).unwrap()), &want));
    assert_eq!(want.index_axis(Axis(0), 4), t6.index_axis(Axis(0), 3), "id 2^24 + 1 reads its own row");
    let small = ArrayD::from_shape_vec(IxDyn(&[3]), vec![257i64, 2049, 255]).unwrap();
    let got = host(up(dev, &small).one_hot::<T>(2100).unwrap());
    assert!(same_bits(&got, &host(Storage::Cpu(small.clone()).one_hot::<T>(2100).unwrap())));
    for (k, &id) in small.iter().enumerate() {
        assert_eq!(got.index_axis(Axis(0), k).iter().position(|&x| x == T::one()), Some(id as usize));
    }
    n + 18
}

#[test]
fn half_float_kernels() {
    let Some(dev) = device("half_float_kernels") else { return };
    let n = half_kernel_cases::<bf16>(&dev, 1.0 / 128.0) + half_kernel_cases::<f16>(&dev, 1.0 / 1024.0);
    println!("GPUCHECK half_float_kernels | PASS | {n} bf16/f16 cases: reductions (max/min exact, NaN), softmax fwd+bwd, matmul (cublasGemmEx, f32 compute), embedding (+ backward, one_hot, 4 bad ids typed) within one rounding step of the host");
}

/// Every cast from and to the integers on the device against the host, bit for bit: floats at
/// the integer types' bounds, fractions, NaN and infinities (saturating truncation); integers
/// at every type's bounds and beyond 2²⁴ / 2⁵³ (wrapping, rounding to the floats).
#[test]
fn integer_casts() {
    let Some(dev) = device("integer_casts") else { return };
    let p = |k: i32| 2f64.powi(k);
    let mut fv =
        vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 0.5, -0.5, -0.999, 1.5, -1.5, 255.5, 256.0];
    fv.extend([-129.0, 65520.0, p(31) - 0.5, p(31), -p(31) - 1.0, p(53) + 2.0, p(63), -p(63), 1e19, -1e30, 1e-40]);
    fv.extend(global(&[300], 72).iter().map(|x| x * 1e7 + 0.25));
    let f = ArrayD::from_shape_vec(IxDyn(&[fv.len()]), fv).unwrap();
    let mut iv: Vec<i64> = vec![0, 1, -1, 127, 128, 255, 256, -128, -129];
    for b in [i32::MAX as i64, i32::MIN as i64, i64::MAX, i64::MIN, 1 << 24, 1 << 53] {
        iv.extend([b.wrapping_sub(1), b, b.wrapping_add(1), b.wrapping_add(1).wrapping_neg()]);
    }
    iv.extend((0..300u64).map(|k| rand_philox::splitmix64(k) as i64));
    let i = ArrayD::from_shape_vec(IxDyn(&[iv.len()]), iv).unwrap();
    let n = casts_from(&dev, &f)
        + casts_from(&dev, &f.mapv(|x| x as f32))
        + casts_from(&dev, &f.mapv(bf16::from_f64))
        + casts_from(&dev, &f.mapv(f16::from_f64))
        + casts_from(&dev, &i)
        + casts_from(&dev, &i.mapv(|x| x as i32))
        + casts_from(&dev, &i.mapv(|x| x as u8));
    println!("GPUCHECK integer_casts | PASS | {n} casts between all 7 dtypes bit-exact vs host (saturating, wrapping, NaN -> 0)");
}

/// The ops that read integer tensors, on a one-rank CUDA mesh against a host mesh: embedding
/// with i64 and i32 ids, cross-entropy with i64 targets (and their gradients), a `u8` mask from
/// `compare_mask` into `where_` and `masked_fill`, `arange` of i64, and a bad id's typed error.
#[test]
fn integer_ids_masks_and_targets_on_a_cuda_mesh() {
    let Some(dev) = device("integer_ids_masks_and_targets_on_a_cuda_mesh") else { return };
    let (cuda, cpu) = meshes(&dev);
    let run = |mesh: &DeviceMesh| -> Vec<ArrayD<f64>> {
        let dt = |a: ArrayD<f64>| distribute_tensor(a, mesh, &[Replicate], None).unwrap();
        let table = dt(global(&[10, 4], 30).mapv(|x| x / 8.0)).requires_grad_(true);
        let ids64 = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![3i64, 0, 9, 3, 7, 1]).unwrap();
        let ids64 = distribute_tensor(ids64, mesh, &[Replicate], None).unwrap();
        let ids32 = ids64.cast::<i32>().unwrap();
        let e64 = table.embedding(&ids64).unwrap();
        let e32 = table.embedding(&ids32).unwrap();
        let target =
            distribute_tensor(ArrayD::from_shape_vec(IxDyn(&[2]), vec![1i64, 3]).unwrap(), mesh, &[Replicate], None)
                .unwrap();
        let logits = e64.sum_dim(1, false).unwrap();
        let loss = logits.cross_entropy(&target).unwrap();
        loss.backward().unwrap();
        let mask = e32.compare_mask(BinaryOp::Gt, &e64.mul_scalar(0.5).unwrap()).unwrap();
        assert_eq!(mask.device(), mesh.device());
        let picked = e32.where_(&mask, &e64.neg().unwrap()).unwrap();
        let filled = e32.masked_fill(&mask, -7.0).unwrap();
        let r = dtensor_runtime::arange::<i64>(-5, 1 << 40, 1 << 37, &TensorOptions::new().mesh(mesh)).unwrap();
        let bad = distribute_tensor(ArrayD::from_elem(IxDyn(&[1]), -1i64), mesh, &[Replicate], None).unwrap();
        assert!(matches!(table.embedding(&bad), Err(Error::InvalidArgument { .. })));
        vec![
            e64.full_tensor().unwrap(),
            e32.full_tensor().unwrap(),
            loss.full_tensor().unwrap(),
            table.grad().unwrap().full_tensor().unwrap(),
            mask.full_tensor().unwrap().mapv(f64::from),
            picked.full_tensor().unwrap(),
            filled.full_tensor().unwrap(),
            r.full_tensor().unwrap().mapv(|x| x as f64),
        ]
    };
    let (d, h) = (run(&cuda), run(&cpu));
    for (k, (a, b)) in d.iter().zip(&h).enumerate() {
        // Exact but for the loss and its gradient (exp/log of the math libraries).
        assert!(rel_err(a, b) <= 1e-14, "output {k}: {a:?} vs {b:?}");
    }
    println!("GPUCHECK integer_ids_masks_and_targets_on_a_cuda_mesh | PASS | embedding (i64, i32 ids, bad id typed), cross_entropy (i64 targets) + backward, u8 compare_mask -> where_/masked_fill, arange i64 vs host");
}
