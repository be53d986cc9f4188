//! The ops a Hugging Face checkpoint needs against their reference implementations, through
//! fixtures those computed (`tests/fixtures/torch_ops.json`, made by
//! `scripts/gen_op_fixtures.py` with PyTorch 2.15 and transformers 5.25 in float64): PyTorch's
//! `cross_entropy` (ignore_index, every reduction, label smoothing), `linear`, transformers'
//! Llama rotary embedding (rotate-half; plain, Llama 3 and linear frequency scaling, the
//! frequencies read from the same `rope_parameters` by `LlamaConfig`) and Meta's Llama
//! reference rotary (interleaved). Every
//! case runs on one rank and on sharded layouts (batch, class, head, sequence, column- and
//! row-parallel), forward and the float inputs' gradients.

use dtensor_runtime::checkpoint::hf::LlamaConfig;
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::{
    distribute_tensor, run, CrossEntropyOptions, DTensor, LossReduction, Placement, Replicate as R, Result,
    RotaryStyle, Shard as S, TensorOptions,
};
use serde_json::Value;
use std::collections::BTreeMap;

fn fixtures() -> Value {
    serde_json::from_str(include_str!("fixtures/torch_ops.json")).expect("fixture file is JSON")
}

fn array(v: &Value) -> ArrayD<f64> {
    let shape: Vec<usize> = v["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let data: Vec<f64> = v["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect();
    ArrayD::from_shape_vec(IxDyn(&shape), data).expect("shape matches data")
}

/// One layout of a case: the mesh and each input's placements (by input name).
struct Layout {
    mesh: Vec<usize>,
    placements: BTreeMap<&'static str, Vec<Placement>>,
}

fn layout(mesh: &[usize], pl: &[(&'static str, Vec<Placement>)]) -> Layout {
    Layout { mesh: mesh.to_vec(), placements: pl.iter().cloned().collect() }
}

fn layouts(op: &str, rank: usize) -> Vec<Layout> {
    let one = |names: &[&'static str]| layout(&[1], &names.iter().map(|&n| (n, vec![R])).collect::<Vec<_>>());
    match op {
        "cross_entropy" => vec![
            one(&["logits", "target"]),
            // batch over dp, classes over tp (loss parallelism)
            layout(&[2, 2], &[("logits", vec![S(0), S(rank as isize - 1)]), ("target", vec![S(0), R])]),
            // every batch dim sharded, ids sharded alike
            layout(
                &[2, 2],
                &[("logits", vec![S(0), S(rank as isize - 2)]), ("target", vec![S(0), S(rank as isize - 2)])],
            ),
            // batch sharded over 3 ranks (uneven), ids replicated
            layout(&[3], &[("logits", vec![S(0)]), ("target", vec![R])]),
        ],
        "linear" => vec![
            one(&["x", "weight", "bias"]),
            // column-parallel: weight and bias on their output rows
            layout(&[2, 2], &[("x", vec![S(0), R]), ("weight", vec![R, S(0)]), ("bias", vec![R, S(0)])]),
            // row-parallel: input features and the weight's input columns
            layout(
                &[2, 2],
                &[("x", vec![S(0), S(rank as isize - 1)]), ("weight", vec![R, S(1)]), ("bias", vec![R, R])],
            ),
        ],
        _ => vec![
            one(&["x"]),
            // heads over dp, sequence over tp
            layout(&[2, 2], &[("x", vec![S(1), S(2)])]),
            // heads over 3 ranks (uneven, maybe empty)
            layout(&[3], &[("x", vec![S(1)])]),
        ],
    }
}

/// The op of `case` on `xs` (by input name).
fn apply(case: &Value, xs: &BTreeMap<String, DTensor<f64>>) -> Result<DTensor<f64>> {
    let opts = &case["opts"];
    match case["op"].as_str().unwrap() {
        "cross_entropy" => {
            let mut o = CrossEntropyOptions::new().reduction(match opts["reduction"].as_str().unwrap() {
                "mean" => LossReduction::Mean,
                "sum" => LossReduction::Sum,
                _ => LossReduction::None,
            });
            if let Some(i) = opts["ignore_index"].as_i64() {
                o = o.ignore_index(i);
            }
            if let Some(e) = opts["label_smoothing"].as_f64() {
                o = o.label_smoothing(e);
            }
            xs["logits"].cross_entropy_with(&xs["target"], &o)
        }
        "linear" => xs["x"].linear(&xs["weight"], xs.get("bias")),
        "rotary_half" => {
            // transformers' tables from its config: the frequencies (plain or scaled) come
            // from our reader of the same `rope_parameters`.
            let x = &xs["x"];
            let (heads, hd) = (opts["heads"].as_u64().unwrap(), opts["head_dim"].as_u64().unwrap());
            let config = serde_json::json!({
                "vocab_size": 8, "hidden_size": heads * hd, "intermediate_size": 8, "num_hidden_layers": 1,
                "num_attention_heads": heads, "head_dim": hd, "rope_parameters": opts["rope_parameters"],
            });
            let cfg = LlamaConfig::from_json(config.to_string().as_bytes(), std::path::Path::new("config.json"))?;
            let (start, seq) = (opts["start"].as_u64().unwrap() as usize, x.shape()[2]);
            let (cos, sin) = RotaryStyle::Half.tables_from_frequencies::<f64>(
                start + seq,
                &cfg.rope_frequencies(),
                &TensorOptions::new().mesh(x.device_mesh()),
            )?;
            x.apply_rotary_with(&cos.narrow(0, start, seq)?, &sin.narrow(0, start, seq)?, RotaryStyle::Half)
        }
        _ => {
            let x = &xs["x"];
            let style = RotaryStyle::Interleaved;
            let (theta, start) = (opts["theta"].as_f64().unwrap(), opts["start"].as_u64().unwrap() as usize);
            let (seq, dim) = (x.shape()[2], x.shape()[3]);
            let (cos, sin) =
                style.tables::<f64>(start + seq, dim, theta, &TensorOptions::new().mesh(x.device_mesh()))?;
            x.apply_rotary_with(&cos.narrow(0, start, seq)?, &sin.narrow(0, start, seq)?, style)
        }
    }
}

/// Largest `|a - b| / (1 + |b|)`; NaN only where the reference is NaN.
fn rel_err(what: &str, a: &ArrayD<f64>, b: &ArrayD<f64>) -> f64 {
    assert_eq!(a.shape(), b.shape(), "{what}: shape");
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| {
            assert_eq!(x.is_nan(), y.is_nan(), "{what}: {x} vs {y}");
            if y.is_nan() {
                0.0
            } else {
                (x - y).abs() / (1.0 + y.abs())
            }
        })
        .fold(0.0, f64::max)
}

#[test]
fn hf_ops_match_torch_and_transformers() {
    let fx = fixtures();
    let mut worst: BTreeMap<String, f64> = BTreeMap::new();
    for (ci, case) in fx["cases"].as_array().unwrap().iter().enumerate() {
        let op = case["op"].as_str().unwrap();
        let inputs: BTreeMap<String, ArrayD<f64>> =
            case["inputs"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), array(v))).collect();
        let (w, want) = (array(&case["w"]), array(&case["out"]));
        let grads_want: BTreeMap<String, ArrayD<f64>> =
            case["grads"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), array(v))).collect();
        let rank = inputs.values().next().unwrap().ndim().max(inputs.get("logits").map_or(0, |l| l.ndim()));
        for lay in layouts(op, rank) {
            let world: usize = lay.mesh.iter().product();
            let names: Vec<String> = (0..lay.mesh.len()).map(|i| format!("m{i}")).collect();
            let got = run(world, |ctx| {
                let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
                let mesh = ctx.init_device_mesh(&lay.mesh, &names)?;
                let mut xs = BTreeMap::new();
                for (name, g) in &inputs {
                    let Some(pl) = lay.placements.get(name.as_str()) else { continue };
                    let x = distribute_tensor(g, &mesh, pl, None)?;
                    let x = if name == "target" { x } else { x.requires_grad_(true) };
                    xs.insert(name.clone(), x);
                }
                let y = apply(case, &xs)?;
                let wd = distribute_tensor(&w, &mesh, &vec![R; lay.mesh.len()], None)?;
                let out = y.full_tensor()?;
                let mut grads = BTreeMap::new();
                if !grads_want.is_empty() {
                    y.mul(&wd)?.sum()?.backward()?;
                    for (name, x) in &xs {
                        if let Some(g) = x.grad() {
                            grads.insert(name.clone(), g.full_tensor()?);
                        }
                    }
                }
                Ok((out, grads))
            })
            .unwrap_or_else(|e| panic!("case {ci} ({op} {}) on {:?}: {e}", case["opts"], lay.mesh))
            .remove(0);
            let what = format!("case {ci} ({op} {}) on mesh {:?}", case["opts"], lay.mesh);
            let mut err = rel_err(&format!("{what}: output"), &got.0, &want);
            for (name, g) in &grads_want {
                let mine = got.1.get(name).unwrap_or_else(|| panic!("{what}: no gradient of {name}"));
                err = err.max(rel_err(&format!("{what}: grad {name}"), mine, g));
            }
            // transformers computes the rotate-half tables in f32 (its `inv_freq` and the
            // angle product are float32 even in a float64 model); the rest is float64.
            let tol = if op == "rotary_half" { 1e-6 } else { 1e-12 };
            assert!(err <= tol, "{what}: relative error {err:.3e} > {tol:.0e}");
            let e = worst.entry(op.to_string()).or_insert(0.0);
            *e = e.max(err);
        }
    }
    for (op, e) in &worst {
        println!("TABLE | {op} vs reference | max relative error {e:.3e}");
    }
    assert_eq!(worst.len(), 4, "every op of the fixture file was checked");
}
