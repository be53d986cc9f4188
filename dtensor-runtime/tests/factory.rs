//! Factories build only the local shard, with values that agree with the single-rank tensor.

mod common;

use common::coord_of;
use dtensor_runtime::layout::checked_local_shape_and_offset;
use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::{
    arange, bf16, empty, full, linspace, logspace, manual_seed, ones, rand, randn, run, zeros, DTensor, Error,
    Placement, Replicate, Scalar, Shard, TensorOptions,
};

fn layouts_2x2() -> Vec<Vec<Placement>> {
    vec![
        vec![Replicate, Replicate],
        vec![Shard(0), Replicate],
        vec![Replicate, Shard(1)],
        vec![Shard(0), Shard(1)],
        vec![Shard(1), Shard(0)],
        vec![Shard(0), Shard(0)],
        vec![Shard(-1), Shard(-1)],
    ]
}

#[test]
fn local_shard_shapes_follow_torch_chunk() {
    // 7 x 5 on a 2x2 mesh: every factory allocates exactly the chunk of each rank.
    let size = [7usize, 5];
    for p in layouts_2x2() {
        let shapes = run(4, |ctx| {
            let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
            let o = TensorOptions::new().mesh(&mesh).placements(&p);
            let ts: Vec<DTensor<f32>> = vec![
                empty(&size, &o)?,
                zeros(&size, &o)?,
                ones(&size, &o)?,
                full(&size, 3.5, &o)?,
                rand(&size, &o)?,
                randn(&size, &o)?,
            ];
            Ok(ts.iter().map(|t| (t.local().shape().to_vec(), t.shape().to_vec())).collect::<Vec<_>>())
        })
        .unwrap();
        for (rank, per_rank) in shapes.iter().enumerate() {
            let norm: Vec<Placement> = p.iter().map(|x| x.normalize(2).unwrap()).collect();
            let (want, _) = checked_local_shape_and_offset(&size, &[2, 2], &coord_of(rank, &[2, 2]), &norm).unwrap();
            for (local, global) in per_rank {
                assert_eq!(local, &want, "rank {rank} {p:?}");
                assert_eq!(global, &size.to_vec());
            }
        }
    }
}

#[test]
fn constant_factories_hold_their_value() {
    let out = run(3, |ctx| {
        let mesh = ctx.init_device_mesh(&[3], &["x"])?;
        let o = TensorOptions::new().mesh(&mesh).placements(&[Shard(0)]);
        let z = zeros::<f64>(&[4, 2], &o)?.full_tensor()?;
        let on = ones::<f64>(&[4, 2], &o)?.full_tensor()?;
        let f = full::<f64>(&[4, 2], -2.25, &o)?.full_tensor()?;
        Ok((z, on, f))
    })
    .unwrap();
    for (z, on, f) in out {
        assert_eq!(z, ArrayD::<f64>::zeros(vec![4, 2]));
        assert_eq!(on, ArrayD::<f64>::ones(vec![4, 2]));
        assert_eq!(f, ArrayD::from_elem(vec![4, 2], -2.25));
    }
}

/// The full tensor of rand/randn for one layout, on a 2x2 mesh.
fn random_full(p: &[Placement], normal: bool) -> ArrayD<f32> {
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        manual_seed(1234);
        let o = TensorOptions::new().mesh(&mesh).placements(p);
        // A first call advances the generator identically everywhere.
        let _ = rand::<f32>(&[3], &o.clone().placements(&[Replicate, Replicate]))?;
        let t = if normal { randn::<f32>(&[9, 7], &o)? } else { rand::<f32>(&[9, 7], &o)? };
        t.full_tensor()
    })
    .unwrap();
    for f in &out[1..] {
        assert_eq!(f, &out[0], "ranks disagree on the full tensor");
    }
    out.into_iter().next().unwrap()
}

fn random_single_rank(normal: bool) -> ArrayD<f32> {
    run(1, |ctx| {
        ctx.init_device_mesh(&[1], &["x"])?;
        manual_seed(1234);
        let _ = rand::<f32>(&[3], &TensorOptions::new())?;
        let t = if normal {
            randn::<f32>(&[9, 7], &TensorOptions::new())?
        } else {
            rand::<f32>(&[9, 7], &TensorOptions::new())?
        };
        t.to_host()
    })
    .unwrap()
    .remove(0)
}

#[test]
fn rand_and_randn_are_bit_identical_across_layouts() {
    for normal in [false, true] {
        let reference = random_single_rank(normal);
        let mut layouts = 0;
        for p in layouts_2x2() {
            let f = random_full(&p, normal);
            assert_eq!(
                f.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                reference.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "normal={normal} layout {p:?}"
            );
            layouts += 1;
        }
        assert!(layouts >= 5);
        // Not degenerate: values differ and have the right range / moments.
        let n = reference.len() as f32;
        let mean = reference.sum() / n;
        if normal {
            assert!(mean.abs() < 0.5, "randn mean {mean}");
            assert!(reference.iter().any(|&x| x < 0.0));
        } else {
            assert!(reference.iter().all(|&x| x > 0.0 && x < 1.0));
            assert!((mean - 0.5).abs() < 0.15, "rand mean {mean}");
        }
    }
}

#[test]
fn seeds_and_successive_calls_differ() {
    let out = run(1, |ctx| {
        ctx.init_device_mesh(&[1], &["x"])?;
        manual_seed(1);
        let a = rand::<f64>(&[16], &TensorOptions::new())?.to_host()?;
        let b = rand::<f64>(&[16], &TensorOptions::new())?.to_host()?;
        manual_seed(2);
        let c = rand::<f64>(&[16], &TensorOptions::new())?.to_host()?;
        manual_seed(1);
        let a2 = rand::<f64>(&[16], &TensorOptions::new())?.to_host()?;
        Ok((a, b, c, a2))
    })
    .unwrap();
    let (a, b, c, a2) = &out[0];
    assert_ne!(a, b);
    assert_ne!(a, c);
    assert_eq!(a, a2);
}

#[test]
fn linspace_and_logspace_match_single_rank() {
    for steps in [0usize, 1, 2, 7, 10, 33] {
        let single = run(1, |ctx| {
            ctx.init_device_mesh(&[1], &["x"])?;
            Ok((
                linspace::<f64>(-3.0, 5.0, steps, &TensorOptions::new())?.to_host()?,
                logspace::<f32>(-2.0, 2.0, steps, 10.0, &TensorOptions::new())?.to_host()?,
            ))
        })
        .unwrap()
        .remove(0);
        if steps >= 2 {
            assert_eq!(single.0[0], -3.0);
            assert_eq!(single.0[steps - 1], 5.0);
            assert!((single.1[0] - 0.01).abs() < 1e-6);
        }
        for world in [2usize, 3, 4] {
            let out = run(world, |ctx| {
                let mesh = ctx.init_device_mesh(&[world], &["x"])?;
                let o = TensorOptions::new().mesh(&mesh).placements(&[Shard(0)]);
                let lin = linspace::<f64>(-3.0, 5.0, steps, &o)?;
                let log = logspace::<f32>(-2.0, 2.0, steps, 10.0, &o)?;
                Ok((lin.local().len(), lin.full_tensor()?, log.full_tensor()?))
            })
            .unwrap();
            for (local_len, lin, log) in out {
                assert!(local_len <= steps.div_ceil(world));
                assert_eq!(lin, single.0, "linspace steps={steps} world={world}");
                assert_eq!(log, single.1, "logspace steps={steps} world={world}");
            }
        }
    }
}

#[test]
fn factories_reject_bad_input() {
    let errs = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let partial = zeros::<f32>(&[4], &TensorOptions::new().mesh(&mesh).placements(&[Placement::PARTIAL_SUM]));
        let dim = zeros::<f32>(&[4], &TensorOptions::new().mesh(&mesh).placements(&[Shard(1)]));
        let count = zeros::<f32>(&[4], &TensorOptions::new().mesh(&mesh).placements(&[Shard(0), Shard(0)]));
        let base = logspace::<f32>(0.0, 1.0, 4, -1.0, &TensorOptions::new());
        dtensor_runtime::set_current_mesh(None);
        let no_mesh = zeros::<f32>(&[4], &TensorOptions::new());
        Ok(vec![partial.unwrap_err(), dim.unwrap_err(), count.unwrap_err(), base.unwrap_err(), no_mesh.unwrap_err()])
    })
    .unwrap();
    let e = &errs[0];
    assert!(matches!(e[0], Error::PartialNotAllowed { .. }), "{}", e[0]);
    assert!(matches!(e[1], Error::ShardDimOutOfRange { dim: 1, ndim: 1 }), "{}", e[1]);
    assert!(matches!(e[2], Error::PlacementCountMismatch { given: 2, mesh_ndim: 1 }), "{}", e[2]);
    assert!(matches!(e[3], Error::InvalidArgument { .. }), "{}", e[3]);
    assert!(matches!(e[4], Error::InvalidArgument { .. }), "{}", e[4]);
    assert!(e[4].to_string().contains("no device mesh"));
}

/// `arange(start, end, step)` on 1 rank, on 1-D meshes of 2, 3, 4 and 5 ranks and on a 2×2
/// mesh (uneven chunks and empty shards), all equal to `want` (the values an independent
/// loop computes); each rank holds only its torch.chunk share.
fn check_arange<T: Scalar>(start: T, end: T, step: T, want: &[T]) {
    let single = run(1, |ctx| {
        ctx.init_device_mesh(&[1], &["x"])?;
        arange(start, end, step, &TensorOptions::new())?.to_host()
    })
    .unwrap()
    .remove(0);
    assert_eq!(single.as_slice().unwrap(), want, "1 rank: arange({start}, {end}, {step})");
    let n = want.len();
    let meshes: Vec<(Vec<usize>, Vec<Placement>)> = vec![
        (vec![2], vec![Shard(0)]),
        (vec![3], vec![Shard(0)]),
        (vec![4], vec![Shard(0)]),
        (vec![5], vec![Replicate]),
        (vec![2, 2], vec![Shard(0), Shard(0)]),
        (vec![2, 2], vec![Replicate, Shard(0)]),
    ];
    for (shape, p) in meshes {
        let world: usize = shape.iter().product();
        let out = run(world, |ctx| {
            let mesh = ctx.init_device_mesh(&shape, &["a", "b"][..shape.len()])?;
            let t = arange(start, end, step, &TensorOptions::new().mesh(&mesh).placements(&p))?;
            let (local, _) =
                checked_local_shape_and_offset(&[n], mesh.shape(), &coord_of(ctx.rank(), mesh.shape()), &p)?;
            assert_eq!(t.local().shape(), local.as_slice());
            t.full_tensor()
        })
        .unwrap();
        for full in out {
            assert_eq!(full, single, "arange({start}, {end}, {step}) on {shape:?} {p:?}");
        }
    }
}

#[test]
fn arange_matches_single_rank_for_every_dtype() {
    // Integers: exact, including values near 2⁶² that f64 would round.
    let big = 1i64 << 62;
    check_arange::<i64>(big - 5, big + 6, 3, &[big - 5, big - 2, big + 1, big + 4]);
    check_arange::<i64>(7, -6, -4, &[7, 3, -1, -5]);
    check_arange::<i64>(i64::MIN, i64::MAX, i64::MAX, &[i64::MIN, -1, i64::MAX - 1]);
    check_arange::<i64>(3, 3, 1, &[]);
    check_arange::<i32>(-2, 9, 1, &(-2..9).collect::<Vec<i32>>());
    check_arange::<i32>(0, 7, 5, &[0, 5]);
    check_arange::<u8>(250, 255, 2, &[250, 252, 254]);
    check_arange::<u8>(0, 3, 1, &[0, 1, 2]);
    // Floats: ceil((end - start) / step) values start + i·step, computed in f64.
    let float_want = |a: f64, b: f64, s: f64| -> Vec<f64> {
        let n = ((b - a) / s).ceil().max(0.0) as usize;
        (0..n).map(|i| a + s * i as f64).collect()
    };
    check_arange::<f64>(0.0, 1.0, 0.1, &float_want(0.0, 1.0, 0.1));
    assert_eq!(float_want(0.0, 1.0, 0.1).len(), 10);
    check_arange::<f64>(1.5, -2.0, -0.75, &float_want(1.5, -2.0, -0.75));
    // The bounds and step are values of T: the step is 0.3f32 (0.30000001192..), not 0.3.
    let f32s: Vec<f32> = float_want(-1.0, 2.0, 0.3f32 as f64).into_iter().map(|v| v as f32).collect();
    check_arange::<f32>(-1.0, 2.0, 0.3, &f32s);
    let halves: Vec<bf16> = float_want(0.0, 3.0, 0.5).into_iter().map(bf16::from_f64).collect();
    check_arange::<bf16>(bf16::from_f32(0.0), bf16::from_f32(3.0), bf16::from_f32(0.5), &halves);
}

#[test]
fn arange_rejects_zero_wrong_sign_and_non_finite_steps() {
    let errs = run(1, |ctx| {
        ctx.init_device_mesh(&[1], &["x"])?;
        let o = TensorOptions::new();
        Ok(vec![
            arange::<i64>(0, 5, 0, &o).unwrap_err(),
            arange::<i32>(0, 5, -1, &o).unwrap_err(),
            arange::<u8>(5, 0, 1, &o).unwrap_err(),
            arange::<f32>(0.0, 1.0, 0.0, &o).unwrap_err(),
            arange::<f64>(1.0, 0.0, 0.5, &o).unwrap_err(),
            arange::<f64>(0.0, f64::INFINITY, 1.0, &o).unwrap_err(),
            arange::<f64>(0.0, 1.0, f64::NAN, &o).unwrap_err(),
            arange::<f64>(0.0, 1e300, 1e-300, &o).unwrap_err(),
        ])
    })
    .unwrap()
    .remove(0);
    let reasons = ["non-zero", "points away", "points away", "non-zero", "points away", "finite", "finite", "too many"];
    for (e, why) in errs.iter().zip(reasons) {
        assert!(matches!(e, Error::InvalidArgument { context, .. } if context == "arange"), "{e}");
        assert!(e.to_string().contains(why), "{e} should say {why}");
    }
}
