//! `fully_shard_mixed` (PyTorch FSDP2's `MixedPrecisionPolicy`): masters in one dtype, the
//! module computing in another. With both f64 the nested graph must give the one-rank run
//! exactly (FSDP, HSDP, FSDP × TP, resharding, accumulation without sync); with bf16 compute
//! and f32 masters it follows the f32 run to bf16's precision while its all-gathers move half
//! the bytes.

use dtensor_runtime::fsdp::{fully_shard, fully_shard_mixed, FullyShardMixed, FullyShardOptions, OptimizerMemory};
use dtensor_runtime::module::{
    parallelize_module, prefixed, prefixed_mut, ColwiseParallel, Forward, Linear, Module, ParallelStyle,
    RowwiseParallel, Sequential,
};
use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::optim::{clip_grad_norm, AdamW};
use dtensor_runtime::{
    bf16, distribute_tensor, manual_seed, run, CollectiveKind, CommDebugMode, DTensor, DType, DeviceMesh, Element,
    Error, Placement, Result, Shard,
};

mod fsdp_util;

use fsdp_util::Block;

const DIM: usize = 6;
const HIDDEN: usize = 10;
const BATCH: usize = 8;

fn batch<T: Element>(step: usize) -> ArrayD<T> {
    ArrayD::from_shape_fn(vec![BATCH, DIM], |i| {
        T::of_f64((((i[0] * DIM + i[1]) * 7 + step * 13) % 17) as f64 / 9.0 - 0.9)
    })
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mesh {
    /// One rank, plain `fully_shard`: the reference.
    Reference,
    Fsdp4,
    /// `rep × dp`, sharded over dp.
    Hsdp,
    /// `dp × tp`, colwise w1 and rowwise w2 over tp.
    FsdpTp,
}

impl Mesh {
    fn world(self) -> usize {
        if self == Mesh::Reference {
            1
        } else {
            4
        }
    }
    fn shape(self) -> (Vec<usize>, Vec<&'static str>) {
        match self {
            Mesh::Reference => (vec![1], vec!["dp"]),
            Mesh::Fsdp4 => (vec![4], vec!["dp"]),
            Mesh::Hsdp => (vec![2, 2], vec!["rep", "dp"]),
            Mesh::FsdpTp => (vec![2, 2], vec!["dp", "tp"]),
        }
    }
    fn input(self) -> Vec<Placement> {
        match self {
            Mesh::Reference | Mesh::Fsdp4 => vec![Shard(0)],
            Mesh::Hsdp => vec![Shard(0), Shard(0)],
            Mesh::FsdpTp => vec![Shard(0), Placement::Replicate],
        }
    }
}

/// Two blocks in `C`, each a mixed unit with masters in `S`.
fn mixed_blocks<S: Element, C: Element>(
    mesh: &DeviceMesh,
    tp: bool,
    opts: &FullyShardOptions,
) -> Result<Sequential<FullyShardMixed<S, C, Block<C>>>> {
    manual_seed(7);
    let units = (0..2)
        .map(|i| {
            let mut b = Block::<C>::new(DIM, HIDDEN)?;
            if tp {
                let (col, row) = (ColwiseParallel::new(), RowwiseParallel::new());
                let plan: Vec<(&str, &dyn ParallelStyle)> = vec![("w1", &col), ("w2", &row)];
                b = parallelize_module(b, mesh, &plan)?;
            }
            fully_shard_mixed::<S, C, _>(b, mesh, &opts.clone().named(&format!("blocks.{i}")).prefetch(true))
        })
        .collect::<Result<_>>()?;
    Ok(Sequential(units))
}

struct Trained {
    losses: Vec<f64>,
    norms: Vec<f64>,
    weights: Vec<(String, Vec<f64>)>,
}

/// Three AdamW steps (clipping the global norm to 0.45) of a model made by `build`.
fn train<M: Module<f64> + Forward<f64>>(
    mesh: Mesh,
    build: impl Fn(&DeviceMesh) -> Result<M> + Send + Sync + 'static,
) -> Trained {
    let mut out = run(mesh.world(), move |ctx| {
        let (shape, names) = mesh.shape();
        let dmesh = ctx.init_device_mesh(&shape, &names)?;
        let mut model = build(&dmesh)?;
        let mut opt = AdamW::new(1e-2).weight_decay(0.01);
        let (mut losses, mut norms) = (vec![], vec![]);
        for step in 0..3 {
            let x = distribute_tensor(batch::<f64>(step), &dmesh, &mesh.input(), None)?;
            let h = model.forward(&x)?;
            let loss = h.mul(&h)?.mean()?;
            loss.backward()?;
            losses.push(loss.full_tensor()?.iter().copied().next().unwrap());
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
    out.remove(0)
}

fn assert_close(run: &Trained, reference: &Trained, what: &str) {
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
    assert!(reference.losses[2] < reference.losses[0], "the reference does not learn: {:?}", reference.losses);
    for (a, b) in run.losses.iter().zip(&reference.losses).chain(run.norms.iter().zip(&reference.norms)) {
        assert!(rel(*a, *b) < 1e-12, "{what}: {a} vs reference {b}");
    }
    assert_eq!(run.weights.len(), reference.weights.len());
    for ((n, a), (m, b)) in run.weights.iter().zip(&reference.weights) {
        assert_eq!(n, m);
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-12, "{what}: {n} differs by {worst:e}");
    }
}

/// Masters and compute both in f64: the nested graph (sinks, the unit's own reduction) gives
/// the one-rank run of plain `fully_shard`, on every mesh, with and without resharding (to the
/// whole dim or to groups of 2), with prefetch.
#[test]
fn mixed_units_in_one_dtype_train_as_one_rank() {
    let reference = train(Mesh::Reference, |mesh| {
        manual_seed(7);
        let units = (0..2)
            .map(|i| {
                fully_shard(
                    Block::<f64>::new(DIM, HIDDEN)?,
                    mesh,
                    &FullyShardOptions::on("dp").named(&format!("blocks.{i}")),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Sequential(units))
    });
    // reshard: 0 no, 1 to the whole dp dim, 2 to groups of 2 of the 4 dp ranks
    for (mesh, reshard) in
        [(Mesh::Fsdp4, 0), (Mesh::Fsdp4, 1), (Mesh::Fsdp4, 2), (Mesh::Hsdp, 0), (Mesh::FsdpTp, 0), (Mesh::FsdpTp, 1)]
    {
        let run = train(mesh, move |m| {
            let opts = match reshard {
                0 => FullyShardOptions::on("dp"),
                1 => FullyShardOptions::on("dp").reshard_after_forward(true),
                g => FullyShardOptions::on("dp").reshard_after_forward_to(g),
            };
            mixed_blocks::<f64, f64>(m, mesh == Mesh::FsdpTp, &opts)
        });
        assert_close(&run, &reference, &format!("{mesh:?}, reshard {reshard}"));
    }
}

/// bf16 compute, f32 masters: the losses follow the f32 one-rank run to bf16's precision; the
/// all-gathers move bf16 (half the f32 run's bytes); the reduce-scatters move bf16 by default
/// (PyTorch's `reduce_dtype` defaults to `param_dtype`) and f32 when asked; the masters and
/// their gradients rest as f32 shards, and plain AdamW steps them.
#[test]
fn bf16_compute_with_f32_masters() {
    type Out = (Vec<f64>, usize, usize);
    fn steps<S: Element, C: Element>(world: usize, reduce: Option<DType>) -> Out {
        run(world, move |ctx| {
            let mesh = ctx.init_device_mesh(&[world], &["dp"])?;
            let mut opts = FullyShardOptions::on("dp");
            opts.reduce_dtype = reduce;
            let mut model = mixed_blocks::<S, C>(&mesh, false, &opts)?;
            let mut opt = AdamW::<S>::new(1e-2);
            let (mut losses, mut gathered, mut reduced) = (vec![], 0, 0);
            for step in 0..5 {
                let x = distribute_tensor(batch::<S>(step), &mesh, &[Shard(0)], None)?;
                model.zero_grad();
                let comm = CommDebugMode::new();
                let loss = comm.scope(|| -> Result<DTensor<S>> {
                    let h = model.forward(&x)?;
                    let loss = h.mul(&h)?.mean()?;
                    loss.backward()?;
                    Ok(loss)
                })?;
                let by_kind = comm.by_kind();
                gathered = by_kind.get(&(CollectiveKind::AllGather, "dp".to_string())).map_or(0, |c| c.1);
                reduced = by_kind.get(&(CollectiveKind::ReduceScatter, "dp".to_string())).map_or(0, |c| c.1);
                losses.push(loss.full_tensor()?.iter().next().map_or(f64::NAN, |v| v.as_f64()));
                for (name, p) in model.named_parameters() {
                    let g = p.grad().expect("every master has a gradient");
                    assert_eq!(g.placements(), p.placements(), "{name}");
                }
                opt.step(&mut model)?;
            }
            Ok((losses, gathered, reduced))
        })
        .unwrap()
        .remove(0)
    }
    let (reference, _, _) = steps::<f32, f32>(1, None);
    let (_, f32_gathered, f32_reduced) = steps::<f32, f32>(2, None);
    let (mixed, gathered, reduced) = steps::<f32, bf16>(2, None);
    let (mixed_f32_reduce, _, reduced_in_f32) = steps::<f32, bf16>(2, Some(DType::F32));
    assert!(reference[4] < reference[0], "{reference:?}");
    for run in [&mixed, &mixed_f32_reduce] {
        for (a, b) in run.iter().zip(&reference) {
            assert!((a - b).abs() <= 3e-2 * b.abs(), "bf16 compute {a} vs f32 {b}: {run:?} vs {reference:?}");
        }
    }
    assert!(f32_gathered > 0 && f32_reduced > 0);
    assert_eq!(gathered * 2, f32_gathered, "the all-gathers move bf16");
    assert_eq!(reduced * 2, f32_reduced, "the reduce-scatters move bf16 by default");
    assert_eq!(reduced_in_f32, f32_reduced, "reduce_dtype f32: the reduce-scatters move f32");
}

/// Two micro-batches without sync and one with: the masters' gradients are the sum over the
/// three, reduce-scattered once; resharding gives the same gradients bit for bit.
#[test]
fn mixed_accumulation_without_sync_and_resharding() {
    let grads = |world: usize, sync_each: bool, reshard: bool| {
        run(world, move |ctx| {
            let mesh = ctx.init_device_mesh(&[world], &["dp"])?;
            let opts = FullyShardOptions::on("dp").reshard_after_forward(reshard);
            let model = mixed_blocks::<f64, f64>(&mesh, false, &opts)?;
            let mut counts = vec![];
            for step in 0..3 {
                for u in &model.0 {
                    u.set_requires_gradient_sync(sync_each || step == 2);
                }
                let x = distribute_tensor(batch::<f64>(step), &mesh, &[Shard(0)], None)?;
                let comm = CommDebugMode::new();
                comm.scope(|| -> Result<()> {
                    let h = model.forward(&x)?;
                    h.mul(&h)?.mean()?.backward()
                })?;
                counts.push((comm.count(CollectiveKind::AllGather), comm.count(CollectiveKind::ReduceScatter)));
            }
            let g: Vec<Vec<f64>> = model
                .named_parameters()
                .into_iter()
                .map(|(_, p)| p.grad().unwrap().full_tensor().map(|a| a.iter().copied().collect()))
                .collect::<Result<_>>()?;
            Ok((g, counts))
        })
        .unwrap()
        .remove(0)
    };
    let (every, _) = grads(1, true, false);
    let (accumulated, counts) = grads(4, false, false);
    // 12 sharded parameters (w1.bias [10] and every other over 4 ranks): gathered each forward
    assert_eq!(counts, vec![(12, 0), (12, 0), (12, 12)]);
    for (a, b) in accumulated.iter().zip(&every) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-12, "{x} vs {y}");
        }
    }
    let (resharded, counts) = grads(4, false, true);
    assert_eq!(counts, vec![(24, 0), (24, 0), (24, 12)], "resharding gathers again in the backward");
    assert_eq!(resharded, accumulated);
}

/// `unshard` keeps the gathered bf16 parameters: later forwards gather nothing; the memory
/// plan counts the window in bf16 and the masters in f32.
#[test]
fn mixed_unshard_and_memory_plan() {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        let model = mixed_blocks::<f32, bf16>(&mesh, false, &FullyShardOptions::on("dp"))?;
        let unit = &model.0[0];
        let x = distribute_tensor(batch::<f32>(0), &mesh, &[Shard(0)], None)?;
        let rng = dtensor_runtime::rng::rng_state();
        let plain = unit.forward(&x)?.full_tensor()?;
        unit.unshard()?;
        let comm = CommDebugMode::new();
        dtensor_runtime::rng::set_rng_state(rng);
        let again = comm.scope(|| unit.forward(&x))?;
        assert_eq!(comm.count(CollectiveKind::AllGather), 0);
        assert_eq!(again.full_tensor()?, plain);
        again.sum()?.backward()?;
        assert!(unit.named_parameters().iter().all(|(_, p)| p.grad().is_some()));
        unit.reshard();
        let plan = unit.memory_plan(OptimizerMemory::adamw(DType::F32))?;
        let elements: usize =
            unit.named_parameters().iter().map(|(_, p)| p.local().shape().iter().product::<usize>()).sum();
        assert_eq!(plan.parameters, elements * 4, "f32 masters");
        assert_eq!(plan.optimizer_states, elements * 8);
        // gathered: every parameter whole (each is sharded over dp), in bf16
        let whole: usize = unit.named_parameters().iter().map(|(_, p)| p.shape().iter().product::<usize>()).sum();
        assert_eq!(plan.unsharded_window, whole * 2);
        Ok(())
    })
    .unwrap();
}

/// A module with buffers, and a master replaced by another layout: typed errors naming the
/// module and what is wrong.
#[test]
fn mixed_bad_input_is_a_typed_error() {
    #[derive(Clone)]
    struct WithBuffer {
        lin: Linear<bf16>,
        scale: DTensor<bf16>,
    }
    impl Module<bf16> for WithBuffer {
        fn named_parameters(&self) -> Vec<(String, &DTensor<bf16>)> {
            prefixed("lin", self.lin.named_parameters())
        }
        fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<bf16>)> {
            prefixed_mut("lin", self.lin.named_parameters_mut())
        }
        fn named_buffers(&self) -> Vec<(String, &DTensor<bf16>)> {
            vec![("scale".into(), &self.scale)]
        }
    }
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        let scale =
            distribute_tensor(ArrayD::from_elem(vec![4], bf16::from_f32(1.0)), &mesh, &[Placement::Replicate], None)?;
        let m = WithBuffer { lin: Linear::new(4, 4, false)?, scale };
        let e = fully_shard_mixed::<f32, bf16, _>(m, &mesh, &FullyShardOptions::on("dp").named("scaled")).err();
        match e {
            Some(Error::FullyShard { module, reason }) => {
                assert_eq!(module, "scaled");
                assert!(reason.contains("buffer `scale`"), "{reason}");
            }
            other => panic!("expected FullyShard, got {other:?}"),
        }
        let mut lin =
            fully_shard_mixed::<f32, bf16, _>(Linear::new(4, 4, false)?, &mesh, &FullyShardOptions::on("dp"))?;
        let replicated = lin.named_parameters()[0].1.redistribute(&[Placement::Replicate])?;
        *lin.named_parameters_mut()[0].1 = replicated;
        let x = distribute_tensor(ArrayD::from_elem(vec![2, 4], 1.0f32), &mesh, &[Shard(0)], None)?;
        match lin.forward(&x).err() {
            Some(Error::FullyShard { module, reason }) => {
                assert_eq!(module, "Linear");
                assert!(reason.contains("`weight`") && reason.contains("replaced"), "{reason}");
            }
            other => panic!("expected FullyShard, got {other:?}"),
        }
        Ok(())
    })
    .unwrap();
}

/// A mixed unit keeps its nested graph for a retained outer pass (the second backward adds
/// the same gradients again), and `unshard` completes a prefetch instead of gathering twice.
#[test]
fn mixed_retain_graph_and_unshard_after_prefetch() {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
        manual_seed(1);
        let lin = fully_shard_mixed::<f64, f64, _>(Linear::new(4, 4, true)?, &mesh, &FullyShardOptions::on("dp"))?;
        let x = distribute_tensor(
            ArrayD::from_shape_fn(vec![4, 4], |i| (i[0] * 4 + i[1]) as f64 / 9.0),
            &mesh,
            &[Shard(0)],
            None,
        )?;
        let loss = lin.forward(&x)?.sum()?;
        loss.backward_retaining_graph()?;
        let once = lin.named_parameters()[0].1.grad().unwrap().full_tensor()?;
        loss.backward()?;
        let twice = lin.named_parameters()[0].1.grad().unwrap().full_tensor()?;
        assert_eq!(twice, once.mapv(|v| 2.0 * v));
        lin.unshard_async()?;
        let comm = CommDebugMode::new();
        comm.scope(|| lin.unshard())?;
        assert_eq!(comm.count(CollectiveKind::AllGather), 0, "unshard completes the prefetch");
        lin.reshard();
        Ok(())
    })
    .unwrap();
}
