//! Table-driven op checks shared by the `ops_*` tests.
//!
//! For one op and one layout case: the global inputs are built deterministically; the
//! reference is the same op on 1 rank; the distributed run distributes the inputs with the
//! case's placements on the case's mesh and checks (1) the full output equals the reference,
//! (2) when the case says so, the output placements equal the rule's and the forward issued
//! no collective, (3) after `backward` of `sum(out * W)` every input gradient has the input's
//! placements and equals the reference gradient. The reference gradients are themselves
//! checked against central finite differences in f64.
#![allow(dead_code)]

use dtensor_runtime::autograd::no_grad;
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::{distribute_tensor, run, CommDebugMode, DTensor, Partial, Placement, ReduceOp, Result};
use dtensor_runtime::{Replicate as R, Shard as S};

/// How an input's values are generated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// Smooth values in [-2, 2].
    Real,
    /// Values in [0.5, 2.5] (log, sqrt, divisors).
    Positive,
    /// Whole numbers in [0, n) (ids; no gradient).
    Ids(usize),
}

/// One input of a case.
#[derive(Clone, Debug)]
pub struct Input {
    pub shape: Vec<usize>,
    pub placements: Vec<Placement>,
    pub kind: Kind,
}

pub fn inp(shape: &[usize], placements: &[Placement]) -> Input {
    Input { shape: shape.to_vec(), placements: placements.to_vec(), kind: Kind::Real }
}

pub fn pos(shape: &[usize], placements: &[Placement]) -> Input {
    Input { shape: shape.to_vec(), placements: placements.to_vec(), kind: Kind::Positive }
}

pub fn ids(shape: &[usize], placements: &[Placement], n: usize) -> Input {
    Input { shape: shape.to_vec(), placements: placements.to_vec(), kind: Kind::Ids(n) }
}

/// One layout case of an op.
#[derive(Clone, Debug)]
pub struct Case {
    pub mesh: Vec<usize>,
    pub inputs: Vec<Input>,
    /// The rule's output placements when the inputs already match it (then the forward must
    /// not communicate).
    pub expect: Option<Vec<Placement>>,
}

pub fn case(mesh: &[usize], inputs: Vec<Input>, expect: Option<&[Placement]>) -> Case {
    Case { mesh: mesh.to_vec(), inputs, expect: expect.map(|e| e.to_vec()) }
}

/// Layout cases of a one-input element-wise op: uneven shards, an empty shard (5 columns
/// over 2×2 on one dim), a Partial input (kept for a `linear` op, reduced first otherwise).
pub fn unary_cases(positive: bool, linear: bool) -> Vec<Case> {
    let x = |shape: &[usize], pl: &[Placement]| if positive { pos(shape, pl) } else { inp(shape, pl) };
    let mut v = vec![
        case(&[2, 2], vec![x(&[5, 3], &[S(0), S(1)])], Some(&[S(0), S(1)])),
        case(&[2, 2], vec![x(&[3, 4, 2], &[R, S(2)])], Some(&[R, S(2)])),
        case(&[3], vec![x(&[7], &[S(0)])], Some(&[S(0)])),
        case(&[2, 2], vec![x(&[2, 5], &[S(1), S(1)])], Some(&[S(1), S(1)])),
    ];
    if linear {
        v.push(case(&[2, 2], vec![x(&[5, 3], &[Partial(ReduceOp::Sum), S(0)])], Some(&[Partial(ReduceOp::Sum), S(0)])));
    } else if !positive {
        // Partial input of a nonlinear op: reduced first
        v.push(case(&[2, 2], vec![x(&[5, 3], &[Partial(ReduceOp::Sum), S(0)])], None));
    }
    v
}

fn hash(i: usize, seed: usize) -> f64 {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (seed as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    (x % 1_000_003) as f64 / 1_000_003.0
}

pub fn values(shape: &[usize], kind: Kind, seed: usize) -> ArrayD<f64> {
    let mut i = 0;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        i += 1;
        let u = hash(i, seed);
        match kind {
            Kind::Real => 4.0 * u - 2.0,
            Kind::Positive => 0.5 + 2.0 * u,
            Kind::Ids(n) => ((u * n as f64) as usize).min(n.saturating_sub(1)) as f64,
        }
    })
}

/// Leaf placements of an input (Partial is reached by redistributing a Replicate leaf).
fn leaf_placements(p: &[Placement]) -> Vec<Placement> {
    p.iter().map(|p| if p.is_partial() { Placement::Replicate } else { *p }).collect()
}

type Op = dyn Fn(&[DTensor<f64>]) -> Result<DTensor<f64>> + Sync;

/// Output and input gradients of `sum(op(inputs) * w)` on `mesh` with the case layouts.
/// Returns (full output, output placements, forward collectives, [(full grad, grad placements)]).
#[allow(clippy::type_complexity)]
fn evaluate(
    mesh_shape: &[usize],
    inputs: &[Input],
    globals: &[ArrayD<f64>],
    single: bool,
    op: &Op,
) -> Result<(ArrayD<f64>, Vec<Placement>, usize, Vec<Option<(ArrayD<f64>, Vec<Placement>)>>)> {
    let world: usize = if single { 1 } else { mesh_shape.iter().product() };
    let shape: Vec<usize> = if single { vec![1; mesh_shape.len()] } else { mesh_shape.to_vec() };
    let out = run(world, |ctx| {
        let names: Vec<String> = (0..shape.len()).map(|i| format!("m{i}")).collect();
        let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        let mesh = ctx.init_device_mesh(&shape, &names)?;
        let mut leaves = Vec::new();
        let mut xs = Vec::new();
        for (inp, g) in inputs.iter().zip(globals) {
            let pl = if single { vec![Placement::Replicate; shape.len()] } else { inp.placements.clone() };
            let leaf = distribute_tensor(g, &mesh, &leaf_placements(&pl), None)?;
            let leaf = if inp.kind == Kind::Ids(0) || matches!(inp.kind, Kind::Ids(_)) {
                leaf
            } else {
                leaf.requires_grad_(true)
            };
            let x = if pl.iter().any(|p| p.is_partial()) { leaf.redistribute(&pl)? } else { leaf.clone() };
            leaves.push(leaf);
            xs.push(x);
        }
        let mode = CommDebugMode::new();
        let y = mode.scope(|| op(&xs))?;
        let collectives = mode.total();
        let yfull = y.full_tensor()?;
        let w = values(y.shape(), Kind::Real, 99);
        let wd = distribute_tensor(&w, &mesh, &vec![Placement::Replicate; shape.len()], None)?;
        let loss = y.mul(&wd)?.sum()?;
        let mut grads = Vec::new();
        if loss.requires_grad() {
            loss.backward()?;
        }
        for l in &leaves {
            grads.push(match l.grad() {
                Some(g) => Some((g.full_tensor()?, g.placements().to_vec())),
                None => None,
            });
        }
        Ok((yfull, y.placements().to_vec(), collectives, grads))
    })?;
    Ok(out.into_iter().next().expect("rank 0"))
}

/// Checks `a ≈ b` elementwise; returns the largest absolute difference (NaN pairs agree).
fn close(a: &ArrayD<f64>, b: &ArrayD<f64>, tol: f64) -> std::result::Result<f64, String> {
    if a.shape() != b.shape() {
        return Err(format!("shape {:?} != {:?}", a.shape(), b.shape()));
    }
    let mut worst = 0.0f64;
    for (x, y) in a.iter().zip(b.iter()) {
        if x.is_nan() && y.is_nan() || x == y {
            continue;
        }
        let d = (x - y).abs();
        if d.is_nan() || d > tol * (1.0 + y.abs()) {
            return Err(format!("value {x} != {y}"));
        }
        worst = worst.max(d);
    }
    Ok(worst)
}

/// Central finite differences of `sum(op(x) * W)` on one rank vs the autograd gradients.
fn finite_difference(
    inputs: &[Input],
    globals: &[ArrayD<f64>],
    ref_grads: &[Option<(ArrayD<f64>, Vec<Placement>)>],
    op: &Op,
) -> std::result::Result<(), String> {
    let ndim_mesh = inputs[0].placements.len();
    let loss_of = |gs: &[ArrayD<f64>]| -> Result<f64> {
        let v = run(1, |ctx| {
            let mesh = ctx.init_device_mesh(&vec![1; ndim_mesh], &[])?;
            no_grad(|| {
                let xs: Vec<DTensor<f64>> = gs
                    .iter()
                    .map(|g| distribute_tensor(g, &mesh, &vec![Placement::Replicate; ndim_mesh], None))
                    .collect::<Result<_>>()?;
                let y = op(&xs)?;
                let w = values(y.shape(), Kind::Real, 99);
                Ok(y.full_tensor()?.iter().zip(w.iter()).map(|(a, b)| a * b).sum::<f64>())
            })
        })?;
        Ok(v[0])
    };
    let h = 1e-6;
    for (j, inp) in inputs.iter().enumerate() {
        if matches!(inp.kind, Kind::Ids(_)) {
            continue;
        }
        let Some((g, _)) = &ref_grads[j] else { return Err(format!("input {j} got no gradient")) };
        for k in 0..globals[j].len() {
            let mut plus = globals.to_vec();
            let mut minus = globals.to_vec();
            plus[j].as_slice_mut().expect("standard")[k] += h;
            minus[j].as_slice_mut().expect("standard")[k] -= h;
            let fd =
                (loss_of(&plus).map_err(|e| e.to_string())? - loss_of(&minus).map_err(|e| e.to_string())?) / (2.0 * h);
            let got = g.as_slice().expect("standard")[k];
            if (fd - got).abs() > 1e-5 * (1.0 + fd.abs()) {
                return Err(format!("finite difference: input {j} element {k}: autograd {got} vs fd {fd}"));
            }
        }
    }
    Ok(())
}

/// Runs every case of one op; returns one line per case for the report table and panics
/// with every failure at the end. Prints a summary line `TABLE | op | cases | max abs error`
/// (the largest difference of any output or gradient element from the 1-rank reference).
pub fn check_op(name: &str, cases: &[Case], fd: bool, op: &Op) -> Vec<String> {
    let mut worst = 0.0f64;
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for (ci, c) in cases.iter().enumerate() {
        let globals: Vec<ArrayD<f64>> =
            c.inputs.iter().enumerate().map(|(j, i)| values(&i.shape, i.kind, 7 * ci + j)).collect();
        let desc = c
            .inputs
            .iter()
            .map(|i| format!("{:?}{}", i.shape, dtensor_runtime::placement::fmt_placements(&i.placements)))
            .collect::<Vec<_>>()
            .join(" , ");
        let result = (|| -> std::result::Result<String, String> {
            let (ry, _, _, rg) =
                evaluate(&c.mesh, &c.inputs, &globals, true, op).map_err(|e| format!("reference: {e}"))?;
            if fd && ci == 0 {
                finite_difference(&c.inputs, &globals, &rg, op)?;
            }
            let (y, pl, comms, g) =
                evaluate(&c.mesh, &c.inputs, &globals, false, op).map_err(|e| format!("distributed: {e}"))?;
            let mut err = close(&y, &ry, 1e-9).map_err(|e| format!("forward: {e}"))?;
            if let Some(e) = &c.expect {
                if &pl != e {
                    return Err(format!("output placements {pl:?}, rule says {e:?}"));
                }
                if comms != 0 {
                    return Err(format!("forward on a legal layout issued {comms} collectives"));
                }
            }
            for (j, (inp, (gd, gr))) in c.inputs.iter().zip(g.iter().zip(&rg)).enumerate() {
                match (gd, gr) {
                    (None, None) => {}
                    (Some((gd, gp)), Some((gr, _))) => {
                        if gp != &leaf_placements(&inp.placements) {
                            return Err(format!("grad {j} placements {gp:?} != input's {:?}", inp.placements));
                        }
                        err = err.max(close(gd, gr, 1e-9).map_err(|e| format!("grad {j}: {e}"))?);
                    }
                    _ => return Err(format!("grad {j} present on one side only")),
                }
            }
            worst = worst.max(err);
            Ok(format!(
                "{} -> {}{}",
                desc,
                dtensor_runtime::placement::fmt_placements(&pl),
                if comms == 0 { " (no comm)" } else { "" }
            ))
        })();
        match result {
            Ok(line) => lines.push(format!("{name}: mesh {:?}: {line}: ok", c.mesh)),
            Err(e) => failures.push(format!("{name}: mesh {:?}: {desc}: {e}", c.mesh)),
        }
    }
    for l in &lines {
        println!("{l}");
    }
    println!("TABLE | {name} | {} | {worst:.3e}", cases.len());
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    lines
}
