//! The user's fused ops in the typed layer: a Megatron MLP block written with the typed fused
//! ops (and once with a typed `local_map`) on a `dp × tp` mesh of 1×1 and 2×2, forward and
//! backward, against the same block of built-in dynamic ops, and the single-rank result.

use dtensor::ndarray::{ArrayD, Dimension, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::{Dt, Partial, Replicate, Shard, Sum};
use dtensor::{distribute_tensor, CommDebugMode, DTensor, DeviceMesh, Placement, Result};
use dtensor_user_ops::{Linear, RmsNormLinear, SwiGlu};

type X = Dt<f64, (dp, tp), (Shard<0>, Replicate), 3>;
type ColW = Dt<f64, (dp, tp), (Replicate, Shard<0>), 2>;
type RowW = Dt<f64, (dp, tp), (Replicate, Shard<1>), 2>;
type Hidden = Dt<f64, (dp, tp), (Shard<0>, Shard<2>), 3>;
type Out = Dt<f64, (dp, tp), (Shard<0>, Partial<Sum>), 3>;

fn global(shape: &[usize], seed: usize) -> ArrayD<f64> {
    ArrayD::from_shape_fn(IxDyn(shape), |ix| {
        let k = ix.slice().iter().fold(seed, |a, &i| a * 29 + i * 11 + 5);
        ((k % 83) as f64) / 83.0 - 0.5
    })
}

struct Weights {
    x: ArrayD<f64>,
    gate: ArrayD<f64>,
    up: ArrayD<f64>,
    down: ArrayD<f64>,
}

/// batch 3 (over dp 2: 2 + 1), seq 2, dim 4, hidden 5 (over tp 2: 3 + 2)
fn weights() -> Weights {
    Weights { x: global(&[3, 2, 4], 1), gate: global(&[5, 4], 2), up: global(&[5, 4], 3), down: global(&[4, 5], 4) }
}

/// (output, d gate, d up, d down), gathered.
type Grads = [ArrayD<f64>; 4];

/// The block `down(swiglu(gate(x), up(x)))` with typed fused ops; `local` runs the SwiGLU as a
/// typed `local_map` of built-in ops on the local shards instead.
fn typed_block(mesh: &DeviceMesh, w: &Weights, local: bool) -> Result<Grads> {
    let x: X = Dt::distribute(&w.x, mesh)?;
    let gate: ColW = Dt::distribute(&w.gate, mesh)?.requires_grad_(true);
    let up: ColW = Dt::distribute(&w.up, mesh)?.requires_grad_(true);
    let down: RowW = Dt::distribute(&w.down, mesh)?.requires_grad_(true);
    let mode = CommDebugMode::new();
    let out: Out = mode.scope(|| -> Result<Out> {
        let g: Hidden = x.apply_op2(&Linear, &gate)?;
        let u: Hidden = x.apply_op2(&Linear, &up)?;
        let h: Hidden = if local {
            g.local_map2::<(Shard<0>, Shard<2>), (Shard<0>, Shard<2>), _, _, _, _>(
                &u,
                "local_swiglu",
                Some(g.shape()),
                |a, b| a.silu()?.mul(b),
            )?
        } else {
            g.apply_op2(&SwiGlu, &u)?
        };
        h.apply_op2(&Linear, &down)
    })?;
    assert_eq!(mode.total(), 0, "the typed forward runs no collective: {}", mode.summary());
    finish(out.as_dtensor(), [gate.as_dtensor(), up.as_dtensor(), down.as_dtensor()])
}

/// The same block of built-in dynamic ops.
fn dynamic_block(mesh: &DeviceMesh, w: &Weights) -> Result<Grads> {
    let r = Placement::Replicate;
    let x = distribute_tensor(&w.x, mesh, &[Placement::Shard(0), r], Some(0))?;
    let leaf = |a: &ArrayD<f64>, p| {
        Ok::<_, dtensor::Error>(distribute_tensor(a, mesh, &[r, p], Some(0))?.requires_grad_(true))
    };
    let (gate, up, down) =
        (leaf(&w.gate, Placement::Shard(0))?, leaf(&w.up, Placement::Shard(0))?, leaf(&w.down, Placement::Shard(1))?);
    let h = x.matmul_t(&gate, false, true)?.silu()?.mul(&x.matmul_t(&up, false, true)?)?;
    let out = h.matmul_t(&down, false, true)?;
    finish(&out, [&gate, &up, &down])
}

fn finish(out: &DTensor<f64>, leaves: [&DTensor<f64>; 3]) -> Result<Grads> {
    let mesh = out.device_mesh();
    let weight = distribute_tensor(global(out.shape(), 9), mesh, &vec![Placement::Replicate; mesh.ndim()], Some(0))?;
    out.mul(&weight)?.sum()?.backward()?;
    let grad = |l: &DTensor<f64>| l.grad().expect("a gradient").full_tensor();
    Ok([out.full_tensor()?, grad(leaves[0])?, grad(leaves[1])?, grad(leaves[2])?])
}

fn assert_close(what: &str, got: &ArrayD<f64>, want: &ArrayD<f64>) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-12 * w.abs().max(1.0), "{what}: {g} vs {w}");
    }
}

#[test]
fn a_typed_mlp_of_fused_user_ops_equals_the_built_in_block() {
    let reference = dtensor::run(1, |ctx| dynamic_block(&ctx.init_device_mesh(&[1, 1], &["dp", "tp"])?, &weights()))
        .unwrap()
        .remove(0);
    for shape in [[1, 1], [2, 2]] {
        let n = shape.iter().product();
        let reference = reference.clone();
        dtensor::run(n, move |ctx| {
            let mesh = ctx.init_device_mesh(&shape, &["dp", "tp"])?;
            let w = weights();
            let dynamic = dynamic_block(&mesh, &w)?;
            for local in [false, true] {
                let typed = typed_block(&mesh, &w, local)?;
                for (k, what) in ["output", "d gate", "d up", "d down"].iter().enumerate() {
                    let what = format!("{what} on {shape:?} (local_map: {local})");
                    assert_close(&format!("{what} vs dynamic"), &typed[k], &dynamic[k]);
                    assert_close(&format!("{what} vs 1 rank"), &typed[k], &reference[k]);
                }
            }
            Ok(())
        })
        .unwrap();
    }
}

#[test]
fn a_typed_user_op_reduces_its_partial_output_only_where_the_code_says() {
    dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let w = weights();
        let x: X = Dt::distribute(&w.x, &mesh)?;
        let gate: ColW = Dt::distribute(&w.gate, &mesh)?;
        let down: RowW = Dt::distribute(&w.down, &mesh)?;
        let h: Hidden = x.apply_op2(&Linear, &gate)?;
        let partial: Out = h.apply_op2(&Linear, &down)?;
        let mode = CommDebugMode::new();
        let full: Dt<f64, (dp, tp), (Shard<0>, Replicate), 3> = mode.scope(|| partial.redistribute())?;
        assert_eq!(mode.count_on(dtensor::CollectiveKind::AllReduce, "tp"), 1, "{}", mode.summary());
        assert_eq!(full.shape(), &[3, 2, 4]);
        Ok(())
    })
    .unwrap();
}

/// The three-input fused op in the typed layer: x batch-sharded over dp, W column-parallel over
/// tp, against `rms_norm` then `matmul_t` of the dynamic layer, forward and backward.
#[test]
fn a_typed_three_input_user_op_equals_the_composed_ops() {
    for shape in [[1, 1], [2, 2]] {
        dtensor::run(shape.iter().product(), move |ctx| {
            let mesh = ctx.init_device_mesh(&shape, &["dp", "tp"])?;
            let w = weights();
            let gain = global(&[4], 6).mapv(|v| v + 1.0);
            let x: X = Dt::distribute(&w.x, &mesh)?.requires_grad_(true);
            let g: Dt<f64, (dp, tp), (Replicate, Replicate), 1> = Dt::distribute(&gain, &mesh)?.requires_grad_(true);
            let proj: ColW = Dt::distribute(&w.gate, &mesh)?.requires_grad_(true);
            let y: Hidden = x.apply_op3(&RmsNormLinear { eps: 1e-6 }, &g, &proj)?;
            let typed = finish(y.as_dtensor(), [x.as_dtensor(), g.as_dtensor(), proj.as_dtensor()])?;
            let (xd, gd, pd) = (x.as_dtensor().detach(), g.as_dtensor().detach(), proj.as_dtensor().detach());
            let (xd, gd, pd) = (xd.requires_grad_(true), gd.requires_grad_(true), pd.requires_grad_(true));
            let out = xd.rms_norm(&[4], Some(&gd), 1e-6)?.matmul_t(&pd, false, true)?;
            let composed = finish(&out, [&xd, &gd, &pd])?;
            for (k, what) in ["output", "d x", "d g", "d W"].iter().enumerate() {
                assert_close(&format!("{what} on {shape:?}"), &typed[k], &composed[k]);
            }
            Ok(())
        })
        .unwrap();
    }
}
