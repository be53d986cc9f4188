//! The model of the `mlp_tp` example, shared with `benches/mlp_step.rs`: a stack of
//! Megatron MLP blocks `x + w2(gelu(w1(x)))`, `w1` column-parallel and `w2` row-parallel
//! over the mesh dim `tp`, trained by SGD towards a fixed random teacher of the same shape.

use dtensor::module::{parallelize_module, prefixed, prefixed_mut, ColwiseParallel, LayerHooks, Linear};
use dtensor::module::{ParallelStyle, RowwiseParallel};
use dtensor::optim::Sgd;
use dtensor::prelude::*;
use dtensor::{manual_seed, randn};

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

/// One Megatron MLP block: `x + w2(gelu(w1(x)))`.
pub struct Block {
    w1: Linear<f32>,
    w2: Linear<f32>,
}

/// A stack of blocks.
pub struct Mlp {
    blocks: Vec<Block>,
}

impl Mlp {
    /// Local (1-rank) parameters drawn from the counter-based generator: call
    /// `manual_seed` with the same seed on every rank first.
    fn new(cfg: &MlpConfig) -> Result<Mlp> {
        let blocks = (0..cfg.layers)
            .map(|_| {
                Ok(Block { w1: Linear::new(cfg.dim, cfg.hidden, true)?, w2: Linear::new(cfg.hidden, cfg.dim, true)? })
            })
            .collect::<Result<_>>()?;
        Ok(Mlp { blocks })
    }
}

impl Module<f32> for Mlp {
    fn named_parameters(&self) -> Vec<(String, &DTensor<f32>)> {
        let mut v = Vec::new();
        for (i, b) in self.blocks.iter().enumerate() {
            v.extend(prefixed(&format!("blocks.{i}.w1"), b.w1.named_parameters()));
            v.extend(prefixed(&format!("blocks.{i}.w2"), b.w2.named_parameters()));
        }
        v
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<f32>)> {
        let mut v = Vec::new();
        for (i, b) in self.blocks.iter_mut().enumerate() {
            v.extend(prefixed_mut(&format!("blocks.{i}.w1"), b.w1.named_parameters_mut()));
            v.extend(prefixed_mut(&format!("blocks.{i}.w2"), b.w2.named_parameters_mut()));
        }
        v
    }
    fn layer_hooks_mut(&mut self, path: &str) -> Option<&mut LayerHooks> {
        let rest = path.strip_prefix("blocks.")?;
        let (i, layer) = rest.split_once('.')?;
        let b = self.blocks.get_mut(i.parse::<usize>().ok()?)?;
        match layer {
            "w1" => b.w1.layer_hooks_mut(""),
            "w2" => b.w2.layer_hooks_mut(""),
            _ => None,
        }
    }
}

impl Forward<f32> for Mlp {
    fn forward(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> {
        let mut h = x.clone();
        for b in &self.blocks {
            h = h.add(&b.w2.forward(&b.w1.forward(&h)?.gelu()?)?)?;
        }
        Ok(h)
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
        let teacher = parallelize_module(Mlp::new(&cfg)?, mesh, &[])?;
        manual_seed(cfg.seed);
        let student = Mlp::new(&cfg)?;
        let (colwise, rowwise) = (ColwiseParallel::new().mesh_dim("tp"), RowwiseParallel::new().mesh_dim("tp"));
        let paths: Vec<(String, String)> =
            (0..cfg.layers).map(|i| (format!("blocks.{i}.w1"), format!("blocks.{i}.w2"))).collect();
        let mut plan: Vec<(&str, &dyn ParallelStyle)> = Vec::new();
        for (w1, w2) in &paths {
            plan.push((w1, &colwise));
            plan.push((w2, &rowwise));
        }
        let student = parallelize_module(student, mesh, &plan)?;
        let data = TensorOptions::new().mesh(mesh).placements(&[Shard(0), Replicate]);
        Ok(Trainer { student, teacher, opt: Sgd::new(cfg.lr), data, cfg })
    }

    /// One SGD step on a fresh batch; returns the loss (its placements depend on the mesh;
    /// read it with `full_tensor`, outside any `CommDebugMode` that should not count it).
    pub fn step(&mut self) -> Result<DTensor<f32>> {
        // The same global batch whatever the mesh: randn is placement-invariant.
        let x = randn::<f32>(&[self.cfg.batch, self.cfg.dim], &self.data)?;
        let y = no_grad(|| self.teacher.forward(&x))?;
        self.student.zero_grad();
        let loss = self.student.forward(&x)?.mse_loss(&y)?;
        loss.backward()?;
        self.opt.step(&mut self.student)?;
        Ok(loss)
    }
}
