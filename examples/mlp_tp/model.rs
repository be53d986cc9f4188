//! The model of the `mlp_tp` example, shared with `benches/mlp_step.rs`: a stack of
//! Megatron MLP blocks `x + gelu(x @ w1) @ w2` declared with `#[distribute]`: `w1`
//! column-parallel, `w2` row-parallel over the mesh dim `tp`. Trained by SGD towards a fixed
//! random teacher of the same shape.
//!
//! Generic over the element type: `Trainer::new` trains in f32; `Trainer::with_precision`
//! trains a bf16/f16 student (optionally with f32 master weights, f32 gradient reduction and
//! a loss scaler) against the same f32 teacher and data, rounded to the student's type (the
//! teacher's type is a second parameter, f32 by default).
//!
//! The layouts are checked at compile time: `block_forward` only compiles because every op in
//! it is legal for the declared placements (see `examples/compile_time.rs` for one that is not).

use dtensor::checkpoint::{Checkpointer, Restore, Restored, TrainState};
use dtensor::distribute;
use dtensor::optim::{GradScaler, Sgd};
use dtensor::prelude::*;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::{Dt, Sum};
use dtensor::{local_mesh, manual_seed, rand, randn, BackwardOptions, DType, Element};
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
pub struct Block<T: Element> {
    /// Column parallel: each tp rank holds a slice of the hidden features.
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<T>,
    /// Row parallel: the matching slice of the hidden features, as rows.
    #[placements = [Replicate, Shard(0)]]
    pub w2: DTensor<T>,
}

/// `x + gelu(x @ w1) @ w2` on a batch sharded over dp. Every layout below is computed and
/// checked by the type system; the one collective is the redistribution of the Partial output
/// of `@ w2` to the declared result layout (an all-reduce over tp).
// The macro turns the result into `Result<Dt<T, (dp, tp), (Shard<0>, Replicate), 2>>`.
#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
pub fn block_forward<T: Element>(x: &DTensor<T>, block: &Block<T>) -> Result<DTensor<T>> {
    let h: Dt<T, (dp, tp), (Shard<0>, Shard<1>), 2> = x.matmul(&block.w1)?.gelu()?;
    let y: Dt<T, (dp, tp), (Shard<0>, Partial<Sum>), 2> = h.matmul(&block.w2)?;
    let y: Dt<T, (dp, tp), (Shard<0>, Replicate), 2> = y.redistribute()?;
    x.add(&y)
}

/// Global `[rows, cols]` weight, uniform in `±1/√rows` (PyTorch's Linear init for a fan-in of
/// `rows`), from the counter-based generator (same values on every rank), drawn in f32 and
/// rounded to `T`.
fn init_weight<T: Element>(rows: usize, cols: usize) -> Result<ArrayD<T>> {
    let bound = 1.0 / (rows as f32).sqrt();
    let u = rand::<f32>(&[rows, cols], &TensorOptions::new().mesh(&local_mesh()))?;
    Ok(u.to_host()?.mapv(|v| T::of_f64(((2.0 * v - 1.0) * bound) as f64)))
}

/// A stack of blocks: the macro makes every block's weights parameters of the stack
/// (`blocks.0.w1`, ...), with the generated `Module` impl.
#[distribute(mesh = "dp,tp", elem = T)]
pub struct Mlp<T: Element> {
    blocks: Vec<Block<T>>,
}

impl<T: Element> Mlp<T> {
    /// Draws the global weights (call `manual_seed` first) and distributes them over `mesh`
    /// (the generated `Mlp::distribute` makes them leaves that require grad).
    fn new(cfg: &MlpConfig, mesh: &DeviceMesh) -> Result<Mlp<T>> {
        let blocks = (0..cfg.layers)
            .map(|_| Ok(BlockGlobal { w1: init_weight(cfg.dim, cfg.hidden)?, w2: init_weight(cfg.hidden, cfg.dim)? }))
            .collect::<Result<_>>()?;
        Mlp::distribute(MlpGlobal { blocks }, mesh)
    }

    /// The forward pass on a batch laid out `(Shard(0), Replicate)`.
    pub fn forward(&self, x: &DTensor<T>) -> Result<DTensor<T>> {
        let mut h: Dt<T, (dp, tp), (Shard<0>, Replicate), 2> = Dt::from_dtensor(x.clone())?;
        for b in &self.blocks {
            h = block_forward(&h, b)?;
        }
        Ok(h.into_dtensor())
    }
}

/// How a student in a 16-bit type trains (all off: plain training in the student's type).
#[derive(Debug, Clone, Copy, Default)]
pub struct Precision {
    /// f32 master weights in the optimizer (`Sgd::master_weights`).
    pub master_weights: bool,
    /// Reduce the data-parallel gradient sums in f32 (`backward_reducing_in`).
    pub reduce_in_f32: bool,
    /// Dynamic loss scaling (for f16): `(initial scale, growth interval)`.
    pub loss_scale: Option<(f64, usize)>,
}

/// Student, teacher and optimizer on one rank of a mesh with dims `dp` and `tp`. The teacher
/// and the data are f32 whatever the student's type `T`.
pub struct Trainer<T: Element, U: Element = f32> {
    pub student: Mlp<T>,
    /// In `U` (f32 unless chosen): the data's precision.
    teacher: Mlp<U>,
    opt: Sgd<T>,
    scaler: Option<GradScaler>,
    precision: Precision,
    overlap_bucket_bytes: Option<usize>,
    data: TensorOptions,
    cfg: MlpConfig,
}

impl Trainer<f32> {
    /// Builds both networks in f32 (collective: every rank of `mesh` calls it).
    pub fn new(mesh: &DeviceMesh, cfg: MlpConfig) -> Result<Trainer<f32>> {
        Trainer::with_precision(mesh, cfg, Precision::default())
    }
}

impl<T: Element, U: Element> Trainer<T, U> {
    /// Builds a teacher in `U` (f32 by default; f64 makes the data exact to f64 rounding on
    /// every mesh) and a student in `T` from the same seeds as [`Trainer::new`]
    /// (its f32 initial weights rounded to `T`), trained as `precision` says.
    pub fn with_precision(mesh: &DeviceMesh, cfg: MlpConfig, precision: Precision) -> Result<Trainer<T, U>> {
        manual_seed(cfg.seed.wrapping_add(TEACHER_SEED));
        let teacher = Mlp::new(&cfg, mesh)?;
        manual_seed(cfg.seed);
        let student = Mlp::new(&cfg, mesh)?;
        let data = TensorOptions::new().mesh(mesh).placements(&[Shard(0), Replicate]);
        let opt = Sgd::new(f64::from(cfg.lr)).master_weights(precision.master_weights);
        let scaler = precision.loss_scale.map(|(s, n)| GradScaler::new().init_scale(s).growth_interval(n));
        Ok(Trainer { student, teacher, opt, scaler, precision, overlap_bucket_bytes: None, data, cfg })
    }

    /// A fresh batch `x` (`[batch, dim]`, `(Shard(0), Replicate)`) and the teacher's output
    /// for it, both rounded to `T`. `randn` is placement-invariant: the same global batch
    /// whatever the mesh.
    pub fn batch(&self) -> Result<(DTensor<T>, DTensor<T>)> {
        let x = randn::<f32>(&[self.cfg.batch, self.cfg.dim], &self.data)?.cast::<U>()?;
        let y = no_grad(|| self.teacher.forward(&x))?;
        Ok((x.cast()?, y.cast()?))
    }

    /// Overlaps the dp gradient all-reduces with the backward in buckets of `bytes`
    /// (`BackwardOptions::overlap_grad_reduce`), or not (`None`, the default).
    pub fn overlap_grad_reduce(mut self, bytes: Option<usize>) -> Self {
        self.overlap_bucket_bytes = bytes;
        self
    }

    /// Gives the SGD optimizer a momentum (a state to checkpoint).
    #[allow(dead_code)] // the resume test uses it
    pub fn momentum(mut self, m: f64) -> Self {
        self.opt = self.opt.clone().momentum(m);
        self
    }

    /// What a checkpoint after `step` steps holds: the student, its optimizer, the loss
    /// scaler and the generator's position (the data's). The teacher is not saved: it is
    /// drawn again from its seed.
    #[allow(dead_code)] // the resume test uses it
    pub fn train_state(&self, step: u64) -> TrainState<'_, T> {
        let state = TrainState::new(&self.student, step).optimizer(&self.opt);
        match &self.scaler {
            Some(s) => state.scaler(s),
            None => state,
        }
    }

    /// Loads the committed state of `ck` into this trainer, on whatever mesh it was built.
    #[allow(dead_code)] // the resume test uses it
    pub fn restore(&mut self, ck: &Checkpointer) -> Result<Option<Restored>> {
        let into = Restore::new(&mut self.student).optimizer(&mut self.opt);
        match &mut self.scaler {
            Some(s) => ck.load(into.scaler(s)),
            None => ck.load(into),
        }
    }

    /// The loss scaler's current scale, if the student trains with one.
    #[allow(dead_code)] // the example and the bench train without a scaler
    pub fn loss_scale(&self) -> Option<f64> {
        self.scaler.as_ref().map(GradScaler::get_scale)
    }

    /// One SGD step of the student on `(x, y)`; returns the loss (its placements depend on the
    /// mesh: read it with `full_tensor`, outside any `CommDebugMode` that should not count it).
    /// Under a loss scaler a step whose gradients overflowed is skipped.
    pub fn train_step(&mut self, x: &DTensor<T>, y: &DTensor<T>) -> Result<DTensor<T>> {
        self.student.zero_grad();
        let loss = self.student.forward(x)?.mse_loss(y)?;
        let scaled = match &self.scaler {
            Some(s) => s.scale(&loss)?,
            None => loss.clone(),
        };
        let mut opts = BackwardOptions::new();
        if self.precision.reduce_in_f32 {
            opts = opts.reduce_in(DType::F32);
        }
        if let Some(bytes) = self.overlap_bucket_bytes {
            opts = opts.overlap_grad_reduce(bytes);
        }
        scaled.backward_opts(&opts)?;
        match &mut self.scaler {
            Some(s) => {
                s.step(&mut self.opt, &mut self.student)?;
                s.update();
            }
            None => self.opt.step(&mut self.student)?,
        }
        Ok(loss)
    }
}
