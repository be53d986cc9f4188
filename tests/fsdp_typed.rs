//! FSDP inside the DSL: a `#[distribute]` model whose blocks are `Fsdp<_, Block, dp>` fields
//! (each block its own FSDP unit) trains as the same
//! model with plain blocks on one rank; the blocks are reachable only gathered (`call`), with
//! the layouts their types declare; optimizers and checkpoints see the shards, and
//! `fsdp = "dp"` gives them as types (`BlockShards`, `Fsdp::shards`).

use dtensor::fsdp::FullyShardOptions;
use dtensor::module::Module;
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::optim::AdamW;
use dtensor::prelude::*;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::{Dt, Fsdp, Sum};
use dtensor::{distribute, CollectiveKind, CommDebugMode, Placement, Replicate, Shard};

#[distribute(mesh = "dp,tp", fsdp = "dp")]
#[derive(Clone)]
pub struct Block {
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f64>,
    #[placements = [Replicate, Shard(0)]]
    pub w2: DTensor<f64>,
}

/// The blocks as plain fields: every dp rank holds every parameter.
#[distribute(mesh = "dp,tp", elem = f64)]
pub struct Plain {
    pub blocks: Vec<Block>,
}

/// The blocks fully sharded over dp, one FSDP unit each.
#[distribute(mesh = "dp,tp", elem = f64)]
pub struct Sharded {
    pub blocks: Vec<Fsdp<f64, Block, dp>>,
}

type X = Dt<f64, (dp, tp), (Shard<0>, Replicate), 2>;

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn block_forward(x: &DTensor<f64>, b: &Block) -> Result<DTensor<f64>> {
    let h: Dt<f64, (dp, tp), (Shard<0>, Shard<1>), 2> = x.matmul(&b.w1)?.gelu()?;
    let y: Dt<f64, (dp, tp), (Shard<0>, Partial<Sum>), 2> = h.matmul(&b.w2)?;
    x.add(&y.redistribute::<(Shard<0>, Replicate)>()?)
}

fn weight(rows: usize, cols: usize, seed: usize) -> ArrayD<f64> {
    ArrayD::from_shape_fn(IxDyn(&[rows, cols]), |ix| ((ix[0] * 7 + ix[1] * 3 + seed) % 11) as f64 / 11.0 - 0.45)
}

fn globals() -> Vec<BlockGlobal> {
    (0..3).map(|i| BlockGlobal { w1: weight(6, 10, 2 * i), w2: weight(10, 6, 2 * i + 1) }).collect()
}

fn input(mesh: &DeviceMesh, step: usize) -> Result<X> {
    let x = ArrayD::from_shape_fn(IxDyn(&[8, 6]), |ix| ((ix[0] * 5 + ix[1] + step) % 7) as f64 / 7.0 - 0.4);
    Dt::distribute(&x, mesh)
}

/// Losses and final weights of 3 AdamW steps (weights by name, full).
type Run = (Vec<f64>, Vec<(String, Vec<f64>)>);

fn finish(model: &dyn Module<f64>, losses: Vec<f64>) -> Result<Run> {
    let weights = model
        .named_parameters()
        .into_iter()
        .map(|(n, p)| Ok((n, p.full_tensor()?.iter().copied().collect())))
        .collect::<Result<_>>()?;
    Ok((losses, weights))
}

fn train_plain() -> Run {
    dtensor::run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1, 1], &["dp", "tp"])?;
        let mut model = Plain::distribute(PlainGlobal { blocks: globals() }, &mesh)?;
        let mut opt = AdamW::new(1e-2);
        let mut losses = vec![];
        for step in 0..3 {
            let mut h = input(&mesh, step)?;
            for b in &model.blocks {
                h = block_forward(&h, b)?;
            }
            let loss = h.as_dtensor().mul(h.as_dtensor())?.mean()?;
            loss.backward()?;
            losses.push(loss.full_tensor()?.iter().copied().next().unwrap());
            opt.step(&mut model)?;
            model.zero_grad();
        }
        finish(&model, losses)
    })
    .unwrap()
    .remove(0)
}

fn train_sharded(shape: [usize; 2], reshard: bool) -> Run {
    dtensor::run(shape[0] * shape[1], move |ctx| {
        let mesh = ctx.init_device_mesh(&shape, &["dp", "tp"])?;
        let mut model = Sharded::distribute(ShardedGlobal { blocks: globals() }, &mesh)?;
        if reshard {
            // a typed unit runs closures, which cannot be recomputed: resharding is refused
            let opts = FullyShardOptions::on("dp").reshard_after_forward(true);
            let block = Block::distribute(globals().remove(0), &mesh)?;
            let e = Fsdp::<f64, Block, dp>::with_options(block, &mesh, opts).err().expect("refused");
            assert!(e.to_string().contains("cannot reshard after the forward"), "{e}");
        }
        let mut opt = AdamW::new(1e-2);
        let mut losses = vec![];
        for step in 0..3 {
            let comm = CommDebugMode::new();
            let loss = comm.scope(|| -> Result<DTensor<f64>> {
                let mut h = input(&mesh, step)?;
                for b in &model.blocks {
                    h = b.call(|b| block_forward(&h, b))?;
                }
                let loss = h.as_dtensor().mul(h.as_dtensor())?.mean()?;
                loss.backward()?;
                Ok(loss)
            })?;
            if shape[0] > 1 {
                // each block: 2 all-gathers in the forward, 2 reduce-scatters in the backward
                assert_eq!(comm.count_on(CollectiveKind::AllGather, "dp"), 6);
                assert_eq!(comm.count_on(CollectiveKind::ReduceScatter, "dp"), 6);
                assert_eq!(comm.count_on(CollectiveKind::AllReduce, "dp"), 0);
            }
            losses.push(loss.full_tensor()?.iter().copied().next().unwrap());
            opt.step(&mut model)?;
            model.zero_grad();
        }
        // at rest: the shards, as the declared layouts say
        for (name, p) in model.named_parameters() {
            let declared = model.declared_placements().into_iter().find(|(n, _)| *n == name).unwrap().1;
            assert_eq!(p.placements(), declared.as_slice(), "{name}");
            assert!(matches!(p.placements()[0], Placement::Shard(_)), "{name} rests sharded over dp");
        }
        finish(&model, losses)
    })
    .unwrap()
    .remove(0)
}

#[test]
fn fsdp_fields_train_as_plain_blocks_on_one_rank() {
    let reference = train_plain();
    for (shape, reshard) in [([2, 1], false), ([2, 2], false), ([4, 1], true)] {
        let (losses, weights) = train_sharded(shape, reshard);
        for (a, b) in losses.iter().zip(&reference.0) {
            assert!((a - b).abs() <= 1e-12 * b.abs(), "{shape:?} reshard {reshard}: loss {a} vs {b}");
        }
        assert_eq!(weights.len(), reference.1.len());
        for ((n, a), (m, b)) in weights.iter().zip(&reference.1) {
            assert_eq!(n, m);
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
            assert!(worst < 1e-12, "{shape:?} reshard {reshard}: {n} differs by {worst:e}");
        }
    }
}

/// Two blocks as one unit (a nested module and a `Vec` of them), with their shards as types.
#[distribute(mesh = "dp,tp", elem = f64, fsdp = "dp")]
#[derive(Clone)]
pub struct Pair {
    pub first: Block,
    pub rest: Vec<Block>,
    /// Absent here: its shards are `None`.
    pub extra: Option<Block>,
    /// Compiled out, in the shards struct too.
    #[cfg(any())]
    pub gone: Block,
}

/// `fsdp = "dp"`: `Fsdp::shards` gives each parameter at rest with its resting layout as its
/// type — the column-parallel `w1` `(Replicate, Shard<1>)` in use rests `(Shard<0>, Shard<1>)`,
/// the row-parallel `w2` `(Replicate, Shard<0>)` rests `(Shard<1>, Shard<0>)` — sharing the
/// parameter's storage and gradient (the reduce-scattered shard), nested modules included.
#[test]
fn fsdp_shards_have_their_resting_layouts_as_types() {
    dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let model = Sharded::distribute(ShardedGlobal { blocks: globals() }, &mesh)?;
        let mut h = input(&mesh, 0)?;
        for b in &model.blocks {
            h = b.call(|b| block_forward(&h, b))?;
        }
        h.as_dtensor().mul(h.as_dtensor())?.mean()?.backward()?;
        let shards: BlockShards = model.blocks[1].shards()?;
        let w1: &Dt<f64, (dp, tp), (Shard<0>, Shard<1>), 2> = &shards.w1;
        let w2: &Dt<f64, (dp, tp), (Shard<1>, Shard<0>), 2> = &shards.w2;
        assert_eq!(w1.local().shape(), &[3, 5]); // [6, 10]: rows over dp, columns over tp
        assert_eq!(w2.local().shape(), &[5, 3]); // [10, 6]: columns over dp, rows over tp
        let params = model.blocks[1].named_parameters();
        for ((name, p), shard) in params.iter().zip([w1.as_dtensor(), w2.as_dtensor()]) {
            assert_eq!(p.placements(), shard.placements(), "{name}");
            assert!(std::ptr::eq(p.local_cpu()?.as_ptr(), shard.local_cpu()?.as_ptr()), "{name}: the same storage");
            // the gradient shard, typed as the leaf's gradient
            let (g, mine) = (p.grad().expect("a gradient"), shard.grad().expect("the same gradient"));
            assert_eq!(g.local_cpu()?, mine.local_cpu()?, "{name}");
        }
        let g: Dt<f64, (dp, tp), (Shard<0>, Shard<1>), 2> = w1.grad()?.expect("a gradient shard");
        assert_eq!(g.local().shape(), &[3, 5]);

        // nested: a unit of two blocks
        let pair = Pair::distribute(
            PairGlobal { first: globals().remove(0), rest: globals().into_iter().skip(1).collect(), extra: None },
            &mesh,
        )?;
        let unit: Fsdp<f64, Pair, dp> = Fsdp::new(pair, &mesh)?;
        let shards: PairShards = unit.shards()?;
        let _: &Dt<f64, (dp, tp), (Shard<1>, Shard<0>), 2> = &shards.rest[1].w2;
        assert_eq!(shards.rest.len(), 2);
        assert!(shards.extra.is_none());
        assert_eq!(shards.first.w1.local().shape(), &[3, 5]);
        Ok(())
    })
    .unwrap();
}
