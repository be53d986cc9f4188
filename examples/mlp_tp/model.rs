//! The model of the `mlp_tp` example, shared with `benches/mlp_step.rs`: a stack of
//! Megatron MLP blocks `x + gelu(x @ w1) @ w2` declared with `#[distribute]`: `w1`
//! column-parallel, `w2` row-parallel over the mesh dim `tp`. Trained by SGD towards a fixed
//! random teacher of the same shape.
//!
//! The layouts are checked at compile time: `block_forward` only compiles because every op in
//! it is legal for the declared placements (see `examples/compile_time.rs` for one that is not).

use dtensor::distribute;
use dtensor::optim::Sgd;
use dtensor::prelude::*;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::{Dt, Sum};
use dtensor::{local_mesh, manual_seed, rand, randn};
use ndarray::ArrayD;

/// Seed offset of the teacher network, so that teacher and student differ.
const TEACHER_SEED: u64 = 0x7eac_4e12;

/// Sizes and training knobs.
#[derive(Debug, Clone, Copy)]
pub struct MlpConfig {
    /// Samples per step (global batch, sharded over dp).
    pub batch: usize,
    /// Width of each block's input and output.
    pub dim: usize,
    /// Hidden width (sharded over tp).
    pub hidden: usize,
    /// Number of blocks.
    pub layers: usize,
    /// SGD learning rate.
    pub lr: f32,
    /// Seed of the student's initialisation and of the data.
    pub seed: u64,
}

/// One Megatron MLP block (no biases): `w1: [dim, hidden]`, `w2: [hidden, dim]`.
#[distribute(mesh = "dp,tp")]
pub struct Block {
    /// Column parallel: each tp rank holds a slice of the hidden features.
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f32>,
    /// Row parallel: the matching slice of the hidden features, as rows.
    #[placements = [Replicate, Shard(0)]]
    pub w2: DTensor<f32>,
}

/// `x + gelu(x @ w1) @ w2` on a batch sharded over dp. Every layout below is computed and
/// checked by the type system; the one collective is the redistribution of the Partial output
/// of `@ w2` to the declared result layout (an all-reduce over tp).
// The macro turns the result into `Result<Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>>`.
#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
pub fn block_forward(x: &DTensor<f32>, block: &Block) -> Result<DTensor<f32>> {
    let h: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = x.matmul(&block.w1)?.gelu()?;
    let y: Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2> = h.matmul(&block.w2)?;
    let y: Dt<f32, (dp, tp), (Shard<0>, Replicate), 2> = y.redistribute()?;
    x.add(&y)
}

/// Global `[rows, cols]` weight, uniform in `±1/√rows` (PyTorch's Linear init for a fan-in of
/// `rows`), from the counter-based generator (same values on every rank).
fn init_weight(rows: usize, cols: usize) -> Result<ArrayD<f32>> {
    let bound = 1.0 / (rows as f32).sqrt();
    let u = rand::<f32>(&[rows, cols], &TensorOptions::new().mesh(&local_mesh()))?;
    Ok(u.to_host()?.mapv(|v| (2.0 * v - 1.0) * bound))
}

/// A stack of blocks: the macro makes every block's weights parameters of the stack
/// (`blocks.0.w1`, ...), with the generated `Module` impl.
#[distribute(mesh = "dp,tp")]
pub struct Mlp {
    blocks: Vec<Block>,
}

impl Mlp {
    /// Draws the global weights (call `manual_seed` first) and distributes them over `mesh`
    /// (the generated `Mlp::distribute` makes them leaves that require grad).
    fn new(cfg: &MlpConfig, mesh: &DeviceMesh) -> Result<Mlp> {
        let blocks = (0..cfg.layers)
            .map(|_| Ok(BlockGlobal { w1: init_weight(cfg.dim, cfg.hidden)?, w2: init_weight(cfg.hidden, cfg.dim)? }))
            .collect::<Result<_>>()?;
        Mlp::distribute(MlpGlobal { blocks }, mesh)
    }

    /// The forward pass on a batch laid out `(Shard(0), Replicate)`.
    pub fn forward(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> {
        let mut h: Dt<f32, (dp, tp), (Shard<0>, Replicate), 2> = Dt::from_dtensor(x.clone())?;
        for b in &self.blocks {
            h = block_forward(&h, b)?;
        }
        Ok(h.into_dtensor())
    }
}

/// Student, teacher and optimizer on one rank of a mesh with dims `dp` and `tp`.
pub struct Trainer {
    pub student: Mlp,
    teacher: Mlp,
    opt: Sgd<f32>,
    data: TensorOptions,
    cfg: MlpConfig,
}

impl Trainer {
    /// Builds both networks (collective: every rank of `mesh` calls it).
    pub fn new(mesh: &DeviceMesh, cfg: MlpConfig) -> Result<Trainer> {
        manual_seed(cfg.seed.wrapping_add(TEACHER_SEED));
        let teacher = Mlp::new(&cfg, mesh)?;
        manual_seed(cfg.seed);
        let student = Mlp::new(&cfg, mesh)?;
        let data = TensorOptions::new().mesh(mesh).placements(&[Shard(0), Replicate]);
        Ok(Trainer { student, teacher, opt: Sgd::new(cfg.lr), data, cfg })
    }

    /// A fresh batch `x` (`[batch, dim]`, `(Shard(0), Replicate)`) and the teacher's output
    /// for it. `randn` is placement-invariant: the same global batch whatever the mesh.
    pub fn batch(&self) -> Result<(DTensor<f32>, DTensor<f32>)> {
        let x = randn::<f32>(&[self.cfg.batch, self.cfg.dim], &self.data)?;
        let y = no_grad(|| self.teacher.forward(&x))?;
        Ok((x, y))
    }

    /// One SGD step of the student on `(x, y)`; returns the loss (its placements depend on the
    /// mesh: read it with `full_tensor`, outside any `CommDebugMode` that should not count it).
    pub fn train_step(&mut self, x: &DTensor<f32>, y: &DTensor<f32>) -> Result<DTensor<f32>> {
        self.student.zero_grad();
        let loss = self.student.forward(x)?.mse_loss(y)?;
        loss.backward()?;
        self.opt.step(&mut self.student)?;
        Ok(loss)
    }
}
