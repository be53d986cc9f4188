//! scaled_dot_product_attention (batch/head-sharded, sequence-sharded queries, causal, with an
//! additive mask) and rotary embeddings: forward and every input gradient against the
//! single-rank result (uneven and empty shards), finite differences in f64 on the first case.

mod ops_util;

use dtensor_runtime::{
    distribute_tensor, rotary_tables, run, scaled_dot_product_attention as sdpa, CommDebugMode, Partial, Placement,
    ReduceOp, Replicate as R, RotaryStyle, Shard as S, TensorOptions,
};
use ops_util::{case, check_op, inp, Case};

fn qkv(mesh: &[usize], q: &[usize], k: &[usize], qp: &[Placement], kp: &[Placement], e: Option<&[Placement]>) -> Case {
    let mut v = k.to_vec();
    *v.last_mut().unwrap() = 3;
    case(mesh, vec![inp(q, qp), inp(k, kp), inp(&v, kp)], e)
}

fn cases() -> Vec<Case> {
    vec![
        // batch and heads sharded (heads uneven: 3 over 2)
        qkv(&[2, 2], &[2, 3, 4, 2], &[2, 3, 4, 2], &[S(0), S(1)], &[S(0), S(1)], Some(&[S(0), S(1)])),
        // sequence-sharded queries, replicated keys/values (uneven: 5 over 3), Lq != Lk
        qkv(&[3], &[1, 2, 5, 2], &[1, 2, 4, 2], &[S(2)], &[R], Some(&[S(2)])),
        // heads sharded with an empty shard (2 heads over 4 ranks on one dim) and seq-sharded q
        qkv(&[2, 2], &[1, 2, 3, 2], &[1, 2, 3, 2], &[S(1), S(2)], &[S(1), R], Some(&[S(1), S(2)])),
        // layouts matching no strategy: redistributed
        qkv(&[2, 2], &[2, 2, 3, 2], &[2, 2, 3, 2], &[S(0), R], &[S(1), S(2)], None),
        qkv(&[2, 2], &[1, 2, 3, 2], &[1, 2, 3, 2], &[Partial(ReduceOp::Sum), S(1)], &[R, S(1)], None),
    ]
}

#[test]
fn attention() {
    check_op("sdpa", &cases(), true, &|x| sdpa(&x[0], &x[1], &x[2], None, false, None));
}

#[test]
fn causal_attention() {
    let square: Vec<Case> = cases().into_iter().filter(|c| c.inputs[0].shape[2] == c.inputs[1].shape[2]).collect();
    check_op("sdpa(is_causal)", &square, true, &|x| sdpa(&x[0], &x[1], &x[2], None, true, Some(0.7)));
}

#[test]
fn attention_with_additive_mask() {
    let mut cs = cases();
    for c in &mut cs {
        let (lq, lk) = (c.inputs[0].shape[2], c.inputs[1].shape[2]);
        let pl = vec![R; c.mesh.len()];
        c.inputs.push(inp(&[lq, lk], &pl));
    }
    check_op("sdpa(attn_mask)", &cs, true, &|x| sdpa(&x[0], &x[1], &x[2], Some(&x[3]), false, None));
}

#[test]
fn rotary() {
    let cs = vec![
        case(&[2, 2], vec![inp(&[2, 3, 5, 4], &[S(0), S(1)])], Some(&[S(0), S(1)])),
        case(&[3], vec![inp(&[1, 2, 7, 6], &[S(2)])], None),
        case(&[2, 2], vec![inp(&[1, 2, 3, 4], &[S(1), S(1)])], Some(&[S(1), S(1)])),
    ];
    check_op("apply_rotary", &cs, true, &|x| {
        let s = x[0].shape();
        let opts = TensorOptions::new().mesh(x[0].device_mesh());
        let (cos, sin) = rotary_tables::<f64>(s[2], s[3], 10000.0, &opts)?;
        x[0].apply_rotary(&cos, &sin)
    });
}

/// Both rotary forms keep every layout that leaves the feature dim whole, a Partial input
/// included (the map is linear), with no collective; a feature-sharded input is gathered.
#[test]
fn rotary_styles_keep_layouts() {
    let p = Partial(ReduceOp::Sum);
    let cs = vec![
        case(&[2, 2], vec![inp(&[2, 3, 5, 4], &[S(0), S(1)])], Some(&[S(0), S(1)])),
        // sequence sharded, uneven (7 over 3)
        case(&[3], vec![inp(&[1, 2, 7, 6], &[S(2)])], Some(&[S(2)])),
        // an empty shard (2 heads over 4 ranks on one dim)
        case(&[2, 2], vec![inp(&[1, 2, 3, 4], &[S(1), S(1)])], Some(&[S(1), S(1)])),
        case(&[2, 2], vec![inp(&[2, 5, 4], &[p, S(0)])], Some(&[p, S(0)])),
        case(&[2], vec![inp(&[3, 8], &[S(1)])], None),
    ];
    for style in [RotaryStyle::Half, RotaryStyle::Interleaved] {
        check_op(&format!("apply_rotary({style:?})"), &cs, true, &move |x| {
            let s = x[0].shape();
            let n = s.len();
            let opts = TensorOptions::new().mesh(x[0].device_mesh());
            let (cos, sin) = style.tables::<f64>(s[n - 2], s[n - 1], 500.0, &opts)?;
            x[0].apply_rotary_with(&cos, &sin, style)
        });
    }
}

/// The interleaved form is the complex product `(x₂ᵢ + i·x₂ᵢ₊₁)·e^{i·pos·θⱼ}` of Meta's Llama
/// code, computed here on the host.
#[test]
fn interleaved_rotary_is_the_complex_product() {
    let (seq, dim, base) = (5, 6, 10000.0f64);
    let x = ops_util::values(&[2, seq, dim], ops_util::Kind::Real, 3);
    let got = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["tp"])?;
        let (cos, sin) = RotaryStyle::Interleaved.tables::<f64>(seq, dim, base, &TensorOptions::new().mesh(&mesh))?;
        distribute_tensor(&x, &mesh, &[R], None)?.apply_rotary_with(&cos, &sin, RotaryStyle::Interleaved)?.full_tensor()
    })
    .unwrap()
    .remove(0);
    for h in 0..2 {
        for pos in 0..seq {
            for j in 0..dim / 2 {
                let theta = pos as f64 * base.powf(-2.0 * j as f64 / dim as f64);
                let (a, b) = (x[[h, pos, 2 * j]], x[[h, pos, 2 * j + 1]]);
                let (re, im) = (a * theta.cos() - b * theta.sin(), a * theta.sin() + b * theta.cos());
                assert!((got[[h, pos, 2 * j]] - re).abs() < 1e-12 && (got[[h, pos, 2 * j + 1]] - im).abs() < 1e-12);
            }
        }
    }
}

/// On a strategy's layout the op is local: no collective in the forward.
#[test]
fn sharded_attention_issues_no_collective() {
    let q = ops_util::values(&[2, 4, 6, 2], ops_util::Kind::Real, 1);
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let d = |pl: &[Placement]| distribute_tensor(&q, &mesh, pl, None);
        let mode = CommDebugMode::new();
        let heads =
            mode.scope(|| sdpa(&d(&[S(0), S(1)])?, &d(&[S(0), S(1)])?, &d(&[S(0), S(1)])?, None, true, None))?;
        let seq = mode.scope(|| sdpa(&d(&[S(0), S(2)])?, &d(&[S(0), R])?, &d(&[S(0), R])?, None, true, None))?;
        Ok((mode.total(), heads.full_tensor()? == seq.full_tensor()?))
    })
    .unwrap();
    assert!(out.iter().all(|&(n, same)| n == 0 && same), "{out:?}");
}

/// Tables that do not cover the tensor's positions (a KV-cache step given the whole table)
/// are a shape error, not a broadcast to every position.
#[test]
fn rotary_tables_must_match_the_positions() {
    let x = ops_util::values(&[1, 2, 1, 4], ops_util::Kind::Real, 5);
    let e = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["tp"])?;
        let (cos, sin) = rotary_tables::<f64>(8, 4, 10000.0, &TensorOptions::new().mesh(&mesh))?;
        let x = distribute_tensor(&x, &mesh, &[R], None)?;
        let whole = x.apply_rotary(&cos, &sin).unwrap_err().to_string();
        let narrowed = x.apply_rotary(&cos.narrow(0, 5, 1)?, &sin.narrow(0, 5, 1)?)?;
        Ok((whole, narrowed.shape().to_vec()))
    })
    .unwrap()
    .remove(0);
    assert!(e.0.contains("apply_rotary") && e.0.contains("positions"), "{}", e.0);
    assert_eq!(e.1, [1, 2, 1, 4]);
}
