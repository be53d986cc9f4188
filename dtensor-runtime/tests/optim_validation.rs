//! Optimizer hyperparameters and the GradScaler, tried with every bad value a careless user
//! can pass (issue 33, findings 4 and 8): each is a typed error naming the hyperparameter,
//! raised before any weight is written; a skipped scaler step writes nothing; no sequence of
//! skipped steps brings the scale to zero or to a non-finite value.

use dtensor_runtime::module::Module;
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::optim::{AdamW, GradScaler, Sgd};
use dtensor_runtime::{f16, from_local, run, DTensor, Element, Error, FromLocal, Replicate, Result};

/// One replicated parameter of 3 elements.
struct One<T: Element> {
    w: DTensor<T>,
}

impl<T: Element> Module<T> for One<T> {
    fn named_parameters(&self) -> Vec<(String, &DTensor<T>)> {
        vec![("w".into(), &self.w)]
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        vec![("w".into(), &mut self.w)]
    }
}

fn local<T: Element>(v: &[f64]) -> DTensor<T> {
    DTensor::local_tensor(ArrayD::from_shape_vec(IxDyn(&[v.len()]), v.iter().map(|&x| T::of_f64(x)).collect()).unwrap())
}

/// A parameter `[1, 2, 3]` with the gradient `x` (the gradient of `sum(w * x)`).
fn with_grad<T: Element>(x: &[f64]) -> One<T> {
    let m = One { w: local::<T>(&[1.0, 2.0, 3.0]).requires_grad_(true) };
    m.w.mul(&local::<T>(x)).unwrap().sum().unwrap().backward().unwrap();
    m
}

fn bits<T: Element>(m: &One<T>) -> Vec<f64> {
    m.w.to_host().unwrap().iter().map(|v| v.as_f64()).collect()
}

/// `e` is an `InvalidArgument` whose text names `what`.
fn names(e: Error, what: &str) {
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains(what), "`{e}` does not name `{what}`");
}

const NON_FINITE: [f64; 3] = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY];

/// Finding 8: every hyperparameter of both optimizers x every bad value. Returns the number
/// of cases tried.
#[test]
fn bad_hyperparameters_are_errors_before_any_weight_is_written() {
    let mut cases = 0;
    let negatives_and_non_finite: Vec<f64> = NON_FINITE.iter().copied().chain([-1.0, -1e-12]).collect();
    let not_a_beta: Vec<f64> = NON_FINITE.iter().copied().chain([-0.1, 1.0, 1.5]).collect();
    type Set = fn(&mut Sgd<f32>, f64);
    let sgd: [(&str, Set); 3] =
        [("lr", |o, v| o.lr = v), ("momentum", |o, v| o.momentum = v), ("weight_decay", |o, v| o.weight_decay = v)];
    for (name, set) in sgd {
        for &v in &negatives_and_non_finite {
            for master in [false, true] {
                let mut m = with_grad::<f32>(&[0.5, 0.5, 0.5]);
                let before = bits(&m);
                let mut opt = Sgd::<f32>::new(0.1).master_weights(master);
                set(&mut opt, v);
                names(opt.step(&mut m).unwrap_err(), name);
                assert_eq!(bits(&m), before, "Sgd {name}={v} wrote a weight");
                cases += 1;
            }
        }
    }
    type SetA = fn(&mut AdamW<f32>, f64);
    let adamw: [(&str, SetA, &[f64]); 5] = [
        ("lr", |o, v| o.lr = v, &negatives_and_non_finite),
        ("eps", |o, v| o.eps = v, &negatives_and_non_finite),
        ("weight_decay", |o, v| o.weight_decay = v, &negatives_and_non_finite),
        ("betas.0", |o, v| o.betas.0 = v, &not_a_beta),
        ("betas.1", |o, v| o.betas.1 = v, &not_a_beta),
    ];
    for (name, set, values) in adamw {
        for &v in values {
            for master in [false, true] {
                let mut m = with_grad::<f32>(&[0.5, 0.5, 0.5]);
                let before = bits(&m);
                let mut opt = AdamW::<f32>::new(0.1).master_weights(master);
                set(&mut opt, v);
                names(opt.step(&mut m).unwrap_err(), name);
                assert_eq!(bits(&m), before, "AdamW {name}={v} wrote a weight");
                cases += 1;
            }
        }
    }
    // The issue's own cases, through the builders.
    names(AdamW::<f32>::new(f64::NAN).step(&mut with_grad::<f32>(&[1.0; 3])).unwrap_err(), "lr");
    names(AdamW::<f32>::new(-0.1).step(&mut with_grad::<f32>(&[1.0; 3])).unwrap_err(), "lr");
    names(AdamW::<f32>::new(0.1).betas(1.0, 0.999).step(&mut with_grad::<f32>(&[1.0; 3])).unwrap_err(), "betas.0");
    cases += 3;
    println!("optimizer hyperparameter cases: {cases}");
    assert_eq!(cases, 3 * 5 * 2 + 3 * 5 * 2 + 2 * 6 * 2 + 3);
}

/// The edges PyTorch accepts still run: zero rate, zero betas, zero eps, zero decay.
#[test]
fn edge_values_pytorch_accepts_still_step() {
    let mut m = with_grad::<f64>(&[0.5, 0.5, 0.5]);
    let before = bits(&m);
    Sgd::<f64>::new(0.0).step(&mut m).unwrap();
    assert_eq!(bits(&m), before, "lr 0 changes nothing");
    let mut opt = AdamW::<f64>::new(0.1).betas(0.0, 0.0).eps(0.0).weight_decay(0.0);
    opt.step(&mut m).unwrap();
    // betas 0: the update is lr * g / |g| = 0.1 per element.
    let after = bits(&m);
    for (a, b) in after.iter().zip(&before) {
        assert!((b - a - 0.1).abs() < 1e-12, "{a} vs {b}");
    }
}

/// Every bad scaler setting, through `scale` and `step`: typed, naming it, nothing written.
#[test]
fn bad_scaler_settings_are_errors() {
    let mut cases = 0;
    let settings: Vec<(&str, GradScaler)> = [0.0, -1.0]
        .iter()
        .chain(&NON_FINITE)
        .map(|&v| ("init_scale", GradScaler::new().init_scale(v)))
        .chain(
            [1.0, 0.5, 0.0].iter().chain(&NON_FINITE).map(|&v| ("growth_factor", GradScaler::new().growth_factor(v))),
        )
        .chain(
            [1.0, 0.0, -0.5, 2.0]
                .iter()
                .chain(&NON_FINITE)
                .map(|&v| ("backoff_factor", GradScaler::new().backoff_factor(v))),
        )
        .chain([("growth_interval", GradScaler::new().growth_interval(0))])
        .collect();
    for (name, mut s) in settings {
        let m = with_grad::<f32>(&[0.5, 0.5, 0.5]);
        names(s.scale(&m.w.sum().unwrap()).unwrap_err(), name);
        let mut m = with_grad::<f32>(&[0.5, 0.5, 0.5]);
        let before = bits(&m);
        names(s.step(&mut Sgd::<f32>::new(0.1), &mut m).unwrap_err(), name);
        assert_eq!(bits(&m), before);
        cases += 1;
    }
    println!("scaler setting cases: {cases}");
    assert_eq!(cases, 5 + 6 + 7 + 1);
}

/// Finding 4: skipped steps back the scale off, but never to 0; the next finite step then
/// unscales by a finite factor and writes finite weights (it used to divide by 0 and write NaN
/// into every weight while reporting success).
#[test]
fn skipped_steps_never_bring_the_scale_to_zero() {
    for master in [false, true] {
        let mut opt = Sgd::<f16>::new(0.125).master_weights(master);
        let mut s = GradScaler::new().init_scale(1024.0);
        let mut m = One { w: local::<f16>(&[1.0, 2.0, 3.0]).requires_grad_(true) };
        // 1100 halvings take 1024 below f64's smallest subnormal.
        for _ in 0..1100 {
            m.w.zero_grad();
            s.scale(&m.w.mul(&local::<f16>(&[f64::INFINITY, 1.0, 1.0])).unwrap().sum().unwrap())
                .unwrap()
                .backward()
                .unwrap();
            assert!(!s.step(&mut opt, &mut m).unwrap(), "an inf gradient is skipped");
            s.update();
            assert!(s.get_scale() > 0.0 && s.get_scale().is_finite(), "scale {}", s.get_scale());
        }
        assert_eq!(bits(&m), [1.0, 2.0, 3.0], "skipped steps write nothing");
        m.w.zero_grad();
        s.scale(&m.w.mul(&local::<f16>(&[0.5, 0.5, 0.5])).unwrap().sum().unwrap()).unwrap().backward().unwrap();
        s.step(&mut opt, &mut m).unwrap();
        s.update();
        assert!(bits(&m).iter().all(|v| v.is_finite()), "master {master}: {:?}", bits(&m));
    }
}

/// `sum(w * x)` twice: the gradient `2x` (scaled) is one sum of two terms, so its unscaled
/// value can pass what `x` itself can hold.
fn twice<T: Element>(w: &DTensor<T>, x: &DTensor<T>) -> Result<DTensor<T>> {
    let y = w.mul(x)?.sum()?;
    y.add(&y)
}

/// Unscale first (PyTorch's `unscale_`): a gradient finite as stored but infinite once
/// unscaled in the update's precision is skipped; with f32 master weights the same gradient
/// unscales to a finite value and the step runs.
#[test]
fn the_check_reads_unscaled_gradients_in_the_updates_precision() {
    for (master, expect_step) in [(false, false), (true, true)] {
        // Scale 1/1024: the gradient 2 x 60000 is stored scaled (117.1875) and unscales to
        // 120000, past f16's 65504.
        let mut s = GradScaler::new().init_scale(1.0 / 1024.0);
        let mut m = One { w: local::<f16>(&[1.0, 2.0, 3.0]).requires_grad_(true) };
        s.scale(&twice(&m.w, &local::<f16>(&[60000.0, 1.0, 1.0])).unwrap()).unwrap().backward().unwrap();
        let g = m.w.grad().unwrap().to_host().unwrap();
        assert_eq!(g[[0]].to_f64(), 117.1875, "the stored gradient is finite");
        let before = bits(&m);
        let stepped = s.step(&mut Sgd::<f16>::new(1e-6).master_weights(master), &mut m).unwrap();
        assert_eq!(stepped, expect_step, "master {master}");
        if !stepped {
            assert_eq!(bits(&m), before);
        }
        s.update();
    }
}

/// Growth stops at a finite scale (PyTorch only grows to a finite value).
#[test]
fn growth_never_reaches_infinity() {
    let mut s = GradScaler::new().init_scale(f64::MAX / 2.0).growth_factor(4.0).growth_interval(1);
    let mut m = with_grad::<f32>(&[0.0, 0.0, 0.0]);
    for _ in 0..3 {
        s.step(&mut Sgd::<f32>::new(0.1), &mut m).unwrap();
        s.update();
        assert!(s.get_scale().is_finite());
    }
    assert_eq!(s.get_scale(), f64::MAX / 2.0);
}

/// On several ranks the verdict is shared: one rank's unscaled overflow skips the step on all.
#[test]
fn the_verdict_is_shared_across_ranks() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        let w = from_local(ArrayD::from_elem(IxDyn(&[2]), f16::ONE), &mesh, &[Replicate], FromLocal::default())?;
        let mut m = One { w: w.requires_grad_(true) };
        // Rank 1's gradient unscales past f16's range (see above); rank 0's does not.
        let big = if ctx.rank() == 1 { 60000.0 } else { 0.5 };
        let x =
            from_local(ArrayD::from_elem(IxDyn(&[2]), f16::from_f64(big)), &mesh, &[Replicate], FromLocal::default())?;
        let mut s = GradScaler::new().init_scale(1.0 / 1024.0);
        s.scale(&twice(&m.w, &x)?)?.backward()?;
        let stepped = s.step(&mut Sgd::<f16>::new(0.5), &mut m)?;
        Result::Ok((stepped, m.w.to_host()?.iter().map(|v| v.to_f32()).collect::<Vec<_>>()))
    })
    .unwrap();
    for (stepped, w) in out {
        assert!(!stepped);
        assert_eq!(w, [1.0, 1.0]);
    }
}

/// A 16-bit parameter's AdamW update takes the betas and bias corrections in f64, as PyTorch:
/// in bf16 β₂ = 0.999 rounds to 1 and `1 − β₂ᵗ` to 0, which made every update 0/0 (NaN). Five
/// steps of bf16 and f16 AdamW follow the f64 reference within the 16-bit rounding of the
/// weights.
#[test]
fn half_precision_adamw_follows_the_f64_update() {
    fn steps<T: Element>() -> Vec<f64> {
        let mut m = One { w: local::<T>(&[1.0, 2.0, 3.0]).requires_grad_(true) };
        let mut opt = AdamW::<T>::new(0.01);
        for _ in 0..5 {
            m.zero_grad();
            m.w.mul(&local::<T>(&[0.5, -1.0, 2.0])).unwrap().sum().unwrap().backward().unwrap();
            opt.step(&mut m).unwrap();
        }
        bits(&m)
    }
    let want = steps::<f64>();
    for (name, got, tol) in [("bf16", steps::<dtensor_runtime::bf16>(), 2e-2), ("f16", steps::<f16>(), 4e-3)] {
        for (g, w) in got.iter().zip(&want) {
            assert!(g.is_finite() && (g - w).abs() <= tol * w.abs(), "{name}: {got:?} vs {want:?}");
        }
    }
}
