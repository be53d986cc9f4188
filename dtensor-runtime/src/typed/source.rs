//! [`TensorSource`]: where [`Parameters::load_parameters`](super::Parameters::load_parameters)
//! takes a module's tensors from when it builds the module without a full-size copy first (a
//! checkpoint: [`HfCheckpoint::load_module`](crate::checkpoint::hf::HfCheckpoint::load_module)).
//! The module asks for each parameter by its dotted path with its declared placements; the
//! source gives this rank's shard only.

use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::names::join;
use crate::placement::Placement;

/// Tensors by dotted path (`layers.0.self_attn.q_proj.weight`), each laid out on request.
pub trait TensorSource<T: Element> {
    /// The tensor at `path`, laid out with `placements` on the source's mesh (this rank reads
    /// only its shard). A missing tensor is an error naming `path`.
    fn tensor(&mut self, path: &str, placements: &[Placement]) -> Result<DTensor<T>>;
    /// How many consecutive indices `path.0`, `path.1`, ... hold a tensor (or tensors below
    /// them): the length of a `Vec` field.
    fn count(&self, path: &str) -> usize {
        (0..).take_while(|i| self.contains(&join(path, &i.to_string()))).count()
    }
    /// Whether the source holds a tensor at `path` or below it: whether an `Option` field is
    /// `Some`.
    fn contains(&self, path: &str) -> bool;
    /// Does the source hand out existing parameters (kept as they are: the same leaf, its
    /// gradient and `requires_grad`) rather than tensors read from storage (each made a new
    /// leaf that requires grad)? `Fsdp::shards` does.
    #[doc(hidden)]
    fn hands_out_parameters(&self) -> bool {
        false
    }
}

/// A plain-data field (a number, a `String`, a `#[distribute(skip)]` field) of a module that is
/// being loaded: a checkpoint holds tensors only, so this is an error naming the field. Keep
/// configuration (sizes, `eps`) outside the `#[distribute]` struct to load it from a checkpoint.
#[doc(hidden)]
pub fn plain_field<V>(path: &str, type_name: &str) -> Result<V> {
    Err(Error::InvalidArgument {
        context: format!("loading the module field `{path}`"),
        reason: format!(
            "it holds plain data (`{type_name}`), not tensors, and a checkpoint holds tensors only: keep configuration \
             outside the #[distribute] struct (pass it to the functions that need it) to build the struct from a checkpoint"
        ),
    })
}
