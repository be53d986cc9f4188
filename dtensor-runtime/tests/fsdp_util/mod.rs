//! The FSDP tests' block, in any float type.

use dtensor_runtime::module::{prefixed, prefixed_mut, Dropout, Forward, LayerHooks, LayerNorm, Linear, Module};
use dtensor_runtime::{DTensor, Element, Result};

/// norm → w1 → gelu → dropout → w2, a residual. (The dropout draws from the generator, so
/// a forward recomputed by resharding must draw the same numbers.)
#[derive(Clone)]
pub struct Block<T: Element> {
    pub norm: LayerNorm<T>,
    pub w1: Linear<T>,
    pub drop: Dropout,
    pub w2: Linear<T>,
}

impl<T: Element> Block<T> {
    pub fn new(dim: usize, hidden: usize) -> Result<Self> {
        Ok(Block {
            norm: LayerNorm::new(dim)?,
            w1: Linear::new(dim, hidden, true)?,
            drop: Dropout::new(0.25)?,
            w2: Linear::new(hidden, dim, true)?,
        })
    }
}

impl<T: Element> Module<T> for Block<T> {
    fn named_parameters(&self) -> Vec<(String, &DTensor<T>)> {
        let mut v = prefixed("norm", self.norm.named_parameters());
        v.extend(prefixed("w1", self.w1.named_parameters()));
        v.extend(prefixed("w2", self.w2.named_parameters()));
        v
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        let mut v = prefixed_mut("norm", self.norm.named_parameters_mut());
        v.extend(prefixed_mut("w1", self.w1.named_parameters_mut()));
        v.extend(prefixed_mut("w2", self.w2.named_parameters_mut()));
        v
    }
    fn layer_hooks_mut(&mut self, path: &str) -> Option<&mut LayerHooks> {
        match path {
            "w1" => self.w1.layer_hooks_mut(""),
            "w2" => self.w2.layer_hooks_mut(""),
            _ => None,
        }
    }
}

impl<T: Element> Forward<T> for Block<T> {
    fn forward(&self, x: &DTensor<T>) -> Result<DTensor<T>> {
        let h = self.w1.forward(&self.norm.forward(x)?)?.gelu()?;
        let h = self.w2.forward(&self.drop.forward(&h)?)?;
        x.add(&h)
    }
}
