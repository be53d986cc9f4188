//! The typed ops a Hugging Face checkpoint needs — `linear` (weights `[out, in]`), rotary
//! embeddings, the ignore-index loss (`cross_entropy_sum`, `count_ne`) — on a 2×2 mesh
//! against the host reference and the dynamic ops: same values, and no collective beyond
//! the ones the code shows (loss parallelism's statistics, the explicit redistributes).

use dtensor_runtime::ndarray::{Array2, ArrayD, Ix2, IxDyn};
use dtensor_runtime::typed::dims::{dp, tp};
use dtensor_runtime::typed::rotary::rotary_tables;
use dtensor_runtime::typed::Dt;
use dtensor_runtime::{
    distribute_tensor, run, CollectiveKind, CommDebugMode, CrossEntropyOptions, Partial, Replicate, RotaryStyle, Shard,
    Sum,
};

type M = (dp, tp);

fn values(shape: &[usize], seed: u64) -> ArrayD<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % 1000) as f64 / 250.0 - 2.0
    })
}

#[test]
fn typed_linear_column_then_row_parallel() {
    // x [5, 6] (5 rows over dp: uneven), up [7, 6] (7 rows over tp: uneven), down [6, 7].
    let (x, up, down) = (values(&[5, 6], 1), values(&[7, 6], 2), values(&[6, 7], 3));
    let m2 = |a: &ArrayD<f64>| a.clone().into_dimensionality::<Ix2>().unwrap();
    let want: Array2<f64> = m2(&x).dot(&m2(&up).t()).dot(&m2(&down).t());
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let xd: Dt<f64, M, (Shard<0>, Replicate), 2> = Dt::distribute(&x, &mesh)?;
        let upd: Dt<f64, M, (Replicate, Shard<0>), 2> = Dt::distribute(&up, &mesh)?;
        let downd: Dt<f64, M, (Replicate, Shard<1>), 2> = Dt::distribute(&down, &mesh)?;
        let mode = CommDebugMode::new();
        let y: Dt<f64, M, (Shard<0>, Partial<Sum>), 2> = mode.scope(|| xd.linear(&upd)?.linear(&downd))?;
        Ok((mode.total(), y.full_tensor()?))
    })
    .unwrap();
    for (comms, y) in out {
        assert_eq!(comms, 0, "column- then row-parallel linear is local");
        let err = (&m2(&y) - &want).iter().fold(0.0f64, |a, d| a.max(d.abs()));
        assert!(err < 1e-12, "max error {err}");
    }
}

#[test]
fn typed_rotary_equals_dynamic_on_head_and_sequence_shards() {
    let x = values(&[1, 3, 5, 8], 4); // [batch, heads (3 over dp), seq (5 over tp), head_dim]
    for style in [RotaryStyle::Half, RotaryStyle::Interleaved] {
        let out = run(4, |ctx| {
            let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
            let xd: Dt<f64, M, (Shard<1>, Shard<2>), 4> = Dt::distribute(&x, &mesh)?;
            let (cos, sin) = rotary_tables::<f64, M>(5, 8, 10000.0, style, &mesh)?;
            let mode = CommDebugMode::new();
            let y: Dt<f64, M, (Shard<1>, Shard<2>), 4> = mode.scope(|| xd.apply_rotary(&cos, &sin, style))?;
            let one = dtensor_runtime::TensorOptions::new().mesh(&mesh);
            let (c, s) = style.tables::<f64>(5, 8, 10000.0, &one)?;
            let dynamic =
                distribute_tensor(&x, &mesh, &[Replicate, Replicate], None)?.apply_rotary_with(&c, &s, style)?;
            Ok((mode.total(), y.full_tensor()?, dynamic.full_tensor()?))
        })
        .unwrap();
        for (comms, typed, dynamic) in out {
            assert_eq!(comms, 0, "{style:?}: rotary is local");
            assert_eq!(typed, dynamic, "{style:?}");
        }
    }
}

#[test]
fn typed_ignore_index_mean_shows_its_collectives() {
    // Logits [2, 5, 7]: batch over dp, classes (7 over 2: uneven) over tp; labels with -100.
    let logits = values(&[2, 5, 7], 5);
    let labels = ArrayD::from_shape_fn(IxDyn(&[2, 5]), |i| {
        let k = i[0] * 5 + i[1];
        if k % 3 == 1 {
            -100i64
        } else {
            ((k * 5) % 7) as i64
        }
    });
    // The host reference: the mean over counted targets of -log softmax at the label.
    let (mut total, mut n) = (0.0, 0.0);
    for b in 0..2 {
        for s in 0..5 {
            let t = labels[[b, s]];
            if t == -100 {
                continue;
            }
            let row: Vec<f64> = (0..7).map(|c| logits[[b, s, c]]).collect();
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            total += lse - row[t as usize];
            n += 1.0;
        }
    }
    let want = total / n;
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let x: Dt<f64, M, (Shard<0>, Shard<2>), 3> = Dt::distribute(&logits, &mesh)?;
        let t: Dt<i64, M, (Shard<0>, Replicate), 2> = Dt::distribute(&labels, &mesh)?;
        let mode = CommDebugMode::new();
        let total: Dt<f64, M, (Partial<Sum>, Partial<Sum>), 0> =
            mode.scope(|| x.cross_entropy_sum_loss_parallel(&t, Some(-100)))?;
        let stats = mode.count(CollectiveKind::AllReduce);
        let count: Dt<f64, M, (Partial<Sum>, Replicate), 0> = mode.scope(|| t.count_ne(-100))?;
        let after_count = mode.total();
        let total: Dt<f64, M, (Replicate, Replicate), 0> = total.redistribute()?;
        let count: Dt<f64, M, (Replicate, Replicate), 0> = count.redistribute()?;
        let mean = total.div(&count)?;
        let dynamic = x
            .as_dtensor()
            .cross_entropy_with(t.as_dtensor(), &CrossEntropyOptions::new().ignore_index(-100))?
            .full_tensor()?;
        Ok((stats, after_count, mean.full_tensor()?, dynamic))
    })
    .unwrap();
    for (stats, after_count, mean, dynamic) in out {
        assert_eq!(stats, 2, "loss parallelism all-reduces its two row statistics");
        assert_eq!(after_count, stats, "count_ne communicates nothing");
        let (m, d) = (mean.sum(), dynamic.sum());
        assert!((m - want).abs() < 1e-12 && (d - want).abs() < 1e-12, "typed {m}, dynamic {d}, reference {want}");
    }
}
