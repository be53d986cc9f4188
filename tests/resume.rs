//! Resume equivalence: training 6 steps straight equals training 3 steps, saving the whole
//! training state ([`Checkpointer`]), loading it on another mesh and training 3 more, for the
//! models of the `mlp_tp` (SGD with momentum; the data come from the saved generator) and
//! `transformer_tp` (AdamW) examples.
//!
//! On the same mesh the resumed run is bit-for-bit the straight one (same reductions in the
//! same order). On another mesh the all-reduces sum in another order, so the runs agree to
//! rounding: at most [`REL_TOL`] relative, everything in f64 (the MLP's teacher too: in f32,
//! as the example trains, the targets themselves would differ between meshes by f32
//! rounding). Printed with `-- --nocapture`, beside what the mesh change alone does.

#[path = "../examples/transformer_tp/model.rs"]
#[allow(dead_code)]
mod gpt;
#[path = "../examples/mlp_tp/model.rs"]
#[allow(dead_code)]
mod model;

use dtensor::checkpoint::{Checkpointer, Restore, TrainState};
use dtensor::optim::AdamW;
use dtensor::prelude::*;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dt;
use dtensor::{f16, manual_seed, Element};
use model::{MlpConfig, Precision, Trainer};
use ndarray::ArrayD;
use std::path::Path;

/// Largest relative difference between a run resumed on another mesh and the straight run.
const REL_TOL: f64 = 1e-12;

type Mesh = (usize, usize);

/// Losses of the steps run, and every parameter in full afterwards (rank 0's view).
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    losses: Vec<f64>,
    weights: Vec<(String, ArrayD<f64>)>,
}

/// One segment of a run: build on `mesh`, load `from` if given, train `steps` steps (the
/// steps before it: `done`), save into `to` if given.
struct Segment<'a> {
    mesh: Mesh,
    from: Option<&'a Path>,
    done: u64,
    steps: usize,
    to: Option<&'a Path>,
}

fn rank0<R: Send>(mesh: Mesh, f: impl Fn(&DeviceMesh) -> Result<R> + Sync) -> R {
    dtensor::run(mesh.0 * mesh.1, |ctx| {
        let m = ctx.init_device_mesh(&[mesh.0, mesh.1], &["dp", "tp"])?;
        f(&m)
    })
    .unwrap()
    .into_iter()
    .next()
    .unwrap()
}

fn full<T: Element>(named: Vec<(String, &DTensor<T>)>) -> Result<Vec<(String, ArrayD<f64>)>> {
    named.into_iter().map(|(n, p)| Ok((n, p.full_tensor()?.mapv(|v| v.as_f64())))).collect()
}

/// Hidden 22 splits unevenly over tp = 4 (6, 6, 6, 4) and batch 6 over dp = 4 (2, 2, 2, 0).
fn mlp_cfg() -> MlpConfig {
    MlpConfig { batch: 6, dim: 8, hidden: 22, layers: 2, lr: 0.3, seed: 5 }
}

/// The `mlp_tp` trainer with a student in `T` and a teacher (the data) in `U`.
fn mlp_segment<T: Element, U: Element>(s: &Segment<'_>, precision: Precision) -> Outcome {
    rank0(s.mesh, |mesh| {
        let mut t = Trainer::<T, U>::with_precision(mesh, mlp_cfg(), precision)?.momentum(0.9);
        if let Some(dir) = s.from {
            let r = t.restore(&Checkpointer::new(dir))?.expect("a committed state");
            assert_eq!(r.step, s.done);
        }
        let mut losses = Vec::new();
        for _ in 0..s.steps {
            let (x, y) = t.batch()?;
            let loss = t.train_step(&x, &y)?;
            losses.push(loss.full_tensor()?.iter().next().unwrap().as_f64());
        }
        if let Some(dir) = s.to {
            Checkpointer::new(dir).save(t.train_state(s.done + s.steps as u64))?;
        }
        let mut weights = full(t.student.named_parameters())?;
        if let Some(scale) = t.loss_scale() {
            weights.push(("loss_scale".into(), ArrayD::from_elem(vec![], scale)));
        }
        Ok(Outcome { losses, weights })
    })
}

fn gpt_cfg() -> gpt::GptConfig {
    gpt::GptConfig { vocab: 32, width: 16, heads: 4, seq: 8, batch: 4, layers: 2, lr: 0.01, seed: 7 }
}

/// The `transformer_tp` example's data (drawn from the generator, so a resumed run must
/// restore it to see the same batches), distributed.
fn batch(cfg: &gpt::GptConfig, mesh: &DeviceMesh) -> Result<(Tokens, Tokens)> {
    let (ids, targets) = gpt::batch_data(cfg)?;
    Ok((Dt::distribute(&ids, mesh)?, Dt::distribute(&targets, mesh)?))
}

type Tokens = Dt<i64, (dp, tp), (Shard<0>, Replicate), 2>;

/// The user value saved with the state: where the data stand.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Progress {
    epoch: u64,
    sequences_seen: u64,
}

fn gpt_segment(s: &Segment<'_>) -> Outcome {
    let cfg = gpt_cfg();
    rank0(s.mesh, |mesh| {
        manual_seed(cfg.seed);
        let mut model = gpt::Gpt::new(&cfg, mesh)?;
        let mut opt = AdamW::<f64>::new(cfg.lr);
        manual_seed(cfg.seed + 1);
        if let Some(dir) = s.from {
            let r = Checkpointer::new(dir).load(Restore::new(&mut model).optimizer(&mut opt))?.unwrap();
            assert_eq!(r.step, s.done);
            let extra: Option<Progress> = r.extra_as()?;
            assert_eq!(extra, Some(Progress { epoch: 0, sequences_seen: s.done * 4 }));
        }
        let mut losses = Vec::new();
        for _ in 0..s.steps {
            let (ids, targets) = batch(&cfg, mesh)?;
            model.zero_grad();
            let loss = gpt::loss(&model, &ids, &targets, cfg.heads)?;
            loss.backward()?;
            opt.step(&mut model)?;
            losses.push(loss.full_tensor()?.iter().next().copied().unwrap());
        }
        if let Some(dir) = s.to {
            let step = s.done + s.steps as u64;
            let extra = Progress { epoch: 0, sequences_seen: step * 4 };
            Checkpointer::new(dir).save(TrainState::new(&model, step).optimizer(&opt).extra(&extra)?)?;
        }
        Ok(Outcome { losses, weights: full(model.named_parameters())? })
    })
}

/// Largest relative difference (per tensor `max|a-b| / max|b|`, per loss `|a-b| / |b|`).
fn rel_diff(a: &Outcome, b: &Outcome) -> f64 {
    assert_eq!(a.losses.len(), b.losses.len());
    let mut worst = 0.0f64;
    for (x, y) in a.losses.iter().zip(&b.losses) {
        worst = worst.max((x - y).abs() / y.abs().max(f64::MIN_POSITIVE));
    }
    for ((na, x), (nb, y)) in a.weights.iter().zip(&b.weights) {
        assert_eq!(na, nb);
        let scale = y.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
        let d = x.iter().zip(y).fold(0.0f64, |m, (p, q)| m.max((p - q).abs()));
        worst = worst.max(d / scale);
    }
    worst
}

/// The last `n` steps of `o` (its weights are the end weights either way).
fn tail(o: &Outcome, n: usize) -> Outcome {
    Outcome { losses: o.losses[o.losses.len() - n..].to_vec(), weights: o.weights.clone() }
}

/// 3 steps on 2×2, save, then 3 steps on each mesh, against 6 straight steps.
fn check_resume(name: &str, segment: impl Fn(&Segment<'_>) -> Outcome) {
    let straight = segment(&Segment { mesh: (2, 2), from: None, done: 0, steps: 6, to: None });
    let dir = tempfile::tempdir().unwrap();
    segment(&Segment { mesh: (2, 2), from: None, done: 0, steps: 3, to: Some(dir.path()) });
    let same = segment(&Segment { mesh: (2, 2), from: Some(dir.path()), done: 3, steps: 3, to: None });
    assert_eq!(same, tail(&straight, 3), "{name}: resumed on the same mesh must be bit-for-bit the straight run");
    for mesh in [(4, 1), (1, 4), (1, 1), (1, 2)] {
        let resumed = segment(&Segment { mesh, from: Some(dir.path()), done: 3, steps: 3, to: None });
        let d = rel_diff(&resumed, &tail(&straight, 3));
        // What changing the mesh alone does: the straight run on `mesh` against the one on 2×2.
        let other = segment(&Segment { mesh, from: None, done: 0, steps: 6, to: None });
        let mesh_alone = rel_diff(&tail(&other, 3), &tail(&straight, 3));
        println!(
            "{name}: saved on 2x2, resumed on {}x{}: largest relative difference {d:.2e} \
             (straight runs on the two meshes: {mesh_alone:.2e})",
            mesh.0, mesh.1
        );
        assert!(d <= REL_TOL, "{name}: resumed on {mesh:?} differs by {d:e}");
    }
    // And back: 2×2 → 1×1 (2 steps, saved again) → 2×2 (1 step).
    let back = tempfile::tempdir().unwrap();
    segment(&Segment { mesh: (1, 1), from: Some(dir.path()), done: 3, steps: 2, to: Some(back.path()) });
    let end = segment(&Segment { mesh: (2, 2), from: Some(back.path()), done: 5, steps: 1, to: None });
    let d = rel_diff(&end, &tail(&straight, 1));
    println!("{name}: 2x2 -> 1x1 -> 2x2: largest relative difference {d:.2e}");
    assert!(d <= REL_TOL, "{name}: 2x2 -> 1x1 -> 2x2 differs by {d:e}");
}

#[test]
fn mlp_tp_resumes_on_any_mesh() {
    check_resume("mlp_tp (f64, SGD with momentum)", |s| mlp_segment::<f64, f64>(s, Precision::default()));
}

#[test]
fn transformer_tp_resumes_on_any_mesh() {
    check_resume("transformer_tp (f64, AdamW)", gpt_segment);
}

/// An f16 student with f32 master weights and a dynamic loss scaler: the master copies, the
/// f32 momentum and the scaler's scale and growth count are restored, so the resumed run is
/// bit-for-bit the straight one on the same mesh.
#[test]
fn f16_master_weights_and_loss_scale_resume_exactly() {
    let p = Precision { master_weights: true, reduce_in_f32: true, loss_scale: Some((1024.0, 2)) };
    let straight = mlp_segment::<f16, f32>(&Segment { mesh: (2, 2), from: None, done: 0, steps: 6, to: None }, p);
    let dir = tempfile::tempdir().unwrap();
    mlp_segment::<f16, f32>(&Segment { mesh: (2, 2), from: None, done: 0, steps: 3, to: Some(dir.path()) }, p);
    let resumed =
        mlp_segment::<f16, f32>(&Segment { mesh: (2, 2), from: Some(dir.path()), done: 3, steps: 3, to: None }, p);
    assert_eq!(resumed, tail(&straight, 3));
    // Without the scaler's state the scale would restart at 1024 and differ after growth.
    assert_ne!(straight.weights.last().unwrap().1[[]], 1024.0, "the scale should have grown in 6 steps");
}
