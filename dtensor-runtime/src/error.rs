//! The one error type of the runtime.

use crate::checkpoint::FileProblem;
use crate::placement::Placement;
use thiserror::Error;

/// Everything that can go wrong in dtensor-rs. Every variant names what was wrong.
#[derive(Debug, Clone, Error, PartialEq)]
#[non_exhaustive]
pub enum Error {
    // ---------------------------------------------------------------- mesh
    /// The mesh shape does not multiply out to the number of ranks.
    #[error("device mesh of shape {shape:?} has {mesh_size} ranks but the world has {world_size}")]
    MeshSizeMismatch { shape: Vec<usize>, mesh_size: usize, world_size: usize },
    /// A mesh dimension name appears twice.
    #[error("duplicate mesh dimension name `{name}`")]
    DuplicateMeshDim { name: String },
    /// A mesh dimension name is not part of the mesh.
    #[error("unknown mesh dimension `{name}`; the mesh has {available:?}")]
    UnknownMeshDim { name: String, available: Vec<String> },
    /// Names and sizes of a mesh disagree in length, or the spec string is malformed.
    #[error("invalid device mesh: {reason}")]
    InvalidMesh { reason: String },
    /// A rank is not part of the mesh or the world.
    #[error("rank {rank} is not in the mesh/world of size {world_size}")]
    RankOutOfRange { rank: usize, world_size: usize },
    /// A mesh dimension index (e.g. `Along::Dim(i)`) is not a dimension of the mesh.
    #[error("{context}: mesh dimension {dim} is out of range for a {ndim}-d mesh")]
    MeshDimOutOfRange { context: String, dim: usize, ndim: usize },

    // ---------------------------------------------------------- placements
    /// Number of placements differs from the number of mesh dimensions.
    #[error("{given} placements given for a {mesh_ndim}-d mesh: give exactly one placement per mesh dimension")]
    PlacementCountMismatch { given: usize, mesh_ndim: usize },
    /// `Shard(dim)` with `dim` outside the tensor's rank.
    #[error("Shard({dim}) is out of range for a tensor of rank {ndim}")]
    ShardDimOutOfRange { dim: isize, ndim: usize },
    /// `Partial` where it is not allowed (e.g. distribute_tensor).
    #[error("{context}: Partial placement {placement} is not allowed here")]
    PartialNotAllowed { placement: Placement, context: String },
    /// A redistribution that has no meaning (Shard→Partial, Partial(a)→Partial(b)).
    #[error("cannot redistribute mesh dim {mesh_dim} from {from} to {to}: {reason}")]
    InvalidRedistribute { mesh_dim: usize, from: Placement, to: Placement, reason: String },
    /// A dynamic tensor does not have the layout, mesh or rank a typed tensor (`typed::Dt`) declares.
    #[error("typed tensor: {what} mismatch: the type declares {expected}, the dynamic tensor has {actual}")]
    TypedMismatch { what: String, expected: String, actual: String },
    /// Two DTensors live on different meshes.
    #[error("{context}: the tensors live on different device meshes ({left} vs {right})")]
    MeshMismatch { context: String, left: String, right: String },
    /// Two tensors (or a tensor and a mesh) live on different devices.
    #[error("{context}: the tensors live on different devices ({left} vs {right})")]
    DeviceMismatch { context: String, left: String, right: String },
    /// A tensor that is already distributed was given a different layout.
    #[error(
        "tensor is already distributed as {existing}; requested {requested}: use `redistribute` to change the layout"
    )]
    AlreadyDistributed { existing: String, requested: String },

    // -------------------------------------------------------------- shapes
    /// A shape does not match what was expected.
    #[error("{context}: shape mismatch, expected {expected:?}, got {actual:?}")]
    ShapeMismatch { context: String, expected: Vec<usize>, actual: Vec<usize> },
    /// The ranks disagree about a shape or dtype (seen by run_check or distribute_tensor).
    #[error("{context}: rank {rank} has {actual:?} but rank {reference_rank} has {expected:?}")]
    InconsistentAcrossRanks {
        context: String,
        rank: usize,
        reference_rank: usize,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    /// `shape` and `stride` must be given together to `from_local`.
    #[error(
        "from_local: `shape` and `stride` must be given together (got shape={shape_given}, stride={stride_given})"
    )]
    ShapeStrideTogether { shape_given: bool, stride_given: bool },
    /// A tensor dimension is out of range for an operation.
    #[error("{context}: dimension {dim} is out of range for a tensor of rank {ndim}")]
    DimOutOfRange { context: String, dim: isize, ndim: usize },
    /// A shape whose element count (or a stride or offset within it) does not fit in `isize`.
    #[error("{context}: shape {shape:?} is too large: its element count overflows")]
    ShapeOverflow { context: String, shape: Vec<usize> },
    /// An allocation failed (or would exceed what the allocator can address).
    #[error("{context}: out of memory allocating {bytes} bytes")]
    OutOfMemory { context: String, bytes: usize },
    /// A factory got an invalid argument.
    #[error("{context}: invalid argument: {reason}")]
    InvalidArgument { context: String, reason: String },

    // --------------------------------------------------------------- ops
    /// An op has no sharding rule for the given placements.
    #[error("op `{op}` has no sharding rule for placements {placements}: {hint}")]
    NoShardingRule { op: String, placements: String, hint: String },
    /// An op is not supported for this input.
    #[error("op `{op}`: {reason}")]
    Unsupported { op: String, reason: String },

    // -------------------------------------------------------- collectives
    /// A collective did not complete within the timeout (a peer is gone or stuck).
    #[error("collective `{op}` on group {group:?} timed out after {timeout_ms} ms on rank {rank}")]
    CollectiveTimeout { op: String, group: Vec<usize>, rank: usize, timeout_ms: u64 },
    /// Another rank failed; the group is poisoned and every pending collective aborts.
    #[error("collective aborted on rank {rank}: rank {failed_rank} failed: {reason}")]
    PeerFailed { rank: usize, failed_rank: usize, reason: String },
    /// The thread of a rank could not be started (the OS refused: thread or memory limits).
    #[error("could not start the thread of rank {rank} of {world_size}: {reason}")]
    ThreadSpawn { rank: usize, world_size: usize, reason: String },
    /// A rank's closure panicked.
    #[error("rank {rank} panicked: {message}")]
    RankPanicked { rank: usize, message: String },
    /// This rank called a collective on a group it is not a member of.
    #[error("collective `{op}`: rank {rank} is not a member of group {group:?}")]
    NotInGroup { op: String, rank: usize, group: Vec<usize> },
    /// A second thread of the same rank entered a collective on a group while the first was
    /// still inside one (a rank takes part in at most one collective per group at a time).
    #[error(
        "collective `{op}` on group {group:?}: rank {rank} is already inside a collective on this group \
         (another thread of the same rank); serialise the collectives of a rank"
    )]
    ConcurrentCollective { op: String, rank: usize, group: Vec<usize> },
    /// The members of a group issued different collectives (seen by the collective fingerprint
    /// check, see [`crate::comm::fingerprint`]): `field` names what differs.
    #[error("collective mismatch on group {group:?} (seen by rank {rank}): {field} differs: {detail}")]
    CollectiveMismatch { rank: usize, group: Vec<usize>, field: String, detail: String },
    /// A collective was called with buffers of the wrong size.
    #[error("collective `{op}`: buffer size mismatch: {reason}")]
    BufferMismatch { op: String, reason: String },
    /// Backend specific failure (MPI, NCCL, CUDA).
    #[error("{backend} backend error: {message}")]
    Backend { backend: String, message: String },
    /// A backend or device is not available on this machine.
    #[error("{what} is not available: {reason}")]
    Unavailable { what: String, reason: String },

    // -------------------------------------------------------------- misc
    /// Autograd misuse (backward on a non-scalar, no grad_fn, ...).
    #[error("autograd: {0}")]
    Autograd(String),
    /// Module misuse (distribute_module called twice, unknown parameter path, ...).
    #[error("module: {0}")]
    Module(String),
    /// Checkpoint I/O error naming the file.
    #[error("checkpoint file `{path}`: {reason}")]
    Checkpoint { path: String, reason: String },
    /// A file that is refused for reading or writing: not a regular file, a symbolic link out
    /// of its directory, larger than allowed (see [`crate::checkpoint::FileProblem`]).
    #[error("file `{path}` refused: {problem}")]
    UnsafeFile { path: String, problem: FileProblem },
}

/// Result alias used throughout dtensor-rs.
pub type Result<T, E = Error> = std::result::Result<T, E>;
