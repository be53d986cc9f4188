//! What `fully_shard` is told: the mesh dim to shard over, the module's name, the reduce dtype.

use crate::element::DType;

/// Options of [`fully_shard`](super::fully_shard) (PyTorch's keyword arguments of
/// `fully_shard`, where they fit).
///
/// ```
/// use dtensor_runtime::fsdp::FullyShardOptions;
/// use dtensor_runtime::DType;
/// let o = FullyShardOptions::on("dp").named("blocks.0").reduce_dtype(DType::F32);
/// assert_eq!(o.mesh_dim, "dp");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FullyShardOptions {
    /// The mesh dim the parameters are sharded over (PyTorch: the FSDP mesh, or the shard dim
    /// of an HSDP mesh). Every other mesh dim keeps the placements the parameters already
    /// have: a dim they are replicated on is data parallel without sharding (HSDP), a dim
    /// they are sharded on by a tensor-parallel plan stays so (FSDP × TP).
    pub mesh_dim: String,
    /// The module's name in errors and in the collective records (default: its type's name).
    pub name: Option<String>,
    /// The dtype gradients are reduce-scattered in (PyTorch `MixedPrecisionPolicy.reduce_dtype`;
    /// default: the dtype the module computes in — the parameters' own, or a
    /// [`fully_shard_mixed`](super::fully_shard_mixed) unit's compute dtype, as PyTorch's
    /// default is `param_dtype`).
    pub reduce_dtype: Option<DType>,
    /// Free the gathered parameters when the forward returns and gather them again for the
    /// backward (PyTorch's default, `reshard_after_forward=True`); default `false`: they stay
    /// until the backward has used them. Here the backward also recomputes the module's
    /// forward from its input (the forward keeps no activations either): a window of one
    /// unit's parameters and activations for one more forward per step. Applies to
    /// [`Forward::forward`](crate::module::Forward::forward) of the wrapped module.
    pub reshard_after_forward: bool,
    /// Reshard after the forward to groups of this many ranks instead of the whole FSDP dim
    /// (PyTorch `reshard_after_forward=<int>`, e.g. the ranks of one node): the forward keeps
    /// `1/group` of each gathered parameter, and the backward all-gathers over those `group`
    /// ranks only (runs of consecutive coordinates of the FSDP dim, so with node-major ranks
    /// within a node; its records name the dim `<dim>.within`) — more memory than resharding
    /// to the whole dim, a smaller all-gather in the backward. It must divide the FSDP dim's
    /// size and be at least 2 (a group of the whole dim is `reshard_after_forward(true)`).
    /// Set by [`FullyShardOptions::reshard_after_forward_to`]; `None`: the whole dim.
    pub reshard_group: Option<usize>,
    /// Accept parameters that already rest sharded over the mesh dim exactly as `fully_shard`
    /// would lay them out ([`resting_layout`](super::resting_layout)), e.g. loaded that way from
    /// a checkpoint so that each rank read only its part; they are adopted as they are.
    /// Default `false`: a parameter sharded over the mesh dim is refused (a module is fully
    /// sharded once).
    pub accept_resting: bool,
    /// Prefetch this unit's all-gathers: a container starts them while the unit before it
    /// computes ([`Forward::prefetch`](crate::module::Forward::prefetch), which
    /// [`Sequential`](crate::module::Sequential) calls for the next module; PyTorch's
    /// `set_modules_to_forward_prefetch`), and with `reshard_after_forward` its backward is
    /// gathered while the unit after it recomputes (the unit whose input is this unit's output
    /// starts it; PyTorch's backward prefetch). Default `false`: on the thread backend of a
    /// 2-core machine the background gathers compete with the compute
    /// (`benches/fsdp_prefetch.rs`: 0.94–1.04× the speed). MPI starts `MPI_Iallgatherv`s; the
    /// device backends run a started gather at once.
    pub prefetch: bool,
}

impl FullyShardOptions {
    /// Shards over the mesh dim named `mesh_dim`.
    pub fn on(mesh_dim: &str) -> Self {
        FullyShardOptions {
            mesh_dim: mesh_dim.to_string(),
            name: None,
            reduce_dtype: None,
            reshard_after_forward: false,
            reshard_group: None,
            accept_resting: false,
            prefetch: false,
        }
    }

    /// Names the module (errors and records say it).
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Frees the gathered parameters after the forward (see
    /// [`FullyShardOptions::reshard_after_forward`]).
    pub fn reshard_after_forward(mut self, on: bool) -> Self {
        self.reshard_after_forward = on;
        self.reshard_group = None; // to the whole dim, or not at all
        self
    }

    /// Reshards after the forward to groups of `group` ranks (see
    /// [`FullyShardOptions::reshard_group`]; turns [`FullyShardOptions::reshard_after_forward`]
    /// on).
    ///
    /// ```
    /// use dtensor_runtime::fsdp::FullyShardOptions;
    /// let o = FullyShardOptions::on("dp").reshard_after_forward_to(8); // one node of 8 ranks
    /// assert!(o.reshard_after_forward && o.reshard_group == Some(8));
    /// ```
    pub fn reshard_after_forward_to(mut self, group: usize) -> Self {
        self.reshard_after_forward = true;
        self.reshard_group = Some(group);
        self
    }

    /// Adopts parameters that already rest as `fully_shard` would lay them out (see
    /// [`FullyShardOptions::accept_resting`]).
    pub fn accept_resting(mut self, on: bool) -> Self {
        self.accept_resting = on;
        self
    }

    /// Prefetches this unit's all-gathers (see [`FullyShardOptions::prefetch`]).
    pub fn prefetch(mut self, on: bool) -> Self {
        self.prefetch = on;
        self
    }

    /// Reduce-scatters gradients in `dtype` (cast there and back).
    pub fn reduce_dtype(mut self, dtype: DType) -> Self {
        self.reduce_dtype = Some(dtype);
        self
    }
}
