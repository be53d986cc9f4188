//! Building a typed module straight from a checkpoint: [`HfCheckpoint::load_module`], the
//! [`TensorSource`] that a `#[distribute]` struct's `load_hf` reads its parameters from.

use super::{prefix_hint, HfCheckpoint};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::placement::Placement;
use crate::typed::{Parameters, TensorSource};
use std::collections::BTreeSet;

/// The checkpoint's tensors under `prefix`, each laid out on request on `mesh`; records
/// which ones the module took.
struct Source<'a> {
    checkpoint: &'a mut HfCheckpoint,
    prefix: &'a str,
    mesh: &'a DeviceMesh,
    taken: BTreeSet<String>,
}

impl<T: Element> TensorSource<T> for Source<'_> {
    fn tensor(&mut self, path: &str, placements: &[Placement]) -> Result<DTensor<T>> {
        let name = format!("{}{path}", self.prefix);
        if !self.checkpoint.weight_map.contains_key(&name) {
            return Err(Error::Checkpoint {
                path: self.checkpoint.listing.display().to_string(),
                reason: format!(
                    "no tensor `{name}` for the module's parameter `{path}` (prefix `{}`){}",
                    self.prefix,
                    prefix_hint(&self.checkpoint.names(), &[path], self.prefix)
                ),
            });
        }
        let t = self.checkpoint.load_tensor::<T>(&name, self.mesh, placements).map_err(|e| match e {
            Error::InvalidArgument { context, reason } => {
                Error::InvalidArgument { context: format!("{context} for the module's parameter `{path}`"), reason }
            }
            e => e,
        })?;
        self.taken.insert(name);
        Ok(t)
    }

    fn count(&self, path: &str) -> usize {
        let head = format!("{}{path}.", self.prefix);
        (0..).take_while(|i| self.holds(&format!("{head}{i}"))).count()
    }

    fn contains(&self, path: &str) -> bool {
        self.holds(&format!("{}{path}", self.prefix))
    }
}

impl Source<'_> {
    /// Whether the checkpoint has the tensor `name` or tensors below it (`name.`...).
    fn holds(&self, name: &str) -> bool {
        let below = format!("{name}.");
        let map = &self.checkpoint.weight_map;
        map.range(name.to_string()..)
            .take_while(|(n, _)| n.starts_with(name))
            .any(|(n, _)| n == name || n.starts_with(&below))
    }
}

impl HfCheckpoint {
    /// Builds the module `M` (a `#[distribute]` struct; its `load_hf` calls this) from the
    /// tensors `prefix` + each parameter's dotted name, each read with the placements `M`
    /// declares, so this rank reads only its shards and no full-size model exists first.
    /// `Vec` fields take as many elements as the checkpoint has indices (`layers.0`,
    /// `layers.1`, ...), `Option` fields are `Some` where the checkpoint holds their tensors.
    ///
    /// Strict, as PyTorch's `load_state_dict`: a missing tensor (with the prefix under which
    /// every name would match, if there is one), a tensor under `prefix` that no parameter
    /// takes, a rank other than the declared one, a shard dim the tensor does not have, or a
    /// prefix under which nothing loads is a typed error naming the parameter or the tensor;
    /// no module is returned then.
    pub fn load_module<T: Element, M: Parameters<T>>(&mut self, prefix: &str, mesh: &DeviceMesh) -> Result<M> {
        let mut source = Source { checkpoint: self, prefix, mesh, taken: BTreeSet::new() };
        let module = M::load_parameters(&mut source, "")?;
        let taken = source.taken;
        let listing = self.listing.display().to_string();
        if taken.is_empty() {
            return Err(Error::Checkpoint {
                path: listing,
                reason: format!("no tensor under the prefix `{prefix}` belongs to the module (it loaded nothing)"),
            });
        }
        let unused: Vec<&str> =
            self.names().into_iter().filter(|n| n.starts_with(prefix) && !taken.contains(*n)).collect();
        if !unused.is_empty() {
            return Err(Error::Checkpoint {
                path: listing,
                reason: format!(
                    "tensors {:?} match no parameter of the module{}",
                    &unused[..unused.len().min(8)],
                    if unused.len() > 8 { format!(" ({} in all)", unused.len()) } else { String::new() }
                ),
            });
        }
        Ok(module)
    }
}
