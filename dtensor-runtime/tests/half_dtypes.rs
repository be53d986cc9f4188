//! bf16 and f16 elements: factories, distribute/from_local/full_tensor, redistribution chains,
//! collectives, casts, matmul and checkpoints on 1, 2 and 4 ranks, each against the 1-rank
//! result (exactly for data movement, within a few half ulps for reductions).

mod checkpoint_util;
mod common;

use common::global;
use dtensor_runtime::module::Module;
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::optim::{GradScaler, Sgd};
use dtensor_runtime::{
    bf16, distribute_tensor, empty, f16, from_local, full, linspace, logspace, manual_seed, ones, rand, randn, run,
    zeros, Along, DTensor, DType, Element, FromLocal, Placement, ReduceOp, Replicate, Scalar, Shard, TensorOptions,
};

/// Meshes to compare against one rank, with placements that shard unevenly.
fn layouts() -> Vec<(Vec<usize>, Vec<Placement>)> {
    vec![
        (vec![1], vec![Replicate]),
        (vec![2], vec![Shard(0)]),
        (vec![4], vec![Shard(1)]),
        (vec![2, 2], vec![Shard(0), Shard(1)]),
        (vec![2, 2], vec![Shard(1), Shard(1)]),
    ]
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("d{i}")).collect()
}

/// The full tensor every rank sees after `f` builds a DTensor on `mesh` with `placements`.
fn fulls<T: Element>(
    mesh: &[usize],
    placements: &[Placement],
    f: impl Fn(&TensorOptions) -> dtensor_runtime::Result<DTensor<T>> + Sync,
) -> Vec<ArrayD<T>> {
    let world: usize = mesh.iter().product();
    run(world, |ctx| {
        let n = names(mesh.len());
        let refs: Vec<&str> = n.iter().map(String::as_str).collect();
        let m = ctx.init_device_mesh(mesh, &refs)?;
        let t = f(&TensorOptions::new().mesh(&m).placements(placements))?;
        t.full_tensor()
    })
    .unwrap()
}

/// Builds a tensor with the given options.
type Factory<'a, T> = dyn Fn(&TensorOptions) -> dtensor_runtime::Result<DTensor<T>> + Sync + 'a;

fn check_factories<T: Element>() {
    let shape = [5, 3];
    let cases: Vec<(&str, Box<Factory<'_, T>>)> = vec![
        ("zeros", Box::new(|o| zeros::<T>(&shape, o))),
        ("ones", Box::new(|o| ones::<T>(&shape, o))),
        ("empty", Box::new(|o| empty::<T>(&shape, o))),
        ("full", Box::new(|o| full::<T>(&shape, T::of_f64(1.0 / 3.0), o))),
        (
            "rand",
            Box::new(|o| {
                manual_seed(11);
                rand::<T>(&shape, o)
            }),
        ),
        (
            "randn",
            Box::new(|o| {
                manual_seed(12);
                randn::<T>(&shape, o)
            }),
        ),
        ("linspace", Box::new(|o| linspace::<T>(-1.0, 2.0, 7, o))),
        ("logspace", Box::new(|o| logspace::<T>(-1.0, 2.0, 7, 10.0, o))),
    ];
    for (name, f) in &cases {
        let one = fulls::<T>(&[1], &[Replicate], f)[0].clone();
        for (mesh, p) in layouts() {
            let p: Vec<Placement> = if name.contains("space") { p.iter().map(|_| Shard(0)).collect() } else { p };
            for got in fulls::<T>(&mesh, &p, f) {
                assert_eq!(got, one, "{} {name} on {mesh:?} {p:?}", T::DTYPE);
            }
        }
        // The values themselves: the f32 stream rounded (rand/randn), the f64 formula rounded.
        let reference: ArrayD<f32> = match *name {
            "rand" => fulls::<f32>(&[1], &[Replicate], |o| {
                manual_seed(11);
                rand::<f32>(&shape, o)
            })[0]
                .clone(),
            "randn" => fulls::<f32>(&[1], &[Replicate], |o| {
                manual_seed(12);
                randn::<f32>(&shape, o)
            })[0]
                .clone(),
            "zeros" | "empty" => ArrayD::zeros(IxDyn(&shape)),
            "ones" => ArrayD::ones(IxDyn(&shape)),
            "full" => ArrayD::from_elem(IxDyn(&shape), 1.0 / 3.0),
            "linspace" => ArrayD::from_shape_fn(IxDyn(&[7]), |i| (-1.0 + 0.5 * i[0] as f64) as f32),
            _ => ArrayD::from_shape_fn(IxDyn(&[7]), |i| 10f64.powf(-1.0 + 0.5 * i[0] as f64) as f32),
        };
        assert_eq!(one, reference.mapv(|v| T::of_f64(v as f64)), "{} {name}", T::DTYPE);
    }
}

#[test]
fn factories_match_one_rank_and_round_the_f32_values() {
    check_factories::<bf16>();
    check_factories::<f16>();
}

/// `global` scaled to values that are not exact in 16 bits.
fn values<T: Element>(shape: &[usize], seed: u64) -> ArrayD<T> {
    global(shape, seed).mapv(|v| T::of_f64(v * 0.137 + 0.01))
}

fn check_redistribution<T: Element>() {
    // [7, 5] is uneven on 2 and 4 ranks; [1, 5] leaves empty shards.
    let chain = [
        vec![Shard(0), Shard(1)],
        vec![Replicate, Shard(0)],
        vec![Shard(1), Replicate],
        vec![Shard(0), Shard(0)],
        vec![Shard(1), Shard(0)],
        vec![Replicate, Replicate],
        vec![Shard(0), Shard(1)],
    ];
    for shape in [vec![7, 5], vec![1, 5], vec![0, 3]] {
        let g = values::<T>(&shape, 3);
        let out = run(4, |ctx| {
            let mesh = ctx.init_device_mesh(&[2, 2], &["a", "b"])?;
            let mut t = distribute_tensor(&g, &mesh, &chain[0], None)?;
            let mut seen = vec![t.full_tensor()?];
            for p in &chain[1..] {
                t = t.redistribute(p)?;
                seen.push(t.full_tensor()?);
            }
            // from_local of this rank's shard rebuilds the same tensor.
            let again = from_local(t.to_host()?, &mesh, t.placements(), FromLocal::with_shape(&shape))?;
            seen.push(again.full_tensor()?);
            Ok(seen)
        })
        .unwrap();
        for (rank, seen) in out.iter().enumerate() {
            for (k, full) in seen.iter().enumerate() {
                assert_eq!(full, &g, "{} {shape:?} rank {rank} step {k}", T::DTYPE);
            }
        }
    }
}

#[test]
fn redistribution_chains_move_half_data_exactly() {
    check_redistribution::<bf16>();
    check_redistribution::<f16>();
}

/// Within the error bound of a sum of `n` terms of magnitude sum `mag`, each partial sum
/// rounded to `T`: `n` units of roundoff of `mag`.
fn close<T: Element>(a: T, want: f64, mag: f64, n: usize) -> bool {
    let u = match T::DTYPE {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => f64::EPSILON,
    };
    (a.as_f64() - want).abs() <= (n as f64 + 1.0) * u * mag.max(want.abs())
}

/// The reduction of `parts` element by element in f64, and the sum of the terms' magnitudes.
fn reference(op: ReduceOp, parts: &[ArrayD<f64>]) -> Vec<(f64, f64)> {
    (0..parts[0].len())
        .map(|i| {
            let col = parts.iter().map(|p| p.as_slice().unwrap()[i]);
            let mag = col.clone().map(f64::abs).sum();
            let v = match op {
                ReduceOp::Sum => col.sum(),
                ReduceOp::Avg => col.sum::<f64>() / parts.len() as f64,
                ReduceOp::Max => col.fold(f64::MIN, f64::max),
                ReduceOp::Min => col.fold(f64::MAX, f64::min),
                ReduceOp::Product => col.product(),
            };
            (v, mag)
        })
        .collect()
}

/// Every rank got the same bits, each within a few half ulps of `want`.
fn check_reduced<T: Element>(what: &str, got: &[Vec<T>], want: &[(f64, f64)], n: usize) {
    for (rank, g) in got.iter().enumerate() {
        assert_eq!(g.len(), want.len(), "{what}");
        for (i, (&x, &(w, mag))) in g.iter().zip(want).enumerate() {
            assert!(close(x, w, mag, n), "{} {what} rank {rank} [{i}]: {x} vs {w}", T::DTYPE);
        }
        assert_eq!(bytes(g), bytes(&got[0]), "{what}: rank {rank} differs from rank 0");
    }
}

fn bytes<T: Element>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

fn check_partial_reductions<T: Element>() {
    let shape = [5, 3];
    for world in [1usize, 2, 4] {
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
            let out = run(world, |ctx| {
                let mesh = ctx.init_device_mesh(&[world], &["x"])?;
                let mine = values::<T>(&shape, ctx.rank() as u64);
                let p = from_local(mine, &mesh, &[Placement::Partial(op)], FromLocal::default())?;
                let r = p.redistribute(&[Replicate])?.to_host()?;
                // Partial -> Shard is a reduce-scatter.
                let s = p.redistribute(&[Shard(0)])?.full_tensor()?;
                Ok((r.into_raw_vec_and_offset().0, s.into_raw_vec_and_offset().0))
            })
            .unwrap();
            let parts: Vec<ArrayD<f64>> =
                (0..world).map(|r| values::<T>(&shape, r as u64).mapv(|v| v.as_f64())).collect();
            let want = reference(op, &parts);
            let (all_reduced, scattered): (Vec<_>, Vec<_>) = out.into_iter().unzip();
            check_reduced(&format!("all-reduce {op} on {world}"), &all_reduced, &want, world);
            check_reduced(&format!("reduce-scatter {op} on {world}"), &scattered, &want, world);
        }
    }
}

#[test]
fn partial_reductions_accumulate_within_half_tolerance() {
    check_partial_reductions::<bf16>();
    check_partial_reductions::<f16>();
}

fn check_collectives<T: Element>() {
    for world in [1usize, 2, 4] {
        let n = 6;
        let out = run(world, |ctx| {
            let mesh = ctx.init_device_mesh(&[world], &["x"])?;
            let r = ctx.rank();
            let mine: Vec<T> = values::<T>(&[n], r as u64).into_raw_vec_and_offset().0;
            let gathered = mesh.all_gather(Along::All, &mine)?;
            let mut summed = mine.clone();
            mesh.all_reduce(Along::All, &mut summed, ReduceOp::Sum)?;
            let big: Vec<T> = values::<T>(&[n * world], r as u64).into_raw_vec_and_offset().0;
            let scattered = mesh.reduce_scatter(Along::All, &big, ReduceOp::Sum)?;
            let swapped = mesh.all_to_all(Along::All, &big)?;
            let mut bcast = mine.clone();
            mesh.broadcast(Along::All, &mut bcast, world - 1)?;
            let sc = mesh.scatter(Along::All, &big, n, 0)?;
            Ok((gathered, summed, scattered, swapped, bcast, sc))
        })
        .unwrap();
        let v = |shape: &[usize], r: usize| values::<T>(shape, r as u64).into_raw_vec_and_offset().0;
        let gathered: Vec<T> = (0..world).flat_map(|r| v(&[n], r)).collect();
        let sum_want = reference(
            ReduceOp::Sum,
            &(0..world).map(|r| values::<T>(&[n], r as u64).mapv(|x| x.as_f64())).collect::<Vec<_>>(),
        );
        let bigs: Vec<Vec<T>> = (0..world).map(|r| v(&[n * world], r)).collect();
        for (rank, (g, _, sc, sw, b, s)) in out.iter().enumerate() {
            assert_eq!(bytes(g), bytes(&gathered), "all_gather {world}");
            let parts: Vec<ArrayD<f64>> = bigs
                .iter()
                .map(|b| {
                    ArrayD::from_shape_vec(
                        IxDyn(&[n]),
                        b[rank * n..(rank + 1) * n].iter().map(|x| x.as_f64()).collect(),
                    )
                    .unwrap()
                })
                .collect();
            check_reduced(
                &format!("reduce_scatter {world}"),
                std::slice::from_ref(sc),
                &reference(ReduceOp::Sum, &parts),
                world,
            );
            let want_sw: Vec<T> = (0..world).flat_map(|src| bigs[src][rank * n..(rank + 1) * n].to_vec()).collect();
            assert_eq!(bytes(sw), bytes(&want_sw), "all_to_all {world}");
            assert_eq!(bytes(b), bytes(&v(&[n], world - 1)), "broadcast {world}");
            assert_eq!(bytes(s), bytes(&bigs[0][rank * n..(rank + 1) * n]), "scatter {world}");
        }
        let summed: Vec<Vec<T>> = out.iter().map(|o| o.1.clone()).collect();
        check_reduced(&format!("all_reduce {world}"), &summed, &sum_want, world);
    }
}

#[test]
fn mesh_collectives_on_one_two_and_four_ranks() {
    check_collectives::<bf16>();
    check_collectives::<f16>();
}

#[test]
fn casts_round_trip() {
    let x = values::<f64>(&[4, 6], 5).mapv(|v| v * 1.7e-3 + 1.0 / 3.0);
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let d = distribute_tensor(&x, &mesh, &[Shard(1)], None)?;
        let b = d.cast::<bf16>()?;
        let h = d.cast::<f16>()?;
        Ok((
            b.full_tensor()?,
            h.full_tensor()?,
            b.cast::<f32>()?.cast::<bf16>()?.full_tensor()?,
            b.cast::<f64>()?.cast::<bf16>()?.full_tensor()?,
            h.cast::<f32>()?.cast::<f16>()?.full_tensor()?,
            b.cast::<f16>()?.full_tensor()?,
            h.cast::<bf16>()?.full_tensor()?,
            d.cast::<f32>()?.cast::<bf16>()?.full_tensor()?,
        ))
    })
    .unwrap();
    for (b, h, bfb, bdb, hfh, bh, hb, fb) in out {
        // Narrowing rounds to nearest (through f32, as PyTorch converts a double).
        assert_eq!(b, x.mapv(|v| bf16::from_f32(v as f32)));
        assert_eq!(h, x.mapv(|v| f16::from_f32(v as f32)));
        assert_eq!(fb, b);
        // Widening and back is exact.
        assert_eq!(bfb, b);
        assert_eq!(bdb, b);
        assert_eq!(hfh, h);
        // Between the two 16-bit types: the value rounded to the target.
        assert_eq!(bh, b.mapv(|v| f16::from_f32(v.to_f32())));
        assert_eq!(hb, h.mapv(|v| bf16::from_f32(v.to_f32())));
    }
}

fn check_matmul<T: Element>() {
    let (a, b) = (values::<T>(&[6, 5], 1), values::<T>(&[5, 7], 2));
    // One rank: f32 gemm of the widened operands, rounded once.
    let a32 = a.mapv(|v| v.as_f64() as f32);
    let b32 = b.mapv(|v| v.as_f64() as f32);
    let a2 = a32.clone().into_shape_with_order((6, 5)).unwrap();
    let b2 = b32.clone().into_shape_with_order((5, 7)).unwrap();
    let want = a2.dot(&b2).mapv(|v| T::of_f64(v as f64)).into_dyn();
    let mag = a2.mapv(f32::abs).dot(&b2.mapv(f32::abs)).into_dyn();
    for (mesh, pa, pb) in [
        (vec![1], vec![Replicate], vec![Replicate]),
        (vec![2], vec![Shard(0)], vec![Replicate]),
        (vec![4], vec![Replicate], vec![Shard(1)]),
        (vec![2, 2], vec![Shard(0), Shard(1)], vec![Replicate, Shard(0)]),
    ] {
        let world: usize = mesh.iter().product();
        let out = run(world, |ctx| {
            let n = names(mesh.len());
            let refs: Vec<&str> = n.iter().map(String::as_str).collect();
            let m = ctx.init_device_mesh(&mesh, &refs)?;
            let x = distribute_tensor(&a, &m, &pa, None)?;
            let y = distribute_tensor(&b, &m, &pb, None)?;
            x.matmul(&y)?.full_tensor()
        })
        .unwrap();
        let partial = pa.iter().any(|p| *p == Shard(1));
        for got in out {
            if partial {
                // A contraction over a sharded dim sums rounded partial products.
                for ((g, w), m) in got.iter().zip(want.iter()).zip(mag.iter()) {
                    assert!(close(*g, w.as_f64(), *m as f64, 3), "{} matmul on {mesh:?}: {g} vs {w}", T::DTYPE);
                }
            } else {
                assert_eq!(got, want, "{} matmul on {mesh:?}", T::DTYPE);
            }
        }
    }
}

#[test]
fn matmul_accumulates_in_f32() {
    check_matmul::<bf16>();
    check_matmul::<f16>();
}

#[test]
fn sum_reduces_in_f32() {
    // 4096 ones and one 1/4: a bf16 running sum would stop growing at 256.
    let mut x = ArrayD::<bf16>::from_elem(IxDyn(&[4097]), bf16::ONE);
    x[[4096]] = bf16::from_f32(0.25);
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        distribute_tensor(&x, &mesh, &[Shard(0)], None)?.sum()?.full_tensor()
    })
    .unwrap();
    for s in out {
        assert_eq!(s.iter().next().unwrap().to_f32(), 4096.0);
    }
}

fn check_checkpoints<T: Element>() {
    checkpoint_util::check_native_round_trip(&values::<T>(&[7, 5], 1), &values::<T>(&[1, 3], 2));
}

#[test]
fn checkpoints_save_and_load_half_natively() {
    check_checkpoints::<bf16>();
    check_checkpoints::<f16>();
}

#[test]
fn dtype_names() {
    assert_eq!((DType::BF16.to_string(), DType::F16.to_string()), ("bf16".into(), "f16".into()));
    assert_eq!(DType::from_safetensors_name("BF16"), Some(DType::BF16));
    assert_eq!(DType::from_safetensors_name("F16"), Some(DType::F16));
    assert_eq!((DType::BF16.size_of(), DType::F16.size_of()), (2, 2));
    assert_eq!(<bf16 as Scalar>::DTYPE, DType::BF16);
}

/// One replicated parameter.
struct One {
    w: DTensor<f16>,
}

impl Module<f16> for One {
    fn named_parameters(&self) -> Vec<(String, &DTensor<f16>)> {
        vec![("w".into(), &self.w)]
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<f16>)> {
        vec![("w".into(), &mut self.w)]
    }
}

#[test]
fn grad_scaler_skips_overflowing_steps_on_every_rank_backs_off_and_grows() {
    let w0 = ArrayD::from_elem(IxDyn(&[3]), f16::from_f32(1.0));
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        let mut m = One { w: distribute_tensor(&w0, &mesh, &[Replicate], None)?.requires_grad_(true) };
        // The gradient of sum(w * x) is x: at scale 1024 rank 1's (100 × 1024) overflows f16
        // and rank 0's (0.5 × 1024) does not; at 512 neither does.
        let x = ArrayD::from_elem(IxDyn(&[3]), f16::from_f32(if ctx.rank() == 1 { 100.0 } else { 0.5 }));
        let x = from_local(x, &mesh, &[Replicate], FromLocal::default())?;
        let mut opt = Sgd::<f16>::new(0.125).master_weights(true);
        let mut scaler = GradScaler::new().init_scale(1024.0).growth_interval(2);
        let mut log = vec![];
        for _ in 0..4 {
            m.w.zero_grad();
            scaler.scale(&m.w.mul(&x)?.sum()?)?.backward()?;
            let stepped = scaler.step(&mut opt, &mut m)?;
            scaler.update();
            log.push((stepped, scaler.get_scale(), m.w.to_host()?[[0]].to_f32()));
        }
        Ok(log)
    })
    .unwrap();
    // Skipped (everywhere), stepped, stepped and grown after 2 good steps, skipped again.
    assert_eq!(out[0], [(false, 512.0, 1.0), (true, 512.0, 0.9375), (true, 1024.0, 0.875), (false, 512.0, 0.875)]);
    assert_eq!(out[1], [(false, 512.0, 1.0), (true, 512.0, -11.5), (true, 1024.0, -24.0), (false, 512.0, -24.0)]);
}

/// One replicated bf16 parameter.
struct OneBf16 {
    w: DTensor<bf16>,
}

impl Module<bf16> for OneBf16 {
    fn named_parameters(&self) -> Vec<(String, &DTensor<bf16>)> {
        vec![("w".into(), &self.w)]
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<bf16>)> {
        vec![("w".into(), &mut self.w)]
    }
}

/// The hyperparameters are f64, so the f32 master-weight update of a bf16 parameter uses
/// momentum 0.99 and lr 0.1, not their bf16 roundings (0.98828125, 0.10009765625): over 200
/// steps the momentum sums differ by about 8%, many bf16 ulps.
#[test]
fn optimizer_hyperparameters_keep_f64_precision_for_bf16_parameters() {
    let steps = 200;
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        let w0 = ArrayD::from_elem(IxDyn(&[4]), bf16::from_f32(0.0));
        let mut m = OneBf16 { w: distribute_tensor(&w0, &mesh, &[Shard(0)], None)?.requires_grad_(true) };
        let x = distribute_tensor(ArrayD::from_elem(IxDyn(&[4]), bf16::from_f32(1.0)), &mesh, &[Shard(0)], None)?;
        let mut opt = Sgd::<bf16>::new(0.1).momentum(0.99).master_weights(true);
        for _ in 0..steps {
            m.w.zero_grad();
            m.w.mul(&x)?.sum()?.backward()?;
            opt.step(&mut m)?;
        }
        m.w.full_tensor()
    })
    .unwrap();
    // PyTorch's SGD with momentum in f32 (the buffer starts at the first gradient, 1).
    let sgd = |lr: f32, mom: f32| {
        let (mut w, mut buf) = (0f32, 0f32);
        for k in 0..steps {
            buf = if k == 0 { 1.0 } else { mom * buf + 1.0 };
            w -= lr * buf;
        }
        w
    };
    let want = sgd(0.1, 0.99);
    let rounded = sgd(bf16::from_f64(0.1).to_f32(), bf16::from_f64(0.99).to_f32());
    let ulp = |v: f32| bf16::from_f32(v).to_f32().abs() / 128.0;
    assert!((want - rounded).abs() > 8.0 * ulp(want), "the test would not tell: {want} vs {rounded}");
    for full in out {
        for &w in full.iter() {
            assert!((w.to_f32() - want).abs() <= ulp(want), "{w} vs {want} (bf16 hyperparameters: {rounded})");
        }
    }
}

/// The scatter-adds behind the index/gather/embedding backwards accumulate the 16-bit floats
/// in f32: 4097 ones summed into one slot give 4096 (4097 rounded once), not bf16's 256 or
/// f16's 2048 where a 16-bit running sum stops growing.
fn check_scatter_adds_accumulate_in_f32<T: Element>() {
    use dtensor_runtime::storage::Storage;
    let n = 4097;
    let ones = Storage::from(ArrayD::from_elem(IxDyn(&[n, 1]), T::one()));
    let ids = Storage::from(ArrayD::from_elem(IxDyn(&[n]), 0i64));
    let want = T::of_f64(4097.0);
    assert_eq!(want.as_f64(), 4096.0);
    let emb = ones.embedding_backward(&ids, 2, 0, 2).unwrap().to_host().unwrap();
    assert_eq!(emb[[0, 0]], want, "{} embedding_backward", T::DTYPE);
    let ia = ones.index_add(0, &ids, 2).unwrap().to_host().unwrap();
    assert_eq!(ia[[0, 0]], want, "{} index_add", T::DTYPE);
    let ids2 = Storage::from(ArrayD::from_elem(IxDyn(&[n, 1]), 0i64));
    let sa = ones.scatter_add(0, &ids2, &[2, 1]).unwrap().to_host().unwrap();
    assert_eq!(sa[[0, 0]], want, "{} scatter_add", T::DTYPE);
}

#[test]
fn scatter_adds_accumulate_half_in_f32() {
    check_scatter_adds_accumulate_in_f32::<bf16>();
    check_scatter_adds_accumulate_in_f32::<f16>();
}
