//! The promise of a `#[distribute]` function: no collective runs that its code does not show.
//! A dynamic op in its body that would redistribute an input on its own (`exp` of a
//! `Partial<Sum>` tensor all-reduces it first) is an `Error::ImplicitCollective`; with
//! `implicit = "allow"` it runs as outside; an explicit `.redistribute()` always runs. Every
//! result is checked against the single-rank computation.

use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::prelude::*;
use dtensor::typed::dims::tp;
use dtensor::typed::Dt;
use dtensor::{distribute, CommDebugMode, Sum};

type PartialSum = Dt<f32, (tp,), (dtensor::Partial<Sum>,), 2>;

/// `exp` through the dynamic layer, which all-reduces the Partial input first.
#[distribute(mesh = "tp", placements = [Partial(Sum)], returns = [Replicate])]
fn exp_dynamic(x: &DTensor<f32>) -> Result<DTensor<f32>> {
    Dt::from_dtensor(x.as_dtensor().exp()?)
}

/// The same, opted in.
#[distribute(mesh = "tp", placements = [Partial(Sum)], returns = [Replicate], implicit = "allow")]
fn exp_dynamic_allowed(x: &DTensor<f32>) -> Result<DTensor<f32>> {
    Dt::from_dtensor(x.as_dtensor().exp()?)
}

/// The collective written out: always allowed.
#[distribute(mesh = "tp", placements = [Partial(Sum)], returns = [Replicate])]
fn exp_explicit(x: &DTensor<f32>) -> Result<DTensor<f32>> {
    let r: Dt<f32, (tp,), (dtensor::Replicate,), 2> = x.redistribute()?;
    Dt::from_dtensor(r.as_dtensor().exp()?)
}

fn global(rows: usize, cols: usize, seed: usize) -> ArrayD<f32> {
    ArrayD::from_shape_fn(IxDyn(&[rows, cols]), |ix| ((ix[0] * 5 + ix[1] * 3 + seed) % 7) as f32 / 7.0 - 0.4)
}

/// `a @ b` on 2 ranks with `a` column-sharded and `b` row-sharded: a `Partial<Sum>` product.
/// The inner dim 5 splits unevenly (3 + 2).
fn partial_product(ctx: &dtensor::RankCtx) -> Result<PartialSum> {
    let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    let a = distribute_tensor(global(4, 5, 1), &mesh, &[Placement::Shard(1)], Some(0))?;
    let b = distribute_tensor(global(5, 3, 2), &mesh, &[Placement::Shard(0)], Some(0))?;
    Dt::from_dtensor(a.matmul(&b)?)
}

fn expected() -> ArrayD<f32> {
    let a = global(4, 5, 1).into_dimensionality::<dtensor::ndarray::Ix2>().unwrap();
    let b = global(5, 3, 2).into_dimensionality::<dtensor::ndarray::Ix2>().unwrap();
    a.dot(&b).mapv(f32::exp).into_dyn()
}

fn assert_close(got: &ArrayD<f32>, want: &ArrayD<f32>) {
    assert_eq!(got.shape(), want.shape());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
    }
}

#[test]
fn dynamic_op_that_would_all_reduce_is_a_typed_error_naming_op_and_function() {
    let out = run(2, |ctx| {
        let x = partial_product(&ctx)?;
        let before = dtensor::implicit_redistribution_count();
        let err = exp_dynamic(&x).err();
        Ok((err, dtensor::implicit_redistribution_count() - before))
    })
    .unwrap();
    for (err, moved) in out {
        match err {
            Some(Error::ImplicitCollective { op, redistribution, function }) => {
                assert!(op.contains("exp"), "{op}");
                assert_eq!(redistribution, "input 0 from (P(sum)) to (R)");
                assert!(
                    function.starts_with("`exp_dynamic` (") && function.contains("implicit_collectives.rs:"),
                    "{function}"
                );
            }
            other => panic!("expected ImplicitCollective, got {other:?}"),
        }
        assert_eq!(moved, 0, "nothing was redistributed");
    }
}

#[test]
fn implicit_allow_runs_as_outside_and_matches_one_rank() {
    let want = expected();
    let out = run(2, |ctx| exp_dynamic_allowed(&partial_product(&ctx)?)?.as_dtensor().full_tensor()).unwrap();
    for got in &out {
        assert_close(got, &want);
    }
}

#[test]
fn explicit_redistribute_is_always_allowed_and_matches_one_rank() {
    let want = expected();
    let out = run(2, |ctx| exp_explicit(&partial_product(&ctx)?)?.as_dtensor().full_tensor()).unwrap();
    for got in &out {
        assert_close(got, &want);
    }
}

#[test]
fn the_scope_ends_with_the_function() {
    let want = expected();
    let out = run(2, |ctx| {
        let x = partial_product(&ctx)?;
        assert!(exp_dynamic(&x).is_err());
        // Outside the function the dynamic op redistributes as documented.
        x.as_dtensor().exp()?.full_tensor()
    })
    .unwrap();
    for got in &out {
        assert_close(got, &want);
    }
}

/// `Partial<Sum> + Replicate`, typed and dynamic, inside a forbidding `#[distribute]` body.
#[distribute(mesh = "tp", placements = [Partial(Sum)], returns = [Partial(Sum)])]
fn add_partial_replicate(x: &DTensor<f32>, #[placements(Replicate)] y: &DTensor<f32>) -> Result<DTensor<f32>> {
    let typed = x.add(y)?;
    let dynamic = x.as_dtensor().add(y.as_dtensor())?;
    assert_eq!(typed.placements(), dynamic.placements());
    Ok(typed)
}

/// Issue 31 ("typed rules and the run-time guard disagree"): the typed rule says
/// `Partial<Sum> ± Replicate` needs no collective (the Replicate operand is partitioned
/// locally), and the guard now reads the same plan, so the body runs on 1 rank and on 2 and 4
/// with no collective until the caller reduces, and the value is the single-rank one.
#[test]
fn partial_plus_replicate_is_no_collective_inside_distribute_on_1_2_and_4_ranks() {
    let want = {
        let a = global(4, 5, 1).into_dimensionality::<dtensor::ndarray::Ix2>().unwrap();
        let b = global(5, 3, 2).into_dimensionality::<dtensor::ndarray::Ix2>().unwrap();
        (a.dot(&b) + global(4, 3, 3).into_dimensionality::<dtensor::ndarray::Ix2>().unwrap()).into_dyn()
    };
    for world in [1, 2, 4] {
        let out = run(world, |ctx| {
            let mesh = ctx.init_device_mesh(&[world], &["tp"])?;
            let a = distribute_tensor(global(4, 5, 1), &mesh, &[Placement::Shard(1)], Some(0))?;
            let b = distribute_tensor(global(5, 3, 2), &mesh, &[Placement::Shard(0)], Some(0))?;
            let x: PartialSum = Dt::from_dtensor(a.matmul(&b)?)?;
            let y: Dt<f32, (tp,), (dtensor::Replicate,), 2> = Dt::distribute(&global(4, 3, 3), &mesh)?;
            let mode = CommDebugMode::new();
            let z = mode.scope(|| add_partial_replicate(&x, &y))?;
            assert_eq!(mode.total(), 0, "world {world}: {}", mode.summary());
            z.full_tensor()
        })
        .unwrap();
        for got in &out {
            assert_close(got, &want);
        }
    }
}

/// Issue 31 ("no typed op communicates before its own layout check"): a typed op whose
/// dynamic op would need a collective its rule does not show (here a dim of size 1, sharded,
/// broadcast against a sharded dim of 4: the runtime would all-gather it) is refused before
/// anything is sent, with an error naming the typed op and the caller's line.
#[test]
fn a_typed_op_refuses_a_hidden_collective_before_sending_anything() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let x: Dt<f32, (tp,), (dtensor::Shard<0>,), 2> = Dt::distribute(&global(4, 3, 1), &mesh)?;
        let y: Dt<f32, (tp,), (dtensor::Shard<0>,), 2> = Dt::distribute(&global(1, 3, 2), &mesh)?;
        let mode = CommDebugMode::new();
        let line = line!() + 1;
        let err = mode.scope(|| x.add(&y)).err();
        Ok((err, line, mode.total()))
    })
    .unwrap();
    for (err, line, sent) in out {
        assert_eq!(sent, 0, "nothing may be sent before the refusal");
        match err {
            Some(Error::TypedOpCollective { op, at, .. }) => {
                assert_eq!(op, "add");
                assert!(at.contains(&format!("implicit_collectives.rs:{line}")), "{at}");
            }
            other => panic!("expected TypedOpCollective, got {other:?}"),
        }
    }
}

/// `exp` of the Partial input on a helper thread spawned inside the body: the helper opened
/// no scope of its own, so it answers to the function's.
#[distribute(mesh = "tp", placements = [Partial(Sum)], returns = [Replicate])]
fn exp_on_a_helper_thread(x: &DTensor<f32>) -> Result<DTensor<f32>> {
    let local = std::thread::scope(|s| s.spawn(|| x.as_dtensor().exp()).join()).expect("the helper thread")?;
    Dt::from_dtensor(local)
}

/// The same, opted in: the helper runs the all-reduce as the body itself could.
#[distribute(mesh = "tp", placements = [Partial(Sum)], returns = [Replicate], implicit = "allow")]
fn exp_on_a_helper_thread_allowed(x: &DTensor<f32>) -> Result<DTensor<f32>> {
    let local = std::thread::scope(|s| s.spawn(|| x.as_dtensor().exp()).join()).expect("the helper thread")?;
    Dt::from_dtensor(local)
}

#[test]
fn a_helper_thread_cannot_carry_a_hidden_collective_out_of_the_function() {
    let want = expected();
    let out = run(2, |ctx| {
        let x = partial_product(&ctx)?;
        let err = exp_on_a_helper_thread(&x).err();
        let allowed = exp_on_a_helper_thread_allowed(&x)?.as_dtensor().full_tensor()?;
        // Once the function returned, a helper thread redistributes as the rank thread does.
        let after = std::thread::scope(|s| s.spawn(|| x.as_dtensor().exp()).join()).expect("helper")?.full_tensor()?;
        Ok((err, allowed, after))
    })
    .unwrap();
    for (err, allowed, after) in out {
        match err {
            Some(Error::ImplicitCollective { op, redistribution, function }) => {
                assert!(op.contains("exp"), "{op}");
                assert_eq!(redistribution, "input 0 from (P(sum)) to (R)");
                assert!(
                    function.starts_with("`exp_on_a_helper_thread` (") && function.contains("from a thread"),
                    "{function}"
                );
            }
            other => panic!("expected ImplicitCollective from the helper thread, got {other:?}"),
        }
        assert_close(&allowed, &want);
        assert_close(&after, &want);
    }
}
