//! Building a typed module straight from a checkpoint: [`HfCheckpoint::load_module`], the
//! [`TensorSource`] that a `#[distribute]` struct's `load_hf` reads its parameters from, and
//! [`HfCheckpoint::load_module_mapped`] for checkpoints that name or fuse tensors otherwise.

use super::{Parameters, TensorSource};
use crate::checkpoint::hf::{prefix_hint, HfCheckpoint, Split, TensorMap};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::placement::Placement;
use std::collections::{BTreeMap, BTreeSet};

/// The checkpoint's tensors under `prefix`, each laid out on request on `mesh`; records
/// which ones the module took.
struct Source<'a> {
    checkpoint: &'a mut HfCheckpoint,
    prefix: &'a str,
    mesh: &'a DeviceMesh,
    map: &'a TensorMap,
    taken: BTreeSet<String>,
    /// Per split tensor: its number of parts and the parts read.
    parts: BTreeMap<String, (usize, BTreeSet<usize>)>,
}

impl<T: Element> TensorSource<T> for Source<'_> {
    fn tensor(&mut self, path: &str, placements: &[Placement]) -> Result<DTensor<T>> {
        let (mapped, split) = self.map.source(path)?;
        let name = format!("{}{mapped}", self.prefix);
        if !self.checkpoint.weight_map().contains_key(&name) {
            return Err(Error::Checkpoint {
                path: self.checkpoint.listing().display().to_string(),
                reason: format!(
                    "no tensor `{name}` for the module's parameter `{path}` (prefix `{}`){}",
                    self.prefix,
                    prefix_hint(&self.checkpoint.names(), &[mapped.as_str()], self.prefix)
                ),
            });
        }
        let named = |e: Error| match e {
            Error::InvalidArgument { context, reason } => {
                Error::InvalidArgument { context: format!("{context} for the module's parameter `{path}`"), reason }
            }
            e => e,
        };
        let t = match split {
            None => self.checkpoint.load_tensor::<T>(&name, self.mesh, placements).map_err(named)?,
            Some(split) => {
                let t = self.part::<T>(&name, path, placements, split).map_err(named)?;
                self.parts.entry(name.clone()).or_insert((split.parts, BTreeSet::new())).1.insert(split.part);
                t
            }
        };
        self.taken.insert(name);
        Ok(t)
    }

    fn contains(&self, path: &str) -> bool {
        self.holds(path)
    }
}

impl Source<'_> {
    /// Part `part` of `parts` of tensor `name` along `dim`, laid out with `placements`: this
    /// rank reads its shard of the part only.
    fn part<T: Element>(
        &mut self,
        name: &str,
        path: &str,
        placements: &[Placement],
        Split { dim, part, parts }: Split,
    ) -> Result<DTensor<T>> {
        let (_, full, _) = self.checkpoint.source(name)?;
        if dim >= full.len() || !full[dim].is_multiple_of(parts) {
            return Err(Error::Checkpoint {
                path: self.checkpoint.listing().display().to_string(),
                reason: format!(
                    "tensor `{name}` of shape {full:?} cannot give the parameter `{path}` part {part} of {parts} \
                     equal parts along dim {dim}"
                ),
            });
        }
        let mut global = full;
        global[dim] /= parts;
        let mut origin = vec![0; global.len()];
        origin[dim] = part * global[dim];
        self.checkpoint.load_region(name, global, &origin, self.mesh, placements)
    }

    /// Whether the module path `path` holds something: a checkpoint tensor at it or below it
    /// (`path.`...), or a rule of the map that sends a parameter at or below it to a tensor
    /// the checkpoint has.
    fn holds(&self, path: &str) -> bool {
        // The module itself (a top-level `Option`): anything under the prefix.
        let (name, below) = match path {
            "" => (self.prefix.to_string(), self.prefix.to_string()),
            _ => (format!("{}{path}", self.prefix), format!("{}{path}.", self.prefix)),
        };
        let map = self.checkpoint.weight_map();
        map.range(name.clone()..)
            .take_while(|(n, _)| n.starts_with(&name))
            .any(|(n, _)| *n == name || n.starts_with(&below))
            || self.map.maps_below(path, |t| map.contains_key(&format!("{}{t}", self.prefix)))
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
        self.load_module_mapped(prefix, mesh, &TensorMap::new())
    }

    /// [`load_module`](Self::load_module) with the parameters read where `map` says:
    /// renamed tensors, or parts of fused ones (GPT-2's `c_attn` split into q, k and v, each
    /// then sharded by its declared placements, so each rank keeps its own heads of all
    /// three). Every part of a split tensor must go to some parameter; tensors the map
    /// [`ignore`](TensorMap::ignore)s may stay unread.
    pub fn load_module_mapped<T: Element, M: Parameters<T>>(
        &mut self,
        prefix: &str,
        mesh: &DeviceMesh,
        map: &TensorMap,
    ) -> Result<M> {
        let mut source = Source { checkpoint: self, prefix, mesh, map, taken: BTreeSet::new(), parts: BTreeMap::new() };
        let module = M::load_parameters(&mut source, "")?;
        let (taken, parts) = (source.taken, source.parts);
        let listing = self.listing().display().to_string();
        // A fused tensor is used whole: a map that forgets a part (v of q/k/v) drops data.
        if let Some((name, (n, read))) = parts.iter().find(|(_, (n, read))| read.len() < *n) {
            let missing: Vec<usize> = (0..*n).filter(|p| !read.contains(p)).collect();
            return Err(Error::Checkpoint {
                path: listing,
                reason: format!(
                    "parts {missing:?} of the {n} parts of tensor `{name}` go to no parameter of the module"
                ),
            });
        }
        if taken.is_empty() {
            return Err(Error::Checkpoint {
                path: listing,
                reason: format!("no tensor under the prefix `{prefix}` belongs to the module (it loaded nothing)"),
            });
        }
        let unused: Vec<&str> = self
            .names()
            .into_iter()
            .filter(|n| n.starts_with(prefix) && !taken.contains(*n) && !map.ignores(&n[prefix.len()..]))
            .collect();
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
