//! A model trained plain or fully sharded (`--fsdp`), shared by the examples.

use dtensor::fsdp::FullyShard;
use dtensor::module::Module;
use dtensor::{Element, Result};

/// The model as trained: plain (every dp rank holds every parameter, gradients all-reduced
/// over dp) or fully sharded over dp.
pub enum MaybeSharded<T: Element, M> {
    Plain(M),
    Sharded(FullyShard<T, M>),
}

impl<T: Element, M: Module<T> + Clone> MaybeSharded<T, M> {
    /// Runs `f` on the model with its parameters in the layouts it uses them in (under FSDP:
    /// all-gathered over dp for the duration of `f`).
    pub fn run<R>(&self, f: impl FnOnce(&M) -> Result<R>) -> Result<R> {
        match self {
            MaybeSharded::Plain(m) => f(m),
            MaybeSharded::Sharded(s) => s.call(f),
        }
    }

    /// What optimizers, checkpoints and comparisons see: the parameters as they rest.
    pub fn module(&self) -> &dyn Module<T> {
        match self {
            MaybeSharded::Plain(m) => m,
            MaybeSharded::Sharded(s) => s,
        }
    }

    /// Same, mutable (optimizer steps, checkpoint loads).
    pub fn module_mut(&mut self) -> &mut dyn Module<T> {
        match self {
            MaybeSharded::Plain(m) => m,
            MaybeSharded::Sharded(s) => s,
        }
    }
}
