//! A GPT-style block (LayerNorm, causal multi-head attention, GELU MLP, dropout) and a
//! Llama-style block (RmsNorm, rotary embeddings, grouped-query attention through
//! `repeat_interleave`, SwiGLU, causal attention) under Megatron tensor parallelism on a
//! `dp × tp` = 2×2 mesh: a few SGD steps equal the same steps on one rank, and the collectives
//! of every step are Megatron's: per block 2 all-reduces over `tp` in the forward (after the
//! row-parallel attention output and MLP down projections) and 2 in the backward (the
//! gradients entering the column-parallel projections), nothing else on `tp`; over `dp` one
//! all-reduce per parameter gradient (Megatron's DDP packs them into buckets; the bytes are
//! the same).
//!
//! The layout is PyTorch's ColwiseParallel / RowwiseParallel: column-parallel weights
//! `Shard(0)` on `tp` with a replicated input redistributed to itself (Megatron's `f`:
//! identity forward, all-reduce of the gradient backward), row-parallel weights `Shard(1)`
//! with the Partial output redistributed to Replicate (Megatron's `g`).

use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::{
    distribute_tensor, manual_seed, rotary_tables, run, scaled_dot_product_attention as sdpa, CollectiveKind,
    CommDebugMode, DTensor, DeviceMesh, Placement, Replicate as R, Result, Shard as S, TensorOptions,
};

const B: usize = 4; // batch (dp)
const L: usize = 5; // sequence
const D: usize = 8; // model dim
const H: usize = 4; // query heads (tp)
const HKV: usize = 2; // key/value heads (Llama)
const HD: usize = D / H;
const F: usize = 12; // MLP hidden (tp)

fn values(shape: &[usize], seed: u64, scale: f64) -> ArrayD<f64> {
    let mut i = 0u64;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        i += 1;
        let h = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xC2B2_AE3D_27D4_EB4F)) >> 33;
        scale * ((h % 2001) as f64 / 1000.0 - 1.0)
    })
}

/// A parameter: (name, global shape, placements on (dp, tp), init scale).
type Spec = (&'static str, Vec<usize>, [Placement; 2], f64);

fn col(name: &'static str, out: usize, inp: usize) -> Spec {
    (name, vec![out, inp], [R, S(0)], 0.4)
}

fn row(name: &'static str, out: usize, inp: usize) -> Spec {
    (name, vec![out, inp], [R, S(1)], 0.4)
}

fn norm(name: &'static str, scale: f64) -> Spec {
    (name, vec![D], [R, R], scale)
}

fn gpt_specs() -> Vec<Spec> {
    vec![
        norm("ln1.weight", 1.0),
        norm("ln1.bias", 0.1),
        col("wq", D, D),
        col("wk", D, D),
        col("wv", D, D),
        row("wo", D, D),
        norm("ln2.weight", 1.0),
        norm("ln2.bias", 0.1),
        col("w1", F, D),
        row("w2", D, F),
    ]
}

fn llama_specs() -> Vec<Spec> {
    vec![
        norm("attn_norm.weight", 1.0),
        col("wq", H * HD, D),
        col("wk", HKV * HD, D),
        col("wv", HKV * HD, D),
        row("wo", D, H * HD),
        norm("ffn_norm.weight", 1.0),
        col("w1", F, D),
        col("w3", F, D),
        row("w2", D, F),
    ]
}

/// Megatron's `f`: identity forward, the gradient all-reduced to Replicate backward.
fn f(x: &DTensor<f64>) -> Result<DTensor<f64>> {
    x.redistribute(&[S(0), R])
}

/// Megatron's `g`: the row-parallel Partial output all-reduced.
fn g(x: &DTensor<f64>) -> Result<DTensor<f64>> {
    x.redistribute(&[S(0), R])
}

/// `x [B, L, D] @ wᵀ`.
fn linear(x: &DTensor<f64>, w: &DTensor<f64>) -> Result<DTensor<f64>> {
    x.matmul(&w.transpose(0, 1)?)
}

/// `[B, L, heads·HD]` → `[B, heads, L, HD]`.
fn heads(x: &DTensor<f64>, n: usize) -> Result<DTensor<f64>> {
    x.reshape_to(&[B, L, n, HD])?.transpose(1, 2)
}

/// `[B, H, L, HD]` → `[B, L, H·HD]`.
fn merge(x: &DTensor<f64>) -> Result<DTensor<f64>> {
    x.transpose(1, 2)?.reshape_to(&[B, L, H * HD])
}

fn gpt_block(p: &[DTensor<f64>], x: &DTensor<f64>) -> Result<DTensor<f64>> {
    let a = f(&x.layer_norm(&[D], Some(&p[0]), Some(&p[1]), 1e-5)?)?;
    let (q, k, v) = (heads(&linear(&a, &p[2])?, H)?, heads(&linear(&a, &p[3])?, H)?, heads(&linear(&a, &p[4])?, H)?);
    let o = g(&linear(&merge(&sdpa(&q, &k, &v, None, true, None)?)?, &p[5])?)?;
    let h = x.add(&o.dropout(0.1, true)?)?;
    let b = f(&h.layer_norm(&[D], Some(&p[6]), Some(&p[7]), 1e-5)?)?;
    let m = g(&linear(&linear(&b, &p[8])?.gelu()?, &p[9])?)?;
    h.add(&m.dropout(0.1, true)?)
}

fn llama_block(p: &[DTensor<f64>], x: &DTensor<f64>) -> Result<DTensor<f64>> {
    let mesh = x.device_mesh();
    let (cos, sin) = rotary_tables::<f64>(L, HD, 10000.0, &TensorOptions::new().mesh(mesh))?;
    let a = f(&x.rms_norm(&[D], Some(&p[0]), 1e-6)?)?;
    let q = heads(&linear(&a, &p[1])?, H)?.apply_rotary(&cos, &sin)?;
    let k = heads(&linear(&a, &p[2])?, HKV)?.apply_rotary(&cos, &sin)?;
    let v = heads(&linear(&a, &p[3])?, HKV)?;
    // Grouped-query attention: every key/value head serves H / HKV query heads.
    let (k, v) = (k.repeat_interleave(H / HKV, 1)?, v.repeat_interleave(H / HKV, 1)?);
    let o = g(&linear(&merge(&sdpa(&q, &k, &v, None, true, None)?)?, &p[4])?)?;
    let h = x.add(&o)?;
    let b = f(&h.rms_norm(&[D], Some(&p[5]), 1e-6)?)?;
    let m = g(&linear(&linear(&b, &p[6])?.swiglu(&linear(&b, &p[7])?)?, &p[8])?)?;
    h.add(&m)
}

type Block = fn(&[DTensor<f64>], &DTensor<f64>) -> Result<DTensor<f64>>;

/// Per step: (loss, [(tp fwd all-reduces, tp fwd total), (tp bwd all-reduces, tp bwd total),
/// (dp fwd total), (dp bwd all-reduces, dp bwd total)]), and the final parameters.
type Trace = (Vec<(f64, [usize; 6])>, Vec<ArrayD<f64>>);

fn train(mesh_shape: [usize; 2], specs: &[Spec], block: Block, steps: usize) -> Trace {
    let n = mesh_shape.iter().product();
    let out = run(n, |ctx| {
        let mesh: DeviceMesh = ctx.init_device_mesh(&mesh_shape, &["dp", "tp"])?;
        let mut params: Vec<DTensor<f64>> = specs
            .iter()
            .enumerate()
            .map(|(i, (_, shape, pl, scale))| {
                let init = if shape.len() == 1 && *scale == 1.0 {
                    values(shape, 100 + i as u64, 0.2).mapv(|v| 1.0 + v)
                } else {
                    values(shape, 100 + i as u64, *scale)
                };
                Ok(distribute_tensor(init, &mesh, pl, None)?.requires_grad_(true))
            })
            .collect::<Result<_>>()?;
        let x = distribute_tensor(values(&[B, L, D], 7, 1.0), &mesh, &[S(0), R], None)?.requires_grad_(true);
        let target = distribute_tensor(values(&[B, L, D], 8, 1.0), &mesh, &[S(0), R], None)?;
        manual_seed(2024);
        let mut trace = Vec::new();
        for _ in 0..steps {
            let fwd = CommDebugMode::new();
            let loss = fwd.scope(|| block(&params, &x)?.mul(&target)?.sum())?;
            let bwd = CommDebugMode::new();
            bwd.scope(|| loss.backward())?;
            let ar = CollectiveKind::AllReduce;
            let total_on =
                |m: &CommDebugMode, dim: &str| m.records().iter().filter(|r| r.mesh_dim_label() == dim).count();
            let counts = [
                fwd.count_on(ar, "tp"),
                total_on(&fwd, "tp"),
                bwd.count_on(ar, "tp"),
                total_on(&bwd, "tp"),
                total_on(&fwd, "dp"),
                bwd.count_on(ar, "dp") * 1000 + total_on(&bwd, "dp"),
            ];
            trace.push((loss.full_tensor()?.iter().sum::<f64>(), counts));
            params = params
                .iter()
                .map(|w| {
                    let gw = w.grad().expect("every parameter gets a gradient");
                    Ok(dtensor_runtime::no_grad(|| w.sub(&gw.mul_scalar(0.05)?))?.requires_grad_(true))
                })
                .collect::<Result<_>>()?;
            x.zero_grad();
        }
        let finals = params.iter().map(|w| w.full_tensor()).collect::<Result<_>>()?;
        Ok((trace, finals))
    })
    .unwrap();
    out.into_iter().next().unwrap()
}

fn check(name: &str, specs: &[Spec], block: Block) {
    let steps = 3;
    let (one, p1) = train([1, 1], specs, block, steps);
    let (many, pn) = train([2, 2], specs, block, steps);
    let nparams = specs.len();
    for (s, ((l1, _), (ln, counts))) in one.iter().zip(&many).enumerate() {
        assert!((l1 - ln).abs() < 1e-9 * (1.0 + l1.abs()), "{name} step {s}: loss {ln} vs 1 rank {l1}");
        // Megatron: 2 forward + 2 backward all-reduces on tp; DDP: every gradient all-reduced on dp.
        let want = [2, 2, 2, 2, 0, nparams * 1000 + nparams];
        assert_eq!(
            *counts, want,
            "{name} step {s}: [tp fwd AR, tp fwd all, tp bwd AR, tp bwd all, dp fwd all, dp bwd AR*1000+all]"
        );
        println!("COUNTS | {name} | step {s} | tp fwd all-reduce {} | tp bwd all-reduce {} | dp bwd all-reduce {} | loss {ln:.6}", counts[0], counts[2], counts[5] / 1000);
    }
    for ((spec, a), b) in specs.iter().zip(&p1).zip(&pn) {
        let err = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(err < 1e-9, "{name} {}: max difference {err} after {steps} steps", spec.0);
    }
    // the steps trained: the loss (a linear functional of the output) went down
    assert!(one[steps - 1].0 < one[0].0, "{name}: loss {} -> {}", one[0].0, one[steps - 1].0);
}

#[test]
fn gpt_block_trains_like_one_rank_with_megatron_collectives() {
    check("gpt", &gpt_specs(), gpt_block);
}

#[test]
fn llama_block_trains_like_one_rank_with_megatron_collectives() {
    check("llama", &llama_specs(), llama_block);
}
