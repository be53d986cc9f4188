//! The user's fused ops against the same computation composed of built-in ops, on 1 rank, 4
//! ranks (`[4]`) and a 2×2 mesh, forward and backward, with uneven and empty shards: values
//! equal to the composed ops' (and to the single-rank result), output layouts as the rules
//! say, and no collective where the rules need none.

use dtensor::ndarray::{ArrayD, Dimension, IxDyn};
use dtensor::{
    apply_op, distribute_tensor, CollectiveKind, CommDebugMode, DTensor, DeviceMesh, Partial, Placement, ReduceOp,
    Replicate, Result, Shard,
};
use dtensor_user_ops::{Linear, RmsNormLinear, SwiGlu};

const MESHES: [(&[usize], &[&str]); 3] = [(&[1], &["tp"]), (&[4], &["tp"]), (&[2, 2], &["dp", "tp"])];

fn global(shape: &[usize], seed: usize) -> ArrayD<f64> {
    ArrayD::from_shape_fn(IxDyn(shape), |ix| {
        let k = ix.slice().iter().fold(seed, |a, &i| a * 31 + i * 7 + 3);
        ((k % 97) as f64) / 97.0 * 2.0 - 1.0
    })
}

fn leaf(g: &ArrayD<f64>, mesh: &DeviceMesh, ps: &[Placement]) -> Result<DTensor<f64>> {
    Ok(distribute_tensor(g, mesh, ps, Some(0))?.requires_grad_(true))
}

fn assert_close(what: &str, got: &ArrayD<f64>, want: &ArrayD<f64>) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-12 * w.abs().max(1.0), "{what}: {g} vs {w}");
    }
}

/// Every layout the test tries on a mesh of `n` dims, for tensors of rank 2.
fn layouts(n: usize) -> Vec<Vec<Placement>> {
    let one = [Replicate, Shard(0), Shard(1)];
    match n {
        1 => one.iter().map(|p| vec![*p]).collect(),
        _ => one.iter().flat_map(|a| one.iter().map(move |b| vec![*a, *b])).collect(),
    }
}

/// (output, grad of input 0, grad of input 1), all gathered.
type Run = (ArrayD<f64>, ArrayD<f64>, ArrayD<f64>);

fn forward_backward(
    a: &DTensor<f64>,
    b: &DTensor<f64>,
    op: impl Fn(&DTensor<f64>, &DTensor<f64>) -> Result<DTensor<f64>>,
) -> Result<Run> {
    let y = op(a, b)?;
    // a loss that weighs every element differently, so a wrong gradient element shows
    let w =
        distribute_tensor(global(y.shape(), 9), y.device_mesh(), &vec![Replicate; y.device_mesh().ndim()], Some(0))?;
    y.mul(&w)?.sum()?.backward()?;
    let grad = |x: &DTensor<f64>| x.grad().expect("a gradient").full_tensor();
    Ok((y.full_tensor()?, grad(a)?, grad(b)?))
}

#[test]
fn swiglu_equals_silu_times_up_on_every_layout_forward_and_backward() {
    // 5 × 3 over 4 ranks: rows 2, 2, 1, 0 (an empty shard); columns 1, 1, 1, 0
    let (gate, up) = (global(&[5, 3], 1), global(&[5, 3], 2));
    let reference = dtensor::run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["tp"])?;
        let (a, b) = (leaf(&gate, &mesh, &[Replicate])?, leaf(&up, &mesh, &[Replicate])?);
        forward_backward(&a, &b, |a, b| a.silu()?.mul(b))
    })
    .unwrap()
    .remove(0);
    for (shape, names) in MESHES {
        let n: usize = shape.iter().product();
        let (gate, up, reference) = (gate.clone(), up.clone(), reference.clone());
        dtensor::run(n, move |ctx| {
            let mesh = ctx.init_device_mesh(shape, names)?;
            for ps in layouts(shape.len()) {
                let fused = {
                    let (a, b) = (leaf(&gate, &mesh, &ps)?, leaf(&up, &mesh, &ps)?);
                    let mode = CommDebugMode::new();
                    let y = mode.scope(|| apply_op(&SwiGlu, &[&a, &b]))?;
                    assert_eq!(y.placements(), ps.as_slice(), "same layout in, same out");
                    assert_eq!(mode.total(), 0, "an element-wise op on matching layouts communicates nothing");
                    forward_backward(&a, &b, |a, b| apply_op(&SwiGlu, &[a, b]))?
                };
                let composed = {
                    let (a, b) = (leaf(&gate, &mesh, &ps)?, leaf(&up, &mesh, &ps)?);
                    forward_backward(&a, &b, |a, b| a.silu()?.mul(b))?
                };
                for (what, got, want, one) in [
                    ("output", &fused.0, &composed.0, &reference.0),
                    ("gate grad", &fused.1, &composed.1, &reference.1),
                    ("up grad", &fused.2, &composed.2, &reference.2),
                ] {
                    assert_close(&format!("{what} on {shape:?} {ps:?} vs composed"), got, want);
                    assert_close(&format!("{what} on {shape:?} {ps:?} vs 1 rank"), got, one);
                }
            }
            Ok(())
        })
        .unwrap();
    }
}

#[test]
fn swiglu_takes_inputs_of_different_layouts_through_the_cheapest_move() {
    let (gate, up) = (global(&[6, 4], 3), global(&[6, 4], 4));
    let out = dtensor::run(4, move |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["tp"])?;
        let a = distribute_tensor(&gate, &mesh, &[Shard(0)], Some(0))?;
        let b = distribute_tensor(&up, &mesh, &[Replicate], Some(0))?;
        let mode = CommDebugMode::new();
        let y = mode.scope(|| apply_op(&SwiGlu, &[&a, &b]))?;
        // Replicate → Shard(0) is a local slice: the cheapest strategy moves no byte
        assert_eq!(y.placements(), &[Shard(0)]);
        assert_eq!(mode.total(), 0);
        let want = a.silu()?.mul(&b)?.full_tensor()?;
        Ok((y.full_tensor()?, want))
    })
    .unwrap();
    for (got, want) in out {
        assert_close("mixed layouts", &got, &want);
    }
}

/// `Linear`'s four rules, each on the layout that selects it, against `x.matmul(Wᵀ)`.
#[test]
fn linear_equals_x_times_w_transposed_in_every_parallel_style() {
    // x: [batch 3, seq 5, in 6], W: [out 7, in 6]; 7 outputs over 4 ranks: 2, 2, 2, 1
    let (x, w) = (global(&[3, 5, 6], 5), global(&[7, 6], 6));
    let styles: [(&str, Placement, Placement, Placement); 4] = [
        ("replicated", Replicate, Replicate, Replicate),
        ("column parallel", Replicate, Shard(0), Shard(2)),
        ("row parallel", Shard(2), Shard(1), Partial(ReduceOp::Sum)),
        ("batch sharded", Shard(1), Replicate, Shard(1)),
    ];
    let reference = dtensor::run(1, {
        let (x, w) = (x.clone(), w.clone());
        move |ctx| {
            let mesh = ctx.init_device_mesh(&[1], &["tp"])?;
            let (a, b) = (leaf(&x, &mesh, &[Replicate])?, leaf(&w, &mesh, &[Replicate])?);
            forward_backward(&a, &b, |a, b| a.matmul_t(b, false, true))
        }
    })
    .unwrap()
    .remove(0);
    for n in [1, 4] {
        let (x, w, reference) = (x.clone(), w.clone(), reference.clone());
        dtensor::run(n, move |ctx| {
            let mesh = ctx.init_device_mesh(&[n], &["tp"])?;
            for (style, px, pw, out) in styles {
                let (a, b) = (leaf(&x, &mesh, &[px])?, leaf(&w, &mesh, &[pw])?);
                let mode = CommDebugMode::new();
                let y = mode.scope(|| apply_op(&Linear, &[&a, &b]))?;
                if n > 1 {
                    assert_eq!(y.placements(), &[out], "{style}");
                }
                assert_eq!(mode.total(), 0, "{style}: the forward communicates nothing");
                let fused = forward_backward(&a, &b, |a, b| apply_op(&Linear, &[a, b]))?;
                let (a2, b2) = (leaf(&x, &mesh, &[px])?, leaf(&w, &mesh, &[pw])?);
                let composed = forward_backward(&a2, &b2, |a, b| a.matmul_t(b, false, true))?;
                for (what, got, want, one) in [
                    ("output", &fused.0, &composed.0, &reference.0),
                    ("x grad", &fused.1, &composed.1, &reference.1),
                    ("W grad", &fused.2, &composed.2, &reference.2),
                ] {
                    assert_close(&format!("{style} {what} on {n} ranks vs composed"), got, want);
                    assert_close(&format!("{style} {what} on {n} ranks vs 1 rank"), got, one);
                }
            }
            Ok(())
        })
        .unwrap();
    }
}

/// A user op's backward communicates as the composed built-ins' does: column-parallel
/// `Linear` gives `x` (replicated) a `Partial` gradient, reduced once at the leaf, whether the
/// forward is the fused op or `matmul_t`.
#[test]
fn a_user_ops_backward_runs_the_collectives_of_the_composed_ops() {
    let (x, w) = (global(&[4, 6], 7), global(&[5, 6], 8));
    dtensor::run(2, move |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let mut by_op = Vec::new();
        for fused in [true, false] {
            let a = leaf(&x, &mesh, &[Replicate])?;
            let b = leaf(&w, &mesh, &[Shard(0)])?;
            let y = if fused { apply_op(&Linear, &[&a, &b])? } else { a.matmul_t(&b, false, true)? };
            assert_eq!(y.placements(), &[Shard(1)]);
            let mode = CommDebugMode::new();
            mode.scope(|| y.sum()?.backward())?;
            assert_eq!(mode.count(CollectiveKind::AllReduce), 1, "{}", mode.summary());
            by_op.push(mode.by_op());
        }
        assert_eq!(by_op[0], by_op[1]);
        Ok(())
    })
    .unwrap();
}

/// Tensor parallelism hands SwiGLU a `Partial` output gradient (its output feeds a
/// column-parallel matmul); the fused gradient ops take it as it is, by their linear rules, so
/// the backward reduces once, at the leaves, as the composed ops do.
#[test]
fn swiglu_takes_a_partial_output_gradient_without_reducing_it_first() {
    let (gate, up, w) = (global(&[3, 4], 10), global(&[3, 4], 11), global(&[4, 6], 12));
    let out = dtensor::run(2, move |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let mut runs = Vec::new();
        for fused in [true, false] {
            let (a, b) = (leaf(&gate, &mesh, &[Replicate])?, leaf(&up, &mesh, &[Replicate])?);
            let w = distribute_tensor(&w, &mesh, &[Shard(1)], Some(0))?;
            let y = if fused { apply_op(&SwiGlu, &[&a, &b])? } else { a.silu()?.mul(&b)? };
            let z = y.matmul(&w)?; // column parallel: z is Shard(1), y's gradient a Partial sum
            let mode = CommDebugMode::new();
            mode.scope(|| z.mul(&z)?.sum()?.backward())?;
            let ops = mode.by_op();
            assert!(!ops.keys().any(|k| k.starts_with("fused_swiglu")), "{}", mode.summary());
            runs.push((ops, a.grad().unwrap().full_tensor()?, b.grad().unwrap().full_tensor()?));
        }
        assert_eq!(runs[0].0, runs[1].0, "the same collectives");
        Ok(runs)
    })
    .unwrap();
    for runs in out {
        assert_close("gate grad", &runs[0].1, &runs[1].1);
        assert_close("up grad", &runs[0].2, &runs[1].2);
    }
}

/// (output, grad of x, grad of g, grad of W), gathered.
type Run3 = [ArrayD<f64>; 4];

fn norm_linear_run(
    mesh: &DeviceMesh,
    ps: [&[Placement]; 3],
    fused: bool,
    (x, g, w): (&ArrayD<f64>, &ArrayD<f64>, &ArrayD<f64>),
) -> Result<Run3> {
    let (a, b, c) = (leaf(x, mesh, ps[0])?, leaf(g, mesh, ps[1])?, leaf(w, mesh, ps[2])?);
    let y = if fused {
        apply_op(&RmsNormLinear { eps: 1e-6 }, &[&a, &b, &c])?
    } else {
        a.rms_norm(&[x.shape()[x.ndim() - 1]], Some(&b), 1e-6)?.matmul_t(&c, false, true)?
    };
    let weight = distribute_tensor(global(y.shape(), 13), mesh, &vec![Replicate; mesh.ndim()], Some(0))?;
    y.mul(&weight)?.sum()?.backward()?;
    let grad = |t: &DTensor<f64>| t.grad().expect("a gradient").full_tensor();
    Ok([y.full_tensor()?, grad(&a)?, grad(&b)?, grad(&c)?])
}

/// A fused op of three inputs (the pre-norm projection of a Llama block) against
/// `rms_norm` then `matmul_t`, on every layout its rules accept, 1, 4 and 2×2 ranks.
#[test]
fn rms_norm_linear_equals_the_norm_then_the_projection() {
    // x: [batch 3, seq 5, in 6], g: [6], W: [out 7, in 6]
    let (x, g, w) = (global(&[3, 5, 6], 14), global(&[6], 15).mapv(|v| v + 1.0), global(&[7, 6], 16));
    let reference = dtensor::run(1, {
        let (x, g, w) = (x.clone(), g.clone(), w.clone());
        move |ctx| {
            let mesh = ctx.init_device_mesh(&[1], &["tp"])?;
            norm_linear_run(&mesh, [&[Replicate], &[Replicate], &[Replicate]], false, (&x, &g, &w))
        }
    })
    .unwrap()
    .remove(0);
    for (shape, names) in MESHES {
        let n: usize = shape.iter().product();
        let (x, g, w, reference) = (x.clone(), g.clone(), w.clone(), reference.clone());
        dtensor::run(n, move |ctx| {
            let mesh = ctx.init_device_mesh(shape, names)?;
            let r = vec![Replicate; shape.len()];
            // per mesh dim: replicated, x batch-sharded, x sequence-sharded, W column-parallel
            let styles: Vec<[Vec<Placement>; 3]> = [
                [Replicate, Replicate, Replicate],
                [Shard(0), Replicate, Replicate],
                [Shard(1), Replicate, Replicate],
                [Replicate, Replicate, Shard(0)],
            ]
            .into_iter()
            .map(|[a, b, c]| {
                let last = |p: Placement| {
                    let mut v = r.clone();
                    *v.last_mut().unwrap() = p;
                    v
                };
                [last(a), last(b), last(c)]
            })
            .collect();
            for ps in &styles {
                let ps = [ps[0].as_slice(), ps[1].as_slice(), ps[2].as_slice()];
                let fused = norm_linear_run(&mesh, ps, true, (&x, &g, &w))?;
                let composed = norm_linear_run(&mesh, ps, false, (&x, &g, &w))?;
                for (k, what) in ["output", "x grad", "g grad", "W grad"].iter().enumerate() {
                    let what = format!("{what} on {shape:?} {ps:?}");
                    assert_close(&format!("{what} vs composed"), &fused[k], &composed[k]);
                    assert_close(&format!("{what} vs 1 rank"), &fused[k], &reference[k]);
                }
            }
            Ok(())
        })
        .unwrap();
    }
}
