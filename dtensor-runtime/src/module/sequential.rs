//! [`Sequential`]: modules applied in order, their parameters named by index.

use super::{prefixed, prefixed_mut, Forward, LayerHooks, Module};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::Result;
use crate::placement::Placement;

/// Modules applied one after the other (PyTorch `nn.Sequential`); the parameters of module
/// `i` are named `i.<name>`, so one optimizer can step them all (its state is kept by name:
/// stepping the modules one by one would give same-named parameters one shared state).
///
/// ```
/// use dtensor_runtime::module::{Linear, Module, Sequential};
/// let s = Sequential(vec![Linear::<f32>::new(4, 4, false)?, Linear::<f32>::new(4, 2, false)?]);
/// let names: Vec<String> = s.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["0.weight", "1.weight"]);
/// # Ok::<(), dtensor_runtime::Error>(())
/// ```
#[derive(Clone)]
pub struct Sequential<M>(pub Vec<M>);

impl<T: Element, M: Module<T>> Module<T> for Sequential<M> {
    fn named_parameters(&self) -> Vec<(String, &DTensor<T>)> {
        self.0.iter().enumerate().flat_map(|(i, m)| prefixed(&i.to_string(), m.named_parameters())).collect()
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        self.0
            .iter_mut()
            .enumerate()
            .flat_map(|(i, m)| prefixed_mut(&i.to_string(), m.named_parameters_mut()))
            .collect()
    }
    fn named_buffers(&self) -> Vec<(String, &DTensor<T>)> {
        self.0.iter().enumerate().flat_map(|(i, m)| prefixed(&i.to_string(), m.named_buffers())).collect()
    }
    fn named_buffers_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        self.0.iter_mut().enumerate().flat_map(|(i, m)| prefixed_mut(&i.to_string(), m.named_buffers_mut())).collect()
    }
    fn layer_hooks_mut(&mut self, path: &str) -> Option<&mut LayerHooks> {
        let (head, rest) = path.split_once('.').unwrap_or((path, ""));
        self.0.get_mut(head.parse::<usize>().ok()?)?.layer_hooks_mut(rest)
    }
    fn declared_placements(&self) -> Vec<(String, Vec<Placement>)> {
        self.0
            .iter()
            .enumerate()
            .flat_map(|(i, m)| m.declared_placements().into_iter().map(move |(n, p)| (format!("{i}.{n}"), p)))
            .collect()
    }
}

impl<T: Element, M: Forward<T>> Forward<T> for Sequential<M> {
    /// Runs the modules in order, each prefetching the next ([`Forward::prefetch`]): before
    /// module `i` runs, module `i + 1`'s communication is started (FSDP units made with
    /// `prefetch`: their all-gathers run on the background path while module `i`
    /// computes; other modules: nothing).
    fn forward(&self, input: &DTensor<T>) -> Result<DTensor<T>> {
        let mut x = input.clone();
        for (i, m) in self.0.iter().enumerate() {
            if let Some(next) = self.0.get(i + 1) {
                // Module i's own gathers first (started by the step before, or now), so that
                // they are ahead of the next module's in the background queue.
                m.prefetch()?;
                next.prefetch()?;
            }
            x = m.forward(&x)?;
        }
        Ok(x)
    }

    /// The first module's [`Forward::prefetch`].
    fn prefetch(&self) -> Result<()> {
        self.0.first().map_or(Ok(()), |m| m.prefetch())
    }
}
