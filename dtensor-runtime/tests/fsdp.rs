//! `fully_shard` (FSDP2): training on FSDP, HSDP and FSDP × TP meshes gives the single-rank
//! losses and weights; the collectives are one all-gather per sharded parameter in the
//! forward and one reduce-scatter in the backward; gradient accumulation without sync;
//! explicit unshard; uneven and empty shards; typed errors, also for ranks that disagree.

use dtensor_runtime::fsdp::{fully_shard, FullyShard, FullyShardOptions};
use dtensor_runtime::module::{
    parallelize_module, ColwiseParallel, Forward, Linear, Module, ParallelStyle, RowwiseParallel, Sequential,
};
use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::optim::{clip_grad_norm, AdamW};
use dtensor_runtime::{
    distribute_tensor, manual_seed, run, CollectiveKind, CommDebugMode, DTensor, DType, DeviceMesh, Error, Placement,
    Result, Shard,
};

mod fsdp_util;

type Block = fsdp_util::Block<f64>;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// One rank, no FSDP: the reference.
    Reference,
    /// FSDP over `dp` (a 1-D mesh).
    Fsdp,
    /// HSDP on `rep × dp`: replicated over `rep`, sharded over `dp`.
    Hsdp,
    /// TP over `tp` (colwise w1, rowwise w2), FSDP over `dp`.
    FsdpTp,
    /// FSDP over `dp`, resharding after the forward (the backward gathers and recomputes).
    FsdpReshard,
    /// FSDP × TP, resharding after the forward.
    FsdpTpReshard,
    /// FSDP over `dp`, resharding after the forward to groups of 2 ranks of `dp`.
    FsdpReshardGroup,
    /// FSDP × TP, resharding after the forward to groups of 2 ranks of `dp`.
    FsdpTpReshardGroup,
}

impl Mode {
    fn tp(self) -> bool {
        matches!(self, Mode::FsdpTp | Mode::FsdpTpReshard | Mode::FsdpTpReshardGroup)
    }
    fn reshard(self) -> bool {
        matches!(self, Mode::FsdpReshard | Mode::FsdpTpReshard) || self.group().is_some()
    }
    fn group(self) -> Option<usize> {
        matches!(self, Mode::FsdpReshardGroup | Mode::FsdpTpReshardGroup).then_some(2)
    }
}

const DIM: usize = 6;
const HIDDEN: usize = 10;
const BATCH: usize = 8;

fn batch(step: usize) -> ArrayD<f64> {
    let v = (0..BATCH * DIM).map(|i| (((i * 7 + step * 13) % 17) as f64 - 8.0) / 9.0).collect();
    ArrayD::from_shape_vec(vec![BATCH, DIM], v).unwrap()
}

/// Two blocks, each its own FSDP unit with forward prefetch; one optimizer steps them all (by
/// their `i.` names).
fn blocks(mesh: &DeviceMesh, mode: Mode) -> Result<Sequential<FullyShard<f64, Block>>> {
    blocks_prefetching(mesh, mode, true)
}

fn blocks_prefetching(mesh: &DeviceMesh, mode: Mode, prefetch: bool) -> Result<Sequential<FullyShard<f64, Block>>> {
    manual_seed(7);
    let blocks = (0..2)
        .map(|i| {
            let mut b = Block::new(DIM, HIDDEN)?;
            let fsdp_dim = "dp";
            if mode.tp() {
                let (col, row) = (ColwiseParallel::new(), RowwiseParallel::new());
                let plan: Vec<(&str, &dyn ParallelStyle)> = vec![("w1", &col), ("w2", &row)];
                b = parallelize_module(b, mesh, &plan)?;
            }
            let dim = if mode == Mode::Reference { mesh.dim_names()[0].clone() } else { fsdp_dim.to_string() };
            let opts = FullyShardOptions::on(&dim)
                .named(&format!("blocks.{i}"))
                .reshard_after_forward(mode.reshard())
                .prefetch(prefetch);
            let opts = match mode.group() {
                Some(g) => opts.reshard_after_forward_to(g),
                None => opts,
            };
            fully_shard(b, mesh, &opts)
        })
        .collect::<Result<_>>()?;
    Ok(Sequential(blocks))
}

fn input_placements(mode: Mode) -> Vec<Placement> {
    match mode {
        Mode::Reference | Mode::Fsdp | Mode::FsdpReshard | Mode::FsdpReshardGroup => vec![Shard(0)],
        Mode::Hsdp => vec![Shard(0), Shard(0)],
        Mode::FsdpTp | Mode::FsdpTpReshard | Mode::FsdpTpReshardGroup => vec![Shard(0), Placement::Replicate],
    }
}

struct Trained {
    losses: Vec<f64>,
    /// Each step's gradient norms (infinity, then 2 before clipping to 0.45).
    norms: Vec<f64>,
    weights: Vec<(String, Vec<f64>)>,
}

fn train(world: usize, shape: &[usize], names: &[&str], mode: Mode, steps: usize) -> Trained {
    let shape = shape.to_vec();
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut out = run(world, move |ctx| {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mesh = ctx.init_device_mesh(&shape, &names)?;
        let mut model = blocks(&mesh, mode)?;
        let mut opt = AdamW::new(1e-2).weight_decay(0.01);
        let (mut losses, mut norms) = (vec![], vec![]);
        for step in 0..steps {
            let x = distribute_tensor(batch(step), &mesh, &input_placements(mode), None)?;
            let h = model.forward(&x)?;
            let loss = h.mul(&h)?.mean()?;
            loss.backward()?;
            losses.push(loss.full_tensor()?.iter().copied().next().unwrap());
            norms.push(clip_grad_norm(&model, 1e9, f64::INFINITY)?);
            norms.push(clip_grad_norm(&model, 0.45, 2.0)?);
            opt.step(&mut model)?;
            model.zero_grad();
        }
        let mut weights = vec![];
        for (n, p) in model.named_parameters() {
            weights.push((n, p.full_tensor()?.iter().copied().collect()));
        }
        Ok(Trained { losses, norms, weights })
    })
    .unwrap();
    // every rank computes the same global norms
    assert!(out.iter().all(|t| t.norms == out[0].norms), "the ranks disagree about the gradient norm");
    out.remove(0)
}

fn assert_close(run: &Trained, reference: &Trained, what: &str) {
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
    for (a, b) in run.losses.iter().zip(&reference.losses) {
        assert!(rel(*a, *b) < 1e-12, "{what}: loss {a} vs reference {b}");
    }
    // the global norms, on every mesh (the clip to 0.45 bites: the norms are larger)
    assert!(reference.norms.iter().skip(1).step_by(2).all(|&n| n > 0.45), "{:?}", reference.norms);
    for (a, b) in run.norms.iter().zip(&reference.norms) {
        assert!(rel(*a, *b) < 1e-12, "{what}: gradient norm {a} vs reference {b}");
    }
    assert_eq!(run.weights.len(), reference.weights.len());
    for ((n, a), (m, b)) in run.weights.iter().zip(&reference.weights) {
        assert_eq!(n, m);
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-12, "{what}: {n} differs by {worst:e}");
    }
}

#[test]
fn fsdp_hsdp_and_fsdp_tp_train_as_one_rank() {
    let reference = train(1, &[1], &["dp"], Mode::Reference, 3);
    assert!(reference.losses[2] < reference.losses[0], "the reference does not learn: {:?}", reference.losses);
    assert_close(&train(4, &[4], &["dp"], Mode::Fsdp, 3), &reference, "FSDP 4");
    assert_close(&train(2, &[2], &["dp"], Mode::Fsdp, 3), &reference, "FSDP 2");
    assert_close(&train(4, &[2, 2], &["rep", "dp"], Mode::Hsdp, 3), &reference, "HSDP 2x2");
    assert_close(&train(4, &[2, 2], &["dp", "tp"], Mode::FsdpTp, 3), &reference, "FSDP x TP 2x2");
    assert_close(&train(4, &[4], &["dp"], Mode::FsdpReshard, 3), &reference, "FSDP 4, resharding");
    assert_close(&train(4, &[2, 2], &["dp", "tp"], Mode::FsdpTpReshard, 3), &reference, "FSDP x TP 2x2, resharding");
}

#[test]
fn resharding_to_a_group_trains_as_one_rank() {
    let reference = train(1, &[1], &["dp"], Mode::Reference, 3);
    assert_close(&train(4, &[4], &["dp"], Mode::FsdpReshardGroup, 3), &reference, "FSDP 4, resharding to 2");
    let tp = train(8, &[4, 2], &["dp", "tp"], Mode::FsdpTpReshardGroup, 3);
    assert_close(&tp, &reference, "FSDP x TP 4x2, resharding to 2");
}

#[test]
fn parameters_rest_sharded_and_tp_dims_are_kept() {
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let model = blocks(&mesh, Mode::FsdpTp)?;
        let layouts: Vec<(String, String)> = model.0[0]
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (n, dtensor_runtime::placement::fmt_placements(p.placements())))
            .collect();
        let want = [
            ("norm.weight", "(S(0), R)"),
            ("norm.bias", "(S(0), R)"),
            // colwise: [out, in] sharded on out by tp, so FSDP shards `in`
            ("w1.weight", "(S(1), S(0))"),
            // its bias [out] is sharded by tp on its only dim: it stays replicated on dp
            ("w1.bias", "(R, S(0))"),
            // rowwise: [out, in] sharded on in by tp, so FSDP shards `out`
            ("w2.weight", "(S(0), S(1))"),
            ("w2.bias", "(S(0), R)"),
        ];
        for ((n, l), (wn, wl)) in layouts.iter().zip(want) {
            assert_eq!((n.as_str(), l.as_str()), (wn, wl));
        }
        assert_eq!(model.0[0].replicated_parameters(), vec!["w1.bias"]);
        Ok(())
    })
    .unwrap();
}

#[test]
fn one_all_gather_and_one_reduce_scatter_per_sharded_parameter() {
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["dp"])?;
        let model = blocks(&mesh, Mode::Fsdp)?;
        let sharded: usize = model.0.iter().map(|b| b.named_parameters().len() - b.replicated_parameters().len()).sum();
        assert_eq!(sharded, 12);
        let x = distribute_tensor(batch(0), &mesh, &[Shard(0)], None)?;
        let forward = CommDebugMode::new();
        let loss = forward.scope(|| -> Result<DTensor<f64>> {
            let h = model.forward(&x)?;
            h.mul(&h)?.mean()
        })?;
        assert_eq!(forward.count_on(CollectiveKind::AllGather, "dp"), sharded);
        assert_eq!(forward.count_for_op(CollectiveKind::AllGather, "fsdp_all_gather"), sharded);
        let backward = CommDebugMode::new();
        backward.scope(|| loss.backward())?;
        assert_eq!(backward.count_on(CollectiveKind::ReduceScatter, "dp"), sharded);
        assert_eq!(backward.count(CollectiveKind::AllReduce), 0, "{}", backward.summary());
        for (n, p) in model.named_parameters() {
            assert_eq!(p.grad().unwrap().placements(), p.placements(), "{n}");
        }
        Ok(())
    })
    .unwrap();
}

/// Two micro-batches without sync then one with: the gradients equal the sum over the three
/// micro-batches, and only the last backward reduce-scatters.
#[test]
fn gradient_accumulation_without_sync() {
    let grads = |world: usize, sync_each: bool| {
        run(world, move |ctx| {
            let mesh = ctx.init_device_mesh(&[world], &["dp"])?;
            let model = blocks(&mesh, Mode::Fsdp)?;
            let mut reduce_scatters = vec![];
            for step in 0..3 {
                let last = step == 2;
                for b in &model.0 {
                    b.set_requires_gradient_sync(sync_each || last);
                }
                let x = distribute_tensor(batch(step), &mesh, &[Shard(0)], None)?;
                let comm = CommDebugMode::new();
                comm.scope(|| -> Result<()> {
                    let h = model.forward(&x)?;
                    h.mul(&h)?.mean()?.backward()
                })?;
                reduce_scatters.push(comm.count(CollectiveKind::ReduceScatter));
            }
            let g: Vec<Vec<f64>> = model
                .named_parameters()
                .into_iter()
                .map(|(_, p)| p.grad().unwrap().full_tensor())
                .map(|a| a.map(|a| a.iter().copied().collect()))
                .collect::<Result<_>>()?;
            Ok((g, reduce_scatters))
        })
        .unwrap()
        .remove(0)
    };
    let (every, _) = grads(1, true);
    let (accumulated, counts) = grads(4, false);
    assert_eq!(counts, vec![0, 0, 12]);
    for (a, b) in accumulated.iter().zip(&every) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-12, "{x} vs {y}");
        }
    }
}

#[test]
fn explicit_unshard_gathers_once() {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        let model = blocks(&mesh, Mode::Fsdp)?;
        let x = distribute_tensor(batch(0), &mesh, &[Shard(0)], None)?;
        // each forward draws the same dropout numbers
        let rng = dtensor_runtime::rng::rng_state();
        let plain = model.0[0].forward(&x)?.full_tensor()?;
        model.0[0].unshard()?;
        assert!(model.0[0].is_unsharded());
        let comm = CommDebugMode::new();
        let again = comm.scope(|| -> Result<Vec<ArrayD<f64>>> {
            (0..2)
                .map(|_| {
                    dtensor_runtime::rng::set_rng_state(rng);
                    model.0[0].forward(&x)?.full_tensor()
                })
                .collect()
        })?;
        assert_eq!(comm.count_on(CollectiveKind::AllGather, "dp"), 2, "only the outputs' full_tensor gathers");
        assert_eq!(again[0], plain);
        assert_eq!(again[1], plain);
        // the gradient still reaches the shards
        model.0[0].forward(&x)?.sum()?.backward()?;
        assert!(model.0[0].named_parameters().iter().all(|(_, p)| p.grad().is_some()));
        model.0[0].reshard();
        assert!(!model.0[0].is_unsharded());
        Ok(())
    })
    .unwrap();
}

/// A [3, 5] weight over 4 ranks: shards of 1, 1, 1 and 0 rows (torch.chunk).
#[test]
fn uneven_and_empty_shards() {
    let reference = run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["dp"])?;
        manual_seed(3);
        let lin = fully_shard(Linear::<f64>::new(5, 3, true)?, &mesh, &FullyShardOptions::on("dp"))?;
        let x = ArrayD::from_shape_vec(vec![4, 5], (0..20).map(|i| i as f64 / 7.0).collect()).unwrap();
        let x = distribute_tensor(&x, &mesh, &[Shard(0)], None)?;
        lin.forward(&x)?.mul_scalar(2.0)?.sum()?.backward()?;
        lin.named_parameters().iter().map(|(_, p)| p.grad().unwrap().full_tensor()).collect::<Result<Vec<_>>>()
    })
    .unwrap()
    .remove(0);
    let sharded = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["dp"])?;
        manual_seed(3);
        let lin = fully_shard(Linear::<f64>::new(5, 3, true)?, &mesh, &FullyShardOptions::on("dp"))?;
        let rows = lin.named_parameters()[0].1.local().shape()[0];
        assert_eq!(rows, if mesh.rank() == 3 { 0 } else { 1 });
        let x = ArrayD::from_shape_vec(vec![4, 5], (0..20).map(|i| i as f64 / 7.0).collect()).unwrap();
        let x = distribute_tensor(&x, &mesh, &[Shard(0)], None)?;
        lin.forward(&x)?.mul_scalar(2.0)?.sum()?.backward()?;
        lin.named_parameters().iter().map(|(_, p)| p.grad().unwrap().full_tensor()).collect::<Result<Vec<_>>>()
    })
    .unwrap();
    for r in sharded {
        for (a, b) in r.iter().zip(&reference) {
            let worst = a.iter().zip(b.iter()).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
            assert!(worst < 1e-12, "{worst:e}");
        }
    }
}

#[test]
fn reduce_dtype_reduces_in_f32() {
    let grads = |dtype: Option<DType>| {
        run(2, move |ctx| {
            let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
            manual_seed(3);
            let mut o = FullyShardOptions::on("dp");
            o.reduce_dtype = dtype;
            let lin = fully_shard(Linear::<f64>::new(5, 3, true)?, &mesh, &o)?;
            let x = ArrayD::from_shape_vec(vec![4, 5], (0..20).map(|i| (i as f64 / 7.0).sin()).collect()).unwrap();
            let x = distribute_tensor(&x, &mesh, &[Shard(0)], None)?;
            lin.forward(&x)?.sum()?.backward()?;
            let g = lin.named_parameters()[0].1.grad().unwrap().full_tensor()?;
            Ok(g.iter().copied().collect::<Vec<f64>>())
        })
        .unwrap()
        .remove(0)
    };
    let (exact, f32s) = (grads(None), grads(Some(DType::F32)));
    let worst = exact.iter().zip(&f32s).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst > 0.0 && worst < 1e-6, "a reduction in f32 rounds, slightly: {worst:e}");
}

fn fsdp_error(e: Error) -> (String, String) {
    match e {
        Error::FullyShard { module, reason } => (module, reason),
        e => panic!("expected Error::FullyShard, got {e}"),
    }
}

#[test]
fn bad_input_is_a_typed_error_naming_the_module() {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        manual_seed(0);
        // no such mesh dim
        let e = fully_shard(Linear::<f64>::new(4, 4, true)?, &mesh, &FullyShardOptions::on("fsdp").named("head"));
        let (module, reason) = fsdp_error(e.err().unwrap());
        assert_eq!(module, "head");
        assert!(reason.contains("no dim `fsdp`"), "{reason}");
        // twice
        let once = fully_shard(Linear::<f64>::new(4, 4, true)?, &mesh, &FullyShardOptions::on("dp"))?;
        let (module, reason) = fsdp_error(fully_shard(once, &mesh, &FullyShardOptions::on("dp")).err().unwrap());
        assert_eq!(module, "FullyShard");
        assert!(reason.contains("`weight` is already S(0) on `dp`"), "{reason}");
        // another mesh
        let other = ctx.init_device_mesh(&[2], &["x"])?;
        let lin = dtensor_runtime::distribute_module(Linear::<f64>::new(4, 4, true)?, &other, None, None, None)?;
        let (module, reason) =
            fsdp_error(fully_shard(lin.module, &mesh, &FullyShardOptions::on("dp").named("proj")).err().unwrap());
        assert_eq!(module, "proj");
        assert!(reason.contains("`weight` lives on the mesh") && reason.contains("not on the mesh"), "{reason}");
        // a gradient of another layout cannot be put on a shard
        let lin = fully_shard(Linear::<f64>::new(4, 4, false)?, &mesh, &FullyShardOptions::on("dp"))?;
        let w = lin.named_parameters()[0].1;
        let whole = dtensor_runtime::zeros::<f64>(&[4, 4], &dtensor_runtime::TensorOptions::new().mesh(&mesh))?;
        match w.set_grad(&whole) {
            Err(Error::Autograd(m)) => assert!(m.contains("laid out (R)") && m.contains("laid out (S(0))"), "{m}"),
            other => panic!("expected Error::Autograd, got {other:?}"),
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn ranks_that_wrap_different_modules_all_fail() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        let out = if mesh.rank() == 0 { 4 } else { 5 };
        let r = fully_shard(Linear::<f64>::new(4, out, true)?, &mesh, &FullyShardOptions::on("dp").named("head"));
        Ok(fsdp_error(r.err().expect("the ranks disagree")))
    })
    .unwrap();
    for (module, reason) in out {
        assert_eq!(module, "head");
        assert!(reason.contains("the ranks wrap different parameters"), "{reason}");
    }
}

/// A rank that fails between the forward and the backward ends its peers, which wait in the
/// backward's reduce-scatter, with the failure instead of a hang.
#[test]
fn a_rank_failing_before_the_reduce_scatter_ends_every_peer() {
    let start = std::time::Instant::now();
    let r = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["dp"])?;
        manual_seed(0);
        let lin = fully_shard(Linear::<f64>::new(8, 8, false)?, &mesh, &FullyShardOptions::on("dp"))?;
        let x = distribute_tensor(ArrayD::from_elem(vec![4, 8], 1.0), &mesh, &[Shard(0)], None)?;
        let y = lin.forward(&x)?.sum()?;
        if mesh.rank() == 1 {
            return Err(Error::InvalidArgument { context: "test".into(), reason: "injected failure".into() });
        }
        y.backward()
    });
    let e = r.expect_err("the step cannot succeed");
    assert!(e.to_string().contains("injected failure"), "{e}");
    assert!(start.elapsed() < std::time::Duration::from_secs(30), "took {:?}", start.elapsed());
}

/// Resharding after the forward: the backward gathers every sharded parameter again (one
/// all-gather more each), recomputes, and reduce-scatters as before; the gradients are those
/// of the plain run, bit for bit.
#[test]
fn resharding_gathers_again_in_the_backward() {
    let step = |mode: Mode| {
        run(4, move |ctx| {
            let mesh = ctx.init_device_mesh(&[4], &["dp"])?;
            let model = blocks(&mesh, mode)?;
            let x = distribute_tensor(batch(0), &mesh, &[Shard(0)], None)?;
            let (forward, backward) = (CommDebugMode::new(), CommDebugMode::new());
            let loss = forward.scope(|| -> Result<DTensor<f64>> {
                let h = model.forward(&x)?;
                h.mul(&h)?.mean()
            })?;
            backward.scope(|| loss.backward())?;
            let counts = [
                forward.count_on(CollectiveKind::AllGather, "dp"),
                backward.count_on(CollectiveKind::AllGather, "dp"),
                backward.count_on(CollectiveKind::ReduceScatter, "dp"),
            ];
            let grads: Vec<Vec<f64>> = model
                .named_parameters()
                .into_iter()
                .map(|(_, p)| Ok(p.grad().unwrap().full_tensor()?.iter().copied().collect()))
                .collect::<Result<_>>()?;
            Ok((counts, grads))
        })
        .unwrap()
        .remove(0)
    };
    let (plain_counts, plain) = step(Mode::Fsdp);
    let (counts, resharded) = step(Mode::FsdpReshard);
    assert_eq!(plain_counts, [12, 0, 12]);
    assert_eq!(counts, [12, 12, 12]);
    assert_eq!(plain, resharded);
}

/// Resharding to groups of 2 of the 4 `dp` ranks: the forward gathers over `dp` and keeps half
/// of each parameter (a local slice: nothing more is sent), the backward gathers over the
/// group (`dp.within`) only, receiving half of each parameter instead of three quarters; gradients
/// are those of the plain run, with and without prefetch.
#[test]
fn resharding_to_a_group_gathers_within_it_in_the_backward() {
    let step = |mode: Mode, prefetch: bool| {
        run(4, move |ctx| {
            let mesh = ctx.init_device_mesh(&[4], &["dp"])?;
            let model = blocks_prefetching(&mesh, mode, prefetch)?;
            let x = distribute_tensor(batch(0), &mesh, &[Shard(0)], None)?;
            let (forward, backward) = (CommDebugMode::new(), CommDebugMode::new());
            let loss = forward.scope(|| -> Result<DTensor<f64>> {
                let h = model.forward(&x)?;
                h.mul(&h)?.mean()
            })?;
            backward.scope(|| loss.backward())?;
            let gathered = |on: &str| -> usize {
                backward
                    .records()
                    .iter()
                    .filter(|r| r.kind == CollectiveKind::AllGather && r.mesh_dim.as_deref() == Some(on))
                    .map(|r| r.bytes * (r.group_size - 1)) // about what each rank receives
                    .sum()
            };
            let counts = [
                forward.count_on(CollectiveKind::AllGather, "dp"),
                forward.records().len(),
                backward.count_on(CollectiveKind::AllGather, "dp"),
                backward.count_on(CollectiveKind::AllGather, "dp.within"),
                backward.count_on(CollectiveKind::ReduceScatter, "dp"),
            ];
            let grads: Vec<Vec<f64>> = model
                .named_parameters()
                .into_iter()
                .map(|(_, p)| Ok(p.grad().unwrap().full_tensor()?.iter().copied().collect()))
                .collect::<Result<_>>()?;
            Ok((counts, gathered("dp") + gathered("dp.within"), grads))
        })
        .unwrap()
        .remove(0)
    };
    let (whole_counts, whole_bytes, whole) = step(Mode::FsdpReshard, false);
    assert_eq!(whole_counts, [12, 12, 12, 0, 12]);
    for prefetch in [false, true] {
        let (counts, bytes, grads) = step(Mode::FsdpReshardGroup, prefetch);
        assert_eq!(counts, [12, 12, 0, 12, 12], "prefetch {prefetch}");
        println!("backward all-gathers, bytes rank 0 receives: resharding to dp {whole_bytes}, to groups of 2 {bytes} (prefetch {prefetch})");
        // each rank receives half of each parameter instead of three quarters
        assert!(bytes < whole_bytes, "prefetch {prefetch}: {bytes} bytes received vs {whole_bytes}");
        assert_eq!(grads, whole, "prefetch {prefetch}");
    }
}

#[test]
fn a_reshard_group_that_does_not_divide_the_dim_is_refused() {
    for group in [0, 1, 3, 8] {
        let errs = run(4, move |ctx| {
            let mesh = ctx.init_device_mesh(&[4], &["dp"])?;
            let opts = FullyShardOptions::on("dp").named("blocks.0").reshard_after_forward_to(group);
            match fully_shard(Block::new(DIM, HIDDEN)?, &mesh, &opts) {
                Ok(_) => Ok(None),
                Err(e) => Ok(Some(fsdp_error(e))),
            }
        })
        .unwrap();
        for e in errs {
            let (module, reason) = e.unwrap_or_else(|| panic!("group {group} was accepted"));
            assert_eq!(module, "blocks.0");
            assert!(reason.contains(&format!("reshard_after_forward_to({group})")), "{reason}");
        }
    }
    // the split's names are taken on this mesh
    let errs = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[4, 1], &["dp", "dp.within"])?;
        let opts = FullyShardOptions::on("dp").named("blocks.0").reshard_after_forward_to(2);
        Ok(fully_shard(Block::new(DIM, HIDDEN)?, &mesh, &opts).err().map(fsdp_error))
    })
    .unwrap();
    for e in errs {
        let (module, reason) = e.expect("refused");
        assert_eq!(module, "blocks.0");
        assert!(reason.contains("has a dim `dp.within` already"), "{reason}");
    }
    // a group of the whole dim is resharding to it
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["dp"])?;
        let opts = FullyShardOptions::on("dp").reshard_after_forward_to(4);
        let m = fully_shard(Block::new(DIM, HIDDEN)?, &mesh, &opts)?;
        assert!(m.reshards_after_forward());
        Ok(())
    })
    .unwrap();
}

/// Parameters loaded straight into the layout fully_shard gives them (each rank reading its
/// part) are adopted with `accept_resting`; another sharding over the dim is refused.
#[test]
fn parameters_already_resting_sharded_are_adopted_on_request() {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        manual_seed(1);
        let lin = Linear::<f64>::new(4, 6, false)?;
        let w = lin.weight.local().to_host()?;
        let resting = dtensor_runtime::distribute_tensor(&w, &mesh, &[Shard(0)], None)?.requires_grad_(true);
        let adopted = Linear { weight: resting.clone(), ..lin.clone() };
        let refused = fully_shard(adopted.clone(), &mesh, &FullyShardOptions::on("dp"));
        assert!(matches!(refused, Err(Error::FullyShard { .. })));
        let f = fully_shard(adopted, &mesh, &FullyShardOptions::on("dp").accept_resting(true))?;
        assert_eq!(f.layouts()[0].2, vec![Placement::Replicate]);
        let x = distribute_tensor(ArrayD::from_elem(vec![2, 4], 1.0), &mesh, &[Shard(0)], None)?;
        f.forward(&x)?.sum()?.backward()?;
        assert_eq!(f.named_parameters()[0].1.grad().unwrap().placements(), &[Shard(0)]);
        // sharded on another dim than fully_shard would: refused, naming both layouts
        let other = dtensor_runtime::distribute_tensor(&w, &mesh, &[Shard(1)], None)?.requires_grad_(true);
        let e = fully_shard(Linear { weight: other, ..lin }, &mesh, &FullyShardOptions::on("dp").accept_resting(true));
        let (_, reason) = fsdp_error(e.err().unwrap());
        assert!(reason.contains("rests as (S(1))") && reason.contains("as (S(0))"), "{reason}");
        Ok(())
    })
    .unwrap();
}

/// Mixed precision under FSDP (PyTorch's `MixedPrecisionPolicy(param_dtype=bf16,
/// reduce_dtype=f32)`): a bf16 module all-gathers bf16 shards (half the bytes), reduce-scatters
/// its gradients in f32, and AdamW keeps f32 master weights and moments, sharded like the
/// parameters. It follows the f32 run on one rank to bf16's precision.
#[test]
fn bf16_parameters_f32_reduction_and_sharded_master_weights() {
    fn losses<T: dtensor_runtime::Element>(world: usize) -> Vec<f64> {
        run(world, move |ctx| {
            let mesh = ctx.init_device_mesh(&[world], &["dp"])?;
            manual_seed(5);
            let layers = (0..2)
                .map(|i| {
                    let opts = FullyShardOptions::on("dp").named(&format!("{i}")).reduce_dtype(DType::F32);
                    fully_shard(Linear::<T>::new(16, 16, true)?, &mesh, &opts)
                })
                .collect::<Result<Vec<_>>>()?;
            let mut model = Sequential(layers);
            let mut opt = AdamW::<T>::new(1e-2).master_weights(T::DTYPE != DType::F32);
            let mut out = vec![];
            for step in 0..5 {
                let x = ArrayD::from_shape_fn(vec![8, 16], |i| T::of_f64(((i[0] * 3 + i[1] + step) % 9) as f64 / 9.0));
                let x = distribute_tensor(x, &mesh, &[Shard(0)], None)?;
                model.zero_grad();
                let h = model.forward(&x)?;
                let loss = h.mul(&h)?.mean()?;
                loss.backward()?;
                out.push(loss.full_tensor()?.iter().next().map_or(f64::NAN, |v| v.as_f64()));
                opt.step(&mut model)?;
            }
            if world > 1 {
                // the f32 master copies rest sharded like the bf16 parameters
                for (name, p) in model.named_parameters() {
                    assert!(matches!(p.placements()[0], Placement::Shard(_)), "{name}");
                }
            }
            Ok(out)
        })
        .unwrap()
        .remove(0)
    }
    let reference = losses::<f32>(1);
    let mixed = losses::<dtensor_runtime::bf16>(2);
    assert!(reference[4] < reference[0], "{reference:?}");
    for (a, b) in mixed.iter().zip(&reference) {
        assert!((a - b).abs() <= 3e-2 * b.abs(), "bf16 FSDP {a} vs f32 {b}: {mixed:?} vs {reference:?}");
    }
}

/// One rank refusing its module (here: a parameter already sharded over dp on rank 1 only)
/// ends every rank with an error naming the module, instead of leaving the others waiting.
#[test]
fn one_rank_refusing_ends_every_rank() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        manual_seed(0);
        let mut lin = Linear::<f64>::new(4, 4, false)?;
        let w = lin.weight.local().to_host()?;
        let pl = if mesh.rank() == 1 { Shard(0) } else { Placement::Replicate };
        lin.weight = distribute_tensor(&w, &mesh, &[pl], None)?.requires_grad_(true);
        Ok(fsdp_error(fully_shard(lin, &mesh, &FullyShardOptions::on("dp").named("head")).err().expect("refused")))
    })
    .unwrap();
    assert!(out[1].1.contains("already S(0)"), "{}", out[1].1);
    assert_eq!(out[0].0, "head");
    assert!(out[0].1.contains("rank 1 refused the module"), "{}", out[0].1);
}

/// A resharding module refuses `call` while gradients are recorded (it could not free its
/// parameters); `clear_buffered_gradients` drops what sync-off backwards buffered.
#[test]
fn resharding_refuses_call_and_buffers_can_be_cleared() {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        manual_seed(0);
        let opts = FullyShardOptions::on("dp").reshard_after_forward(true);
        let lin = fully_shard(Linear::<f64>::new(4, 4, false)?, &mesh, &opts)?;
        let x = distribute_tensor(ArrayD::from_elem(vec![2, 4], 1.0), &mesh, &[Shard(0)], None)?;
        let (_, reason) = fsdp_error(lin.call(|m| m.forward(&x)).expect_err("refused"));
        assert!(reason.contains("reshard_after_forward"), "{reason}");
        assert!(dtensor_runtime::no_grad(|| lin.call(|m| m.forward(&x))).is_ok());
        // sync off: buffered, nothing reduced; cleared: the next synced step starts afresh
        lin.set_requires_gradient_sync(false);
        lin.forward(&x)?.sum()?.backward()?;
        assert!(lin.named_parameters()[0].1.grad().is_none());
        lin.clear_buffered_gradients();
        lin.set_requires_gradient_sync(true);
        lin.forward(&x)?.sum()?.backward()?;
        let once = lin.named_parameters()[0].1.grad().unwrap().full_tensor()?;
        // d(sum(x W^T))/dW = column sums of x: 2 rows of ones → every entry 2
        assert!(once.iter().all(|&v| (v - 2.0).abs() < 1e-12), "{once:?}");
        Ok(())
    })
    .unwrap();
}

/// The global norm propagates a NaN gradient, as PyTorch does, and skips empty gradients.
#[test]
fn clip_grad_norm_propagates_nan_and_skips_empty_gradients() {
    run(1, |ctx| {
        ctx.init_device_mesh(&[1], &["dp"])?;
        manual_seed(0);
        // modules on one rank, as built (local tensors)
        let lin = Linear::<f64>::new(2, 2, false)?;
        let x = DTensor::local_tensor(ArrayD::from_elem(vec![1, 2], f64::NAN));
        lin.forward(&x)?.sum()?.backward()?;
        assert!(clip_grad_norm(&lin, 1.0, f64::INFINITY)?.is_nan());
        assert!(clip_grad_norm(&lin, 1.0, 2.0)?.is_nan());
        struct One(DTensor<f64>);
        impl Module<f64> for One {
            fn named_parameters(&self) -> Vec<(String, &DTensor<f64>)> {
                vec![("p".into(), &self.0)]
            }
            fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<f64>)> {
                vec![("p".into(), &mut self.0)]
            }
        }
        let empty = One(DTensor::local_tensor(ArrayD::<f64>::zeros(vec![0, 3])).requires_grad_(true));
        empty.0.set_grad(&DTensor::local_tensor(ArrayD::<f64>::zeros(vec![0, 3])))?;
        assert_eq!(clip_grad_norm(&empty, 1.0, f64::INFINITY)?, 0.0);
        assert_eq!(clip_grad_norm(&empty, 1.0, 2.0)?, 0.0);
        Ok(())
    })
    .unwrap();
}

/// `Sequential` prefetches units made with `prefetch`: unit 1's all-gathers are
/// issued before unit 0 computes (its row-parallel w2 all-reduces over tp), and the result is
/// the one without prefetch.
#[test]
fn sequential_prefetches_the_next_unit() {
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let model = blocks(&mesh, Mode::FsdpTp)?;
        let x = distribute_tensor(batch(0), &mesh, &input_placements(Mode::FsdpTp), None)?;
        let rng = dtensor_runtime::rng::rng_state();
        let comm = CommDebugMode::new();
        let y = comm.scope(|| model.forward(&x))?;
        let kinds: Vec<(CollectiveKind, String)> =
            comm.records().iter().map(|r| (r.kind, r.mesh_dim_label().to_string())).collect();
        let first_tp = kinds.iter().position(|k| k.1 == "tp").expect("w2 all-reduces over tp");
        let gathers_before = kinds[..first_tp].iter().filter(|k| k.0 == CollectiveKind::AllGather).count();
        // 5 sharded parameters per block (w1.bias stays replicated on dp): both blocks'
        assert_eq!(gathers_before, 10, "{kinds:?}");
        assert_eq!(comm.count_for_op(CollectiveKind::AllGather, "fsdp_all_gather"), 10);
        // without prefetch, only the first block's before it computes
        let plain = blocks_prefetching(&mesh, Mode::FsdpTp, false)?;
        let comm = CommDebugMode::new();
        comm.scope(|| plain.forward(&x))?;
        let records = comm.records();
        let first_tp = records.iter().position(|r| r.mesh_dim_label() == "tp").expect("w2 all-reduces over tp");
        assert_eq!(records[..first_tp].iter().filter(|r| r.kind == CollectiveKind::AllGather).count(), 5);
        // unit by unit, without prefetch: the same numbers
        dtensor_runtime::rng::set_rng_state(rng);
        let mut h = x.clone();
        for b in &model.0 {
            h = b.call(|m| m.forward(&h))?;
        }
        assert_eq!(y.full_tensor()?, h.full_tensor()?);
        Ok(())
    })
    .unwrap();
}

/// A prefetch from shards an optimizer step has since replaced is not used: the forward
/// gathers the new ones (and equals a forward without prefetch); an explicit prefetch is
/// consumed by one forward only.
#[test]
fn a_stale_prefetch_is_gathered_again() {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        let mut model = blocks(&mesh, Mode::Fsdp)?;
        let x = distribute_tensor(batch(0), &mesh, &[Shard(0)], None)?;
        let h = model.forward(&x)?;
        h.mul(&h)?.mean()?.backward()?;
        model.0[0].unshard_async()?;
        AdamW::new(1e-1).step(&mut model)?; // replaces every shard
        let rng = dtensor_runtime::rng::rng_state();
        let comm = CommDebugMode::new();
        let fresh = comm.scope(|| model.0[0].forward(&x))?;
        assert_eq!(comm.count(CollectiveKind::AllGather), 6, "gathered again from the stepped shards");
        dtensor_runtime::rng::set_rng_state(rng);
        let again = model.0[0].forward(&x)?;
        assert_eq!(fresh.full_tensor()?, again.full_tensor()?);
        // a fresh prefetch is used once: the forward after it gathers nothing, the next does
        model.0[0].unshard_async()?;
        let comm = CommDebugMode::new();
        comm.scope(|| model.0[0].forward(&x))?;
        assert_eq!(comm.count(CollectiveKind::AllGather), 0);
        comm.scope(|| model.0[0].forward(&x))?;
        assert_eq!(comm.count(CollectiveKind::AllGather), 6);
        Ok(())
    })
    .unwrap();
}

/// A rank that fails while its peers prefetch ends every peer with its error, no hang.
#[test]
fn a_rank_failing_during_a_prefetch_ends_every_peer() {
    let start = std::time::Instant::now();
    let r = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["dp"])?;
        let model = blocks(&mesh, Mode::Fsdp)?;
        let x = distribute_tensor(batch(0), &mesh, &[Shard(0)], None)?;
        if mesh.rank() == 2 {
            return Err(Error::InvalidArgument { context: "test".into(), reason: "injected failure".into() });
        }
        model.forward(&x).map(|_| ())
    });
    let e = r.expect_err("the step cannot succeed");
    assert!(e.to_string().contains("injected failure"), "{e}");
    assert!(start.elapsed() < std::time::Duration::from_secs(30), "took {:?}", start.elapsed());
}

/// Prefetched gathers of uneven and empty shards, on dim 0 (4 ranks over 3 rows) and on dim 1
/// under tensor parallelism (5 columns over 2 ranks, the rows split by tp), give the forward
/// of a plain gather bit for bit.
#[test]
fn prefetch_of_uneven_shards_on_any_dim() {
    for (shape, names, colwise) in [(vec![4], vec!["dp"], false), (vec![2, 2], vec!["dp", "tp"], true)] {
        run(4, move |ctx| {
            let mesh = ctx.init_device_mesh(&shape, &names)?;
            manual_seed(3);
            let mut lin = Linear::<f64>::new(5, 3 + usize::from(colwise), true)?;
            if colwise {
                let col = ColwiseParallel::new();
                lin = parallelize_module(lin, &mesh, &[("", &col as &dyn ParallelStyle)])?;
            }
            let lin = fully_shard(lin, &mesh, &FullyShardOptions::on("dp"))?;
            let x = ArrayD::from_shape_vec(vec![4, 5], (0..20).map(|i| (i as f64 / 7.0).sin()).collect()).unwrap();
            let mut pl = vec![Shard(0)];
            pl.resize(shape.len(), Placement::Replicate);
            let x = distribute_tensor(&x, &mesh, &pl, None)?;
            let plain = lin.forward(&x)?.full_tensor()?;
            lin.unshard_async()?;
            let comm = CommDebugMode::new();
            let prefetched = comm.scope(|| lin.forward(&x))?;
            assert_eq!(comm.count(CollectiveKind::AllGather), 0, "the forward used the prefetch");
            assert_eq!(prefetched.full_tensor()?, plain);
            Ok(())
        })
        .unwrap();
    }
}

/// Backward prefetch of resharding units: unit 1's backward starts unit 0's gathers before its
/// own gradients are reduce-scattered, unit 0's backward then gathers nothing itself; the
/// gradients are those without prefetch, bit for bit.
#[test]
fn resharding_backward_prefetches_the_unit_before() {
    let grads = |prefetch: bool| {
        run(4, move |ctx| {
            let mesh = ctx.init_device_mesh(&[4], &["dp"])?;
            let model = blocks_prefetching(&mesh, Mode::FsdpReshard, prefetch)?;
            let x = distribute_tensor(batch(0), &mesh, &[Shard(0)], None)?;
            let h = model.forward(&x)?;
            let loss = h.mul(&h)?.mean()?;
            let comm = CommDebugMode::new();
            comm.scope(|| loss.backward())?;
            let records = comm.records();
            let first_rs =
                records.iter().position(|r| r.kind == CollectiveKind::ReduceScatter).expect("reduce-scatters");
            let gathers_before = records[..first_rs].iter().filter(|r| r.kind == CollectiveKind::AllGather).count();
            let g: Vec<Vec<f64>> = model
                .named_parameters()
                .into_iter()
                .map(|(_, p)| p.grad().unwrap().full_tensor().map(|a| a.iter().copied().collect()))
                .collect::<Result<_>>()?;
            Ok((g, gathers_before, comm.count(CollectiveKind::AllGather)))
        })
        .unwrap()
        .remove(0)
    };
    let (plain, before_plain, total_plain) = grads(false);
    let (ahead, before_ahead, total_ahead) = grads(true);
    assert_eq!((before_plain, total_plain), (6, 12), "without prefetch: unit 1's own gathers first");
    assert_eq!((before_ahead, total_ahead), (12, 12), "with prefetch: unit 0's too");
    assert_eq!(ahead, plain);
}

/// Resharding to groups with uneven and empty slices: three linear units of shapes `[3, 5]`,
/// `[1, 3]`, `[7, 1]` (and their biases) on dp = 8 kept by groups of 4 and of 2, with and
/// without prefetch, give the one-rank gradients.
#[test]
fn resharding_to_a_group_with_uneven_and_empty_slices() {
    let grads = |world: usize, group: Option<usize>, prefetch: bool| {
        run(world, move |ctx| {
            let mesh = ctx.init_device_mesh(&[world], &["dp"])?;
            manual_seed(11);
            let units = [(5, 3), (3, 1), (1, 7)]
                .iter()
                .enumerate()
                .map(|(i, &(fan_in, fan_out))| {
                    let opts = FullyShardOptions::on("dp").named(&format!("layers.{i}")).prefetch(prefetch);
                    let opts = match group {
                        Some(g) => opts.reshard_after_forward_to(g),
                        None => opts,
                    };
                    fully_shard(Linear::<f64>::new(fan_in, fan_out, true)?, &mesh, &opts)
                })
                .collect::<Result<Vec<_>>>()?;
            let model = Sequential(units);
            let x = ArrayD::from_shape_fn(vec![8, 5], |i| ((i[0] * 5 + i[1]) % 9) as f64 / 9.0 - 0.4);
            let x = distribute_tensor(&x, &mesh, &[Shard(0)], None)?;
            let y = model.forward(&x)?;
            y.mul(&y)?.sum()?.backward()?;
            model
                .named_parameters()
                .into_iter()
                .map(|(_, p)| Ok(p.grad().unwrap().full_tensor()?.iter().copied().collect::<Vec<f64>>()))
                .collect::<Result<Vec<_>>>()
        })
        .unwrap()
        .remove(0)
    };
    let reference = grads(1, None, false);
    for (group, prefetch) in [(4, false), (2, false), (4, true), (2, true)] {
        let got = grads(8, Some(group), prefetch);
        for (a, b) in got.iter().zip(&reference) {
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
            assert!(worst < 1e-12, "groups of {group}, prefetch {prefetch}: {worst:e}");
        }
    }
}
