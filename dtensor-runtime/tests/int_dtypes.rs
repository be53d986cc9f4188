//! Integer elements (`i64`, `i32`, `u8`): factories, distribute/from_local/full_tensor,
//! redistribution chains on uneven and empty-shard shapes, Partial reductions and every mesh
//! collective on 1, 2 and 4 ranks, each exactly equal to the 1-rank (or computed) result;
//! the average of integers and gradients of integers are typed errors.

mod checkpoint_util;
mod common;

use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::{
    distribute_tensor, empty, from_local, full, ones, run, zeros, Along, DTensor, DType, Error, FromLocal, Partial,
    Placement, ReduceOp, Replicate, Scalar, Shard, TensorOptions,
};

/// Meshes to compare against one rank, with placements that shard unevenly.
fn layouts() -> Vec<(Vec<usize>, Vec<Placement>)> {
    vec![
        (vec![1], vec![Replicate]),
        (vec![2], vec![Shard(0)]),
        (vec![4], vec![Shard(1)]),
        (vec![4], vec![Shard(0)]),
        (vec![2, 2], vec![Shard(0), Shard(1)]),
        (vec![2, 2], vec![Shard(1), Shard(1)]),
    ]
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("d{i}")).collect()
}

/// Whole numbers that exercise the type's range: negative for the signed types, beyond
/// 2³² for i64 (so a path through f32 would be caught), up to 255 for u8.
fn value<T: Scalar>(i: usize) -> T {
    let v = match T::DTYPE {
        DType::U8 => (i * 37 % 256) as f64,
        DType::I32 => (i as f64 - 7.0) * 100_003.0,
        _ => (i as f64 - 7.0) * 4_294_967_311.0,
    };
    T::of_f64(v)
}

fn global<T: Scalar>(shape: &[usize]) -> ArrayD<T> {
    let mut k = 0;
    ArrayD::from_shape_simple_fn(IxDyn(shape), || {
        k += 1;
        value::<T>(k)
    })
}

/// The full tensor every rank sees after `f` builds a DTensor on `mesh` with `placements`.
fn fulls<T: Scalar>(
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
        assert_eq!(t.local().shape(), t.local().to_host()?.shape());
        t.full_tensor()
    })
    .unwrap()
}

/// Builds a tensor with the given options.
type Factory<'a, T> = dyn Fn(&TensorOptions) -> dtensor_runtime::Result<DTensor<T>> + Sync + 'a;

fn check_factories<T: Scalar>() {
    let shape = [5, 3];
    let seven = value::<T>(9);
    let cases: Vec<(&str, Box<Factory<'_, T>>)> = vec![
        ("zeros", Box::new(|o| zeros::<T>(&shape, o))),
        ("ones", Box::new(|o| ones::<T>(&shape, o))),
        ("empty", Box::new(|o| empty::<T>(&shape, o))),
        ("full", Box::new(move |o| full::<T>(&shape, seven, o))),
    ];
    for (name, f) in &cases {
        let one = fulls::<T>(&[1], &[Replicate], f)[0].clone();
        for (mesh, p) in layouts() {
            for got in fulls::<T>(&mesh, &p, f) {
                assert_eq!(got, one, "{} {name} on {mesh:?} {p:?}", T::DTYPE);
            }
        }
    }
    assert_eq!(
        fulls::<T>(&[1], &[Replicate], |o| full::<T>(&shape, seven, o))[0],
        ArrayD::from_elem(IxDyn(&shape), seven)
    );
    assert_eq!(fulls::<T>(&[1], &[Replicate], |o| ones::<T>(&shape, o))[0], ArrayD::from_elem(IxDyn(&shape), T::one()));
    // Integers have no gradients: asking for one is a typed error.
    let e = run(1, |ctx| {
        let m = ctx.init_device_mesh(&[1], &["x"])?;
        zeros::<T>(&shape, &TensorOptions::new().mesh(&m).requires_grad(true)).map(|_| ())
    })
    .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
}

#[test]
fn factories_match_one_rank_for_every_integer_dtype() {
    check_factories::<i64>();
    check_factories::<i32>();
    check_factories::<u8>();
}

/// Chains that cross every transition (shard dim changes, replicate, nested shards).
fn chains() -> Vec<(Vec<usize>, Vec<Vec<Placement>>)> {
    vec![
        (vec![4], vec![vec![Shard(0)], vec![Replicate], vec![Shard(1)], vec![Shard(0)], vec![Replicate]]),
        (
            vec![2, 2],
            vec![
                vec![Shard(0), Shard(1)],
                vec![Replicate, Shard(0)],
                vec![Shard(1), Shard(1)],
                vec![Shard(0), Replicate],
                vec![Replicate, Replicate],
            ],
        ),
    ]
}

fn check_redistribute<T: Scalar>(shape: &[usize]) {
    let g = global::<T>(shape);
    for (mesh, steps) in chains() {
        let world: usize = mesh.iter().product();
        let outs = run(world, |ctx| {
            let n = names(mesh.len());
            let refs: Vec<&str> = n.iter().map(String::as_str).collect();
            let m = ctx.init_device_mesh(&mesh, &refs)?;
            let mut t = distribute_tensor(&g, &m, &steps[0], Some(0))?;
            let mut seen = vec![t.full_tensor()?];
            for p in &steps[1..] {
                t = t.redistribute(p)?;
                seen.push(t.full_tensor()?);
                // The shard equals the 1-rank tensor sliced locally.
                let sliced = distribute_tensor(&g, &m, p, None)?;
                assert_eq!(t.local(), sliced.local(), "{} {shape:?} {p:?}", T::DTYPE);
            }
            Ok(seen)
        })
        .unwrap();
        for seen in outs {
            for s in seen {
                assert_eq!(s, g, "{} {shape:?} on {mesh:?}", T::DTYPE);
            }
        }
    }
}

#[test]
fn redistribution_chains_are_exact_on_uneven_and_empty_shards() {
    // [5, 3] is uneven on 2 and 4 ranks; [1, 3] and [3, 2] leave some shards empty.
    for shape in [[5, 3], [1, 3], [3, 2]] {
        check_redistribute::<i64>(&shape);
        check_redistribute::<i32>(&shape);
        check_redistribute::<u8>(&shape);
    }
}

/// What rank `r` contributes to a Partial tensor at element `i`.
fn part<T: Scalar>(r: usize, i: usize) -> T {
    match T::DTYPE {
        DType::U8 => T::of_f64(((r * 7 + i * 3) % 60) as f64),
        _ => value::<T>(r * 5 + i),
    }
}

fn fold<T: Scalar>(op: ReduceOp, xs: impl Iterator<Item = T>) -> T {
    let v: Vec<T> = xs.collect();
    match op {
        // Small enough for exact sums in every type (at most 4 × 60 for u8).
        ReduceOp::Sum => T::of_f64(v.iter().map(|x| x.as_f64()).sum()),
        ReduceOp::Max => v.iter().copied().fold(v[0], |a, b| if b > a { b } else { a }),
        ReduceOp::Min => v.iter().copied().fold(v[0], |a, b| if b < a { b } else { a }),
        _ => unreachable!("not tested here"),
    }
}

fn check_partial<T: Scalar>() {
    let shape = [5, 3];
    let numel = 15;
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        let want: ArrayD<T> = ArrayD::from_shape_vec(
            IxDyn(&shape),
            (0..numel).map(|i| fold::<T>(op, (0..4).map(|r| part::<T>(r, i)))).collect(),
        )
        .unwrap();
        for to in [vec![Replicate, Replicate], vec![Shard(0), Replicate], vec![Shard(1), Shard(0)]] {
            let outs = run(4, |ctx| {
                let m = ctx.init_device_mesh(&[2, 2], &["a", "b"])?;
                let mine: Vec<T> = (0..numel).map(|i| part::<T>(ctx.rank(), i)).collect();
                let local = ArrayD::from_shape_vec(IxDyn(&shape), mine).unwrap();
                let t = from_local(local, &m, &[Partial(op), Partial(op)], FromLocal::default())?;
                t.redistribute(&to)?.full_tensor()
            })
            .unwrap();
            for o in outs {
                assert_eq!(o, want, "{} Partial({op}) -> {to:?}", T::DTYPE);
            }
        }
    }
    // The average of integers is refused, as PyTorch does.
    let errs = run(2, |ctx| {
        let m = ctx.init_device_mesh(&[2], &["a"])?;
        let local = ArrayD::from_elem(IxDyn(&[3]), T::one());
        let t = from_local(local, &m, &[Partial(ReduceOp::Avg)], FromLocal::default())?;
        Ok(t.redistribute(&[Replicate]).map(|_| ()).unwrap_err())
    })
    .unwrap();
    for e in errs {
        assert!(matches!(&e, Error::Unsupported { reason, .. } if reason.contains(T::DTYPE.name())), "{e:?}");
    }
}

#[test]
fn partial_sum_max_min_reduce_exactly_and_avg_is_refused() {
    check_partial::<i64>();
    check_partial::<i32>();
    check_partial::<u8>();
}

fn check_collectives<T: Scalar>() {
    let n = 4;
    let outs = run(n, |ctx| {
        let m = ctx.init_device_mesh(&[2, 2], &["a", "b"])?;
        let r = ctx.rank();
        let mine: Vec<T> = (0..4).map(|i| part::<T>(r, i)).collect();
        for d in 0..2 {
            let g = m.group(d).to_vec();
            let along = Along::Dim(d);
            // all_gather: every member's data in group order.
            let got = m.all_gather(along, &mine)?;
            let want: Vec<T> = g.iter().flat_map(|&q| (0..4).map(move |i| part::<T>(q, i))).collect();
            assert_eq!(got, want, "all_gather");
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
                let want: Vec<T> = (0..4).map(|i| fold::<T>(op, g.iter().map(|&q| part::<T>(q, i)))).collect();
                let mut buf = mine.clone();
                m.all_reduce(along, &mut buf, op)?;
                assert_eq!(buf, want, "all_reduce {op}");
                assert_eq!(m.all_reduce_into(along, &mine, op)?, want, "all_reduce_into {op}");
                let me = g.iter().position(|&q| q == r).unwrap();
                assert_eq!(
                    m.reduce_scatter(along, &mine, op)?,
                    want[me * 2..me * 2 + 2].to_vec(),
                    "reduce_scatter {op}"
                );
            }
            for e in [
                m.all_reduce(along, &mut mine.clone(), ReduceOp::Avg).unwrap_err(),
                m.all_reduce_into(along, &mine, ReduceOp::Avg).unwrap_err(),
                m.reduce_scatter(along, &mine, ReduceOp::Avg).unwrap_err(),
            ] {
                assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
            }
            // all_to_all: member j gets block j of everyone.
            let me = g.iter().position(|&q| q == r).unwrap();
            let got = m.all_to_all(along, &mine)?;
            let want: Vec<T> = g.iter().flat_map(|&q| (me * 2..me * 2 + 2).map(move |i| part::<T>(q, i))).collect();
            assert_eq!(got, want, "all_to_all");
            // broadcast from member 1.
            let mut buf = mine.clone();
            m.broadcast(along, &mut buf, 1)?;
            assert_eq!(buf, (0..4).map(|i| part::<T>(g[1], i)).collect::<Vec<T>>(), "broadcast");
            // scatter of blocks of 2 from member 0.
            let got = m.scatter(along, &mine, 2, 0)?;
            assert_eq!(got, (me * 2..me * 2 + 2).map(|i| part::<T>(g[0], i)).collect::<Vec<T>>(), "scatter");
        }
        Ok(())
    });
    outs.unwrap();
}

#[test]
fn every_mesh_collective_is_exact_for_integers() {
    check_collectives::<i64>();
    check_collectives::<i32>();
    check_collectives::<u8>();
}

#[test]
fn casts_between_integers_and_floats() {
    let outs = run(2, |ctx| {
        let m = ctx.init_device_mesh(&[2], &["a"])?;
        let ids = ArrayD::from_shape_vec(IxDyn(&[5]), vec![-3i64, 0, 7, 1 << 40, (1 << 62) + 1]).unwrap();
        let t = distribute_tensor(&ids, &m, &[Shard(0)], Some(0))?;
        // Same type: a bit copy, exact beyond 2⁵³.
        let same = t.cast::<i64>()?.full_tensor()?;
        let f = t.cast::<f64>()?.full_tensor()?;
        let back = t.cast::<f64>()?.cast::<i32>()?.full_tensor()?;
        let floats = ArrayD::from_shape_vec(IxDyn(&[4]), vec![2.9f32, -2.9, 255.5, -1.0]).unwrap();
        let fl = distribute_tensor(&floats, &m, &[Shard(0)], None)?;
        Ok((same, f, back, fl.cast::<i64>()?.full_tensor()?, fl.cast::<u8>()?.full_tensor()?))
    })
    .unwrap();
    for (same, f, back, trunc, sat) in outs {
        assert_eq!(same.as_slice().unwrap(), &[-3, 0, 7, 1 << 40, (1 << 62) + 1]);
        assert_eq!(f.as_slice().unwrap(), &[-3.0, 0.0, 7.0, (1u64 << 40) as f64, (1u64 << 62) as f64]);
        // Float to integer as Rust's `as`: toward zero, saturating.
        assert_eq!(&back.as_slice().unwrap()[..3], &[-3, 0, 7]);
        assert_eq!(back.as_slice().unwrap()[3], i32::MAX);
        assert_eq!(trunc.as_slice().unwrap(), &[2, -2, 255, -1]);
        assert_eq!(sat.as_slice().unwrap(), &[2, 0, 255, 0]);
    }
}

/// Casts between integer types are Rust's `as` (PyTorch's): exact, wrapping when narrower,
/// never through f64 (which would round values beyond 2⁵³), on an uneven 2-rank shard.
#[test]
fn casts_between_integers_are_exact_and_wrap_like_as() {
    let big: Vec<i64> =
        vec![(1 << 62) + 1, (1 << 62) - 1, -(1 << 62) - 3, i64::MAX, i64::MIN, (1 << 53) + 1, -1, 300, -129];
    let outs = run(2, |ctx| {
        let m = ctx.init_device_mesh(&[2], &["a"])?;
        let t = distribute_tensor(ArrayD::from_shape_vec(IxDyn(&[9]), big.clone()).unwrap(), &m, &[Shard(0)], Some(0))?;
        let (i32s, u8s) = (t.cast::<i32>()?, t.cast::<u8>()?);
        let back: (ArrayD<i64>, ArrayD<i64>) = (i32s.cast::<i64>()?.full_tensor()?, u8s.cast::<i64>()?.full_tensor()?);
        let to_u8_from_i32 = i32s.cast::<u8>()?.full_tensor()?;
        let to_i32_from_u8 = u8s.cast::<i32>()?.full_tensor()?;
        Ok((i32s.full_tensor()?, u8s.full_tensor()?, back, to_u8_from_i32, to_i32_from_u8))
    })
    .unwrap();
    for (i32s, u8s, (from_i32, from_u8), u8_of_i32, i32_of_u8) in outs {
        let want32: Vec<i32> = big.iter().map(|&v| v as i32).collect();
        let want8: Vec<u8> = big.iter().map(|&v| v as u8).collect();
        assert_eq!(i32s.as_slice().unwrap(), want32.as_slice());
        assert_eq!(u8s.as_slice().unwrap(), want8.as_slice());
        assert_eq!(from_i32.as_slice().unwrap(), want32.iter().map(|&v| v as i64).collect::<Vec<_>>().as_slice());
        assert_eq!(from_u8.as_slice().unwrap(), want8.iter().map(|&v| v as i64).collect::<Vec<_>>().as_slice());
        assert_eq!(u8_of_i32.as_slice().unwrap(), want32.iter().map(|&v| v as u8).collect::<Vec<_>>().as_slice());
        assert_eq!(i32_of_u8.as_slice().unwrap(), want8.iter().map(|&v| v as i32).collect::<Vec<_>>().as_slice());
    }
    // i64 → f32 rounds once, as Rust's `as` (not through f64 first).
    let v = (1i64 << 53) + (1 << 29) + 1;
    let f = run(1, |ctx| {
        let m = ctx.init_device_mesh(&[1], &["a"])?;
        let t = distribute_tensor(ArrayD::from_shape_vec(IxDyn(&[1]), vec![v]).unwrap(), &m, &[Replicate], None)?;
        t.cast::<f32>()?.full_tensor()
    })
    .unwrap();
    assert_eq!(f[0][0], v as f32);
}

/// (mesh, table placements, ids placements) for the embedding comparisons.
fn embedding_layouts() -> Vec<(Vec<usize>, Vec<Placement>, Vec<Placement>)> {
    vec![
        (vec![1], vec![Replicate], vec![Replicate]),
        (vec![2], vec![Shard(0)], vec![Replicate]),
        (vec![2], vec![Replicate], vec![Shard(0)]),
        (vec![2], vec![Shard(1)], vec![Replicate]),
        (vec![2, 2], vec![Shard(0), Replicate], vec![Replicate, Shard(1)]),
        (vec![2, 2], vec![Shard(0), Shard(1)], vec![Replicate, Replicate]),
    ]
}

/// `f(table, ids as i64, ids as f32)` on every layout; returns per rank what `f` returns.
fn on_layouts<R: Send>(
    f: impl Fn(&DTensor<f32>, &DTensor<i64>, &DTensor<f32>) -> dtensor_runtime::Result<R> + Sync,
) -> Vec<R> {
    let table = ArrayD::from_shape_fn(IxDyn(&[7, 4]), |ix| (ix[0] * 4 + ix[1]) as f32 * 0.25 - 3.0);
    let ids: Vec<i64> = vec![0, 6, 3, 2, 2, 5];
    let ids_i = ArrayD::from_shape_vec(IxDyn(&[2, 3]), ids.clone()).unwrap();
    let ids_f = ids_i.mapv(|v| v as f32);
    let mut out = Vec::new();
    for (mesh, wp, ip) in embedding_layouts() {
        let world: usize = mesh.iter().product();
        out.extend(
            run(world, |ctx| {
                let n = names(mesh.len());
                let refs: Vec<&str> = n.iter().map(String::as_str).collect();
                let m = ctx.init_device_mesh(&mesh, &refs)?;
                let w = distribute_tensor(&table, &m, &wp, None)?.requires_grad_(true);
                let i = distribute_tensor(&ids_i, &m, &ip, None)?;
                let fl = distribute_tensor(&ids_f, &m, &ip, None)?;
                f(&w, &i, &fl)
            })
            .unwrap(),
        );
    }
    out
}

#[test]
fn embedding_with_i64_ids_equals_the_float_id_path() {
    let outs = on_layouts(|w, ids, fids| {
        let a = w.embedding(ids)?;
        a.sum()?.backward()?;
        let ga = w.grad().unwrap().full_tensor()?;
        w.zero_grad();
        let b = w.embedding(fids)?;
        b.sum()?.backward()?;
        let gb = w.grad().unwrap().full_tensor()?;
        Ok((a.full_tensor()?, b.full_tensor()?, ga, gb))
    });
    for (a, b, ga, gb) in outs {
        assert_eq!(a, b);
        assert_eq!(ga, gb);
        // Row 2 is looked up twice, rows 1 and 4 never.
        assert_eq!(ga[[2, 0]], 2.0);
        assert_eq!(ga[[1, 0]], 0.0);
    }
}

#[test]
fn cross_entropy_with_i64_targets_equals_the_float_target_path() {
    // Logits [2, 3, 7] against the ids as class targets [2, 3].
    let outs = on_layouts(|w, ids, fids| {
        let logits = w.embedding(fids)?.matmul(&w.transpose(0, 1)?)?;
        let a = logits.cross_entropy(ids)?;
        a.backward_retaining_graph()?; // `logits` is backpropagated again below
        let ga = w.grad().unwrap().full_tensor()?;
        w.zero_grad();
        let b = logits.cross_entropy(fids)?;
        b.backward()?;
        let gb = w.grad().unwrap().full_tensor()?;
        Ok((a.full_tensor()?, b.full_tensor()?, ga, gb))
    });
    let one = &outs[0];
    for (a, b, ga, gb) in &outs {
        assert_eq!(a, b);
        assert_eq!(ga, gb);
        // Every layout agrees with one rank (up to summation order).
        assert!((a.sum() - one.0.sum()).abs() < 1e-4, "{a} vs {}", one.0);
    }
}

#[test]
fn bad_integer_ids_are_typed_errors() {
    let errs = run(1, |ctx| {
        let m = ctx.init_device_mesh(&[1], &["x"])?;
        let w = distribute_tensor(ArrayD::<f32>::ones(IxDyn(&[5, 2])), &m, &[Replicate], None)?;
        let mut errs = Vec::new();
        for bad in [-1i64, 5, 1 << 40] {
            let ids = distribute_tensor(ArrayD::from_elem(IxDyn(&[2]), bad), &m, &[Replicate], None)?;
            errs.push(w.embedding(&ids).map(|_| ()).unwrap_err());
            let logits = distribute_tensor(ArrayD::<f32>::ones(IxDyn(&[2, 5])), &m, &[Replicate], None)?;
            errs.push(logits.cross_entropy(&ids).map(|_| ()).unwrap_err());
        }
        // An i32 id of 257 into a bf16 table of 5 rows: out of range (read as i64, never
        // rounded to a row bf16 holds).
        let wb = w.cast::<dtensor_runtime::bf16>()?;
        let ids = distribute_tensor(ArrayD::from_elem(IxDyn(&[1]), 257i32), &m, &[Replicate], None)?;
        errs.push(wb.embedding(&ids).map(|_| ()).unwrap_err());
        Ok(errs)
    })
    .unwrap();
    for e in &errs[0] {
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    }
}

#[test]
fn byte_masks_in_where_and_masked_fill_equal_the_float_mask_path() {
    use dtensor_runtime::op::BinaryOp;
    let a = ArrayD::from_shape_fn(IxDyn(&[5, 3]), |ix| (ix[0] * 3 + ix[1]) as f32 * 0.5 - 3.0);
    let b = ArrayD::from_shape_fn(IxDyn(&[5, 3]), |ix| (ix[1] * 5 + ix[0]) as f32 * 0.3 - 2.0);
    let mut all = Vec::new();
    for (mesh, p) in layouts() {
        let world: usize = mesh.iter().product();
        all.extend(
            run(world, |ctx| {
                let n = names(mesh.len());
                let refs: Vec<&str> = n.iter().map(String::as_str).collect();
                let m = ctx.init_device_mesh(&mesh, &refs)?;
                let x = distribute_tensor(&a, &m, &p, None)?.requires_grad_(true);
                let y = distribute_tensor(&b, &m, &p, None)?;
                let fmask = x.lt_mask(&y)?;
                let bmask = x.compare_mask(BinaryOp::Lt, &y)?;
                assert_eq!(bmask.full_tensor()?, fmask.full_tensor()?.mapv(|v| v as u8));
                let wf = x.where_(&fmask, &y)?;
                let wb = x.where_(&bmask, &y)?;
                wb.sum()?.backward()?;
                let gb = x.grad().unwrap().full_tensor()?;
                x.zero_grad();
                wf.sum()?.backward()?;
                let gf = x.grad().unwrap().full_tensor()?;
                let mf = x.masked_fill(&fmask, f32::NEG_INFINITY)?.full_tensor()?;
                let mb = x.masked_fill(&bmask, f32::NEG_INFINITY)?.full_tensor()?;
                assert!(x.compare_mask(BinaryOp::Add, &y).is_err());
                Ok((wf.full_tensor()?, wb.full_tensor()?, gf, gb, mf, mb, bmask.full_tensor()?))
            })
            .unwrap(),
        );
    }
    let one = all[0].clone();
    for (wf, wb, gf, gb, mf, mb, mask) in all {
        assert_eq!(wf, wb);
        assert_eq!(gf, gb);
        assert_eq!(mf, mb);
        // Every layout equals one rank.
        assert_eq!((&wb, &gb, &mb, &mask), (&one.1, &one.3, &one.5, &one.6));
    }
    let m = &one.6;
    assert!(m.iter().any(|&v| v == 1) && m.iter().any(|&v| v == 0), "the mask mixes both values: {m}");
}

fn check_checkpoints<T: Scalar>() {
    checkpoint_util::check_native_round_trip(&global::<T>(&[7, 5]), &global::<T>(&[1, 3]));
}

#[test]
fn checkpoints_save_and_load_integers_natively() {
    check_checkpoints::<i64>();
    check_checkpoints::<i32>();
    check_checkpoints::<u8>();
}
