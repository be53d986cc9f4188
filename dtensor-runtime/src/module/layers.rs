//! Layers: Linear, Embedding, LayerNorm, RmsNorm, Dropout. Built with local parameters drawn from the
//! counter-based generator (call `manual_seed` with the same seed on every rank first).

use super::{Forward, LayerHooks, LayerKind, Module};
use crate::autograd::{local_mesh, no_grad};
use crate::dtensor::DTensor;
use crate::element::{Element, IndexElement};
use crate::error::{Error, Result};
use crate::factory::{ones, rand, randn, zeros, TensorOptions};

fn local_opts() -> TensorOptions {
    TensorOptions::new().mesh(&local_mesh())
}

/// Uniform in `(-bound, bound)`, a leaf that requires grad.
fn uniform<T: Element>(shape: &[usize], bound: f64) -> Result<DTensor<T>> {
    let u = rand::<T>(shape, &local_opts())?;
    let b = T::of_f64(bound);
    Ok(no_grad(|| u.mul_scalar(b + b)?.sub_scalar(b))?.requires_grad_(true))
}

fn check_positive(context: &str, sizes: &[usize]) -> Result<()> {
    if sizes.contains(&0) {
        return Err(Error::InvalidArgument {
            context: context.into(),
            reason: format!("sizes must be positive, got {sizes:?}"),
        });
    }
    Ok(())
}

/// `y = x Wᵀ + b` with `W: [out, in]` and `b: [out]` (PyTorch `nn.Linear`, same init).
#[derive(Clone)]
pub struct Linear<T: Element> {
    /// Weight `[out_features, in_features]`, uniform in ±1/sqrt(in_features) at init.
    pub weight: DTensor<T>,
    /// Bias `[out_features]` (same init as the weight), or `None` for a layer built without one.
    pub bias: Option<DTensor<T>>,
    /// Input/output hooks that redistribute activations (set by `parallelize_module` styles).
    pub hooks: LayerHooks,
}

impl<T: Element> Linear<T> {
    /// Kaiming-uniform weight and uniform bias in `±1/√in`, as PyTorch.
    pub fn new(in_features: usize, out_features: usize, bias: bool) -> Result<Self> {
        check_positive("Linear::new", &[in_features, out_features])?;
        let bound = 1.0 / (in_features as f64).sqrt();
        let weight = uniform(&[out_features, in_features], bound)?;
        let bias = if bias { Some(uniform(&[out_features], bound)?) } else { None };
        Ok(Linear { weight, bias, hooks: LayerHooks::new(LayerKind::Linear) })
    }

    /// A layer of zeros to be loaded ([`HfCheckpoint::load_into`](crate::checkpoint::hf::HfCheckpoint::load_into)):
    /// the weights are the allocator's zeroed pages, which take no memory until written, so
    /// a model built this way and then loaded shard by shard grows each rank's resident
    /// memory by its shards only (the path without a full-size model for dynamic modules).
    pub fn zeros(in_features: usize, out_features: usize, bias: bool) -> Result<Self> {
        check_positive("Linear::zeros", &[in_features, out_features])?;
        let weight = zeros::<T>(&[out_features, in_features], &local_opts())?.requires_grad_(true);
        let bias = if bias { Some(zeros::<T>(&[out_features], &local_opts())?.requires_grad_(true)) } else { None };
        Ok(Linear { weight, bias, hooks: LayerHooks::new(LayerKind::Linear) })
    }
}

impl<T: Element> Module<T> for Linear<T> {
    fn named_parameters(&self) -> Vec<(String, &DTensor<T>)> {
        let mut v = vec![("weight".to_string(), &self.weight)];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b));
        }
        v
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        let mut v = vec![("weight".to_string(), &mut self.weight)];
        if let Some(b) = &mut self.bias {
            v.push(("bias".to_string(), b));
        }
        v
    }
    fn layer_hooks_mut(&mut self, path: &str) -> Option<&mut LayerHooks> {
        path.is_empty().then_some(&mut self.hooks)
    }
}

impl<T: Element> Forward<T> for Linear<T> {
    fn forward(&self, x: &DTensor<T>) -> Result<DTensor<T>> {
        let x = self.hooks.input(x)?;
        let mut y = x.matmul_t(&self.weight, false, true)?;
        if let Some(b) = &self.bias {
            y = y.add(b)?;
        }
        self.hooks.output(&y)
    }
}

/// Lookup table `[num_embeddings, dim]`, N(0, 1) init (PyTorch `nn.Embedding`). Its input is
/// a tensor of ids (see [`DTensor::embedding`]): [`Embedding::forward_ids`] takes `i64`/`i32`
/// ids for every table type; [`Forward::forward`] takes ids in the table's own type `T`
/// (whole numbers), which holds every id only up to 256 in bf16, 2048 in f16 and 2^24 in
/// f32, so a large vocabulary in a 16-bit type needs `forward_ids`.
#[derive(Clone)]
pub struct Embedding<T: Element> {
    /// Table `[num_embeddings, dim]`; row `i` is the vector for id `i`.
    pub weight: DTensor<T>,
    /// Input/output hooks that redistribute activations (set by `parallelize_module` styles).
    pub hooks: LayerHooks,
}

impl<T: Element> Embedding<T> {
    /// A table of `num_embeddings` rows of size `dim`.
    pub fn new(num_embeddings: usize, dim: usize) -> Result<Self> {
        check_positive("Embedding::new", &[num_embeddings, dim])?;
        let weight = randn::<T>(&[num_embeddings, dim], &local_opts())?.requires_grad_(true);
        Ok(Embedding { weight, hooks: LayerHooks::new(LayerKind::Embedding) })
    }

    /// A table of zeros to be loaded: see [`Linear::zeros`].
    pub fn zeros(num_embeddings: usize, dim: usize) -> Result<Self> {
        check_positive("Embedding::zeros", &[num_embeddings, dim])?;
        let weight = zeros::<T>(&[num_embeddings, dim], &local_opts())?.requires_grad_(true);
        Ok(Embedding { weight, hooks: LayerHooks::new(LayerKind::Embedding) })
    }
}

impl<T: Element> Module<T> for Embedding<T> {
    fn named_parameters(&self) -> Vec<(String, &DTensor<T>)> {
        vec![("weight".to_string(), &self.weight)]
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        vec![("weight".to_string(), &mut self.weight)]
    }
    fn layer_hooks_mut(&mut self, path: &str) -> Option<&mut LayerHooks> {
        path.is_empty().then_some(&mut self.hooks)
    }
}

impl<T: Element> Embedding<T> {
    /// The rows at `ids` of any index type (`i64`, `i32`, or whole-number floats), read as
    /// `i64` (never through `T`), with the layer's input and output layouts applied.
    pub fn forward_ids<I: IndexElement>(&self, ids: &DTensor<I>) -> Result<DTensor<T>> {
        let ids = self.hooks.input(ids)?;
        self.hooks.output(&self.weight.embedding(&ids)?)
    }
}

impl<T: Element> Forward<T> for Embedding<T> {
    /// [`Embedding::forward_ids`] at ids held in `T` (whole numbers; see the type's docs for
    /// the largest id each float type holds).
    fn forward(&self, ids: &DTensor<T>) -> Result<DTensor<T>> {
        self.forward_ids(ids)
    }
}

/// Layer normalisation over the last dim with affine weight and bias (PyTorch `nn.LayerNorm`).
#[derive(Clone)]
pub struct LayerNorm<T: Element> {
    /// Per-feature scale `[normalized_dim]`, ones at init.
    pub weight: DTensor<T>,
    /// Per-feature shift `[normalized_dim]`, zeros at init.
    pub bias: DTensor<T>,
    /// Added to the variance before the square root to avoid division by zero.
    pub eps: T,
    /// Input/output hooks that redistribute activations (set by `parallelize_module` styles).
    pub hooks: LayerHooks,
}

impl<T: Element> LayerNorm<T> {
    /// Weight ones, bias zeros, `eps = 1e-5`.
    pub fn new(dim: usize) -> Result<Self> {
        check_positive("LayerNorm::new", &[dim])?;
        Ok(LayerNorm {
            weight: ones::<T>(&[dim], &local_opts())?.requires_grad_(true),
            bias: zeros::<T>(&[dim], &local_opts())?.requires_grad_(true),
            eps: T::of_f64(1e-5),
            hooks: LayerHooks::new(LayerKind::Norm),
        })
    }
}

impl<T: Element> Module<T> for LayerNorm<T> {
    fn named_parameters(&self) -> Vec<(String, &DTensor<T>)> {
        vec![("weight".to_string(), &self.weight), ("bias".to_string(), &self.bias)]
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        vec![("weight".to_string(), &mut self.weight), ("bias".to_string(), &mut self.bias)]
    }
    fn layer_hooks_mut(&mut self, path: &str) -> Option<&mut LayerHooks> {
        path.is_empty().then_some(&mut self.hooks)
    }
}

impl<T: Element> Forward<T> for LayerNorm<T> {
    fn forward(&self, x: &DTensor<T>) -> Result<DTensor<T>> {
        let x = self.hooks.input(x)?;
        let dim = [self.weight.shape()[0]];
        let y = x.layer_norm(&dim, Some(&self.weight), Some(&self.bias), self.eps.as_f64())?;
        self.hooks.output(&y)
    }
}

/// Root-mean-square normalisation over the last dim with a weight (PyTorch `nn.RMSNorm`).
#[derive(Clone)]
pub struct RmsNorm<T: Element> {
    /// Per-feature scale `[normalized_dim]`, ones at init.
    pub weight: DTensor<T>,
    /// Added to the mean square before the square root to avoid division by zero.
    pub eps: T,
    /// Input/output hooks that redistribute activations (set by `parallelize_module` styles).
    pub hooks: LayerHooks,
}

impl<T: Element> RmsNorm<T> {
    /// Weight ones, `eps = 1e-6`.
    pub fn new(dim: usize) -> Result<Self> {
        check_positive("RmsNorm::new", &[dim])?;
        Ok(RmsNorm {
            weight: ones::<T>(&[dim], &local_opts())?.requires_grad_(true),
            eps: T::of_f64(1e-6),
            hooks: LayerHooks::new(LayerKind::Norm),
        })
    }
}

impl<T: Element> Module<T> for RmsNorm<T> {
    fn named_parameters(&self) -> Vec<(String, &DTensor<T>)> {
        vec![("weight".to_string(), &self.weight)]
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        vec![("weight".to_string(), &mut self.weight)]
    }
    fn layer_hooks_mut(&mut self, path: &str) -> Option<&mut LayerHooks> {
        path.is_empty().then_some(&mut self.hooks)
    }
}

impl<T: Element> Forward<T> for RmsNorm<T> {
    fn forward(&self, x: &DTensor<T>) -> Result<DTensor<T>> {
        let x = self.hooks.input(x)?;
        let y = x.rms_norm(&[self.weight.shape()[0]], Some(&self.weight), self.eps.as_f64())?;
        self.hooks.output(&y)
    }
}

/// Dropout with probability `p` while training, the identity in eval mode (PyTorch
/// `nn.Dropout`; starts in training mode). The mask comes from the placement-invariant
/// generator, so every mesh and layout drops the same elements.
#[derive(Clone)]
pub struct Dropout {
    /// Probability in `[0, 1]` that an element is zeroed in training; survivors are scaled by `1/(1-p)`.
    pub p: f64,
    /// `true` while training (dropout applied), `false` in eval mode (identity).
    pub training: bool,
}

impl Dropout {
    /// A dropout layer in training mode; `p` outside `[0, 1]` is an error.
    pub fn new(p: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::InvalidArgument {
                context: "Dropout::new".into(),
                reason: format!("probability must be in [0, 1], got {p}"),
            });
        }
        Ok(Dropout { p, training: true })
    }

    /// Switches to training mode (PyTorch `train()`).
    pub fn train(&mut self) {
        self.training = true;
    }

    /// Switches to evaluation mode: the identity (PyTorch `eval()`).
    pub fn eval(&mut self) {
        self.training = false;
    }
}

impl<T: Element> Module<T> for Dropout {
    fn named_parameters(&self) -> Vec<(String, &DTensor<T>)> {
        vec![]
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        vec![]
    }
}

impl<T: Element> Forward<T> for Dropout {
    fn forward(&self, x: &DTensor<T>) -> Result<DTensor<T>> {
        x.dropout(self.p, self.training)
    }
}
