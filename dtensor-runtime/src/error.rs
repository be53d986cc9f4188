//! The one error type of the runtime.

use crate::placement::Placement;
use std::fmt;
use thiserror::Error;

/// Everything that can go wrong in dtensor-rs. Every variant names what was wrong.
#[derive(Debug, Clone, Error, PartialEq)]
#[non_exhaustive]
pub enum Error {
    // ---------------------------------------------------------------- mesh
    /// The mesh shape does not multiply out to the number of ranks.
    #[error("device mesh of shape {shape:?} has {mesh_size} ranks but the world has {world_size}")]
    MeshSizeMismatch {
        /// The requested mesh shape.
        shape: Vec<usize>,
        /// Product of `shape`: the ranks the mesh needs.
        mesh_size: usize,
        /// Ranks the world (communicator) has.
        world_size: usize,
    },
    /// A mesh dimension name appears twice.
    #[error("duplicate mesh dimension name `{name}`")]
    DuplicateMeshDim {
        /// The name given twice.
        name: String,
    },
    /// A mesh dimension name is not part of the mesh.
    #[error("unknown mesh dimension `{name}`; the mesh has {available:?}")]
    UnknownMeshDim {
        /// The name asked for.
        name: String,
        /// The mesh's dimension names, in order.
        available: Vec<String>,
    },
    /// Names and sizes of a mesh disagree in length, or the spec string is malformed.
    #[error("invalid device mesh: {reason}")]
    InvalidMesh {
        /// What is wrong with the names, sizes or spec string.
        reason: String,
    },
    /// A rank is not part of the mesh or the world.
    #[error("rank {rank} is not in the mesh/world of size {world_size}")]
    RankOutOfRange {
        /// The rank asked for.
        rank: usize,
        /// Size of the mesh or world it was checked against.
        world_size: usize,
    },
    /// A mesh dimension index (e.g. `Along::Dim(i)`) is not a dimension of the mesh.
    #[error("{context}: mesh dimension {dim} is out of range for a {ndim}-d mesh")]
    MeshDimOutOfRange {
        /// The call that got the index.
        context: String,
        /// The mesh dimension index given.
        dim: usize,
        /// Number of dimensions of the mesh.
        ndim: usize,
    },

    // ---------------------------------------------------------- placements
    /// Number of placements differs from the number of mesh dimensions.
    #[error("{given} placements given for a {mesh_ndim}-d mesh: give exactly one placement per mesh dimension")]
    PlacementCountMismatch {
        /// Number of placements given.
        given: usize,
        /// Number of mesh dimensions (placements needed).
        mesh_ndim: usize,
    },
    /// `Shard(dim)` with `dim` outside the tensor's rank.
    #[error("Shard({dim}) is out of range for a tensor of rank {ndim}")]
    ShardDimOutOfRange {
        /// The shard dim as given (negative counts from the end).
        dim: isize,
        /// Rank of the tensor.
        ndim: usize,
    },
    /// `Partial` where it is not allowed (e.g. distribute_tensor).
    #[error("{context}: Partial placement {placement} is not allowed here")]
    PartialNotAllowed {
        /// The Partial placement given.
        placement: Placement,
        /// The call that refused it.
        context: String,
    },
    /// A redistribution that has no meaning (Shard→Partial, Partial(a)→Partial(b)).
    #[error("cannot redistribute mesh dim {mesh_dim} from {from} to {to}: {reason}")]
    InvalidRedistribute {
        /// The mesh dimension whose step is illegal.
        mesh_dim: usize,
        /// Placement on that mesh dim before.
        from: Placement,
        /// Placement asked for on that mesh dim.
        to: Placement,
        /// Why the step has no meaning, and what to do instead.
        reason: String,
    },
    /// A dynamic tensor does not have the layout, mesh or rank a typed tensor (`typed::Dt`) declares.
    #[error("typed tensor: {what} mismatch: the type declares {expected}, the dynamic tensor has {actual}")]
    TypedMismatch {
        /// What differs (layout, mesh or rank), with the caller's location when known.
        what: String,
        /// What the type declares.
        expected: String,
        /// What the dynamic tensor has.
        actual: String,
    },
    /// A parameter of a module whose type declares its layout (a `#[distribute]` struct) has,
    /// or would get, another layout: a write around the type (`named_parameters_mut`, a load
    /// plan that disagrees), refused by the load or the optimizer step that would use it.
    #[error("parameter `{parameter}` is declared {declared}, but {by} {actual}")]
    DeclaredLayout {
        /// The parameter's dotted name.
        parameter: String,
        /// The declared placements.
        declared: String,
        /// What found or would write the other layout (`load_into with this plan would make it`).
        by: String,
        /// The other placements.
        actual: String,
    },
    /// Inside a `#[distribute]` function (without `implicit = "allow"`), a dynamic op would
    /// have redistributed an input on its own: a collective the code does not show.
    #[error(
        "`{op}` would redistribute its {redistribution} inside `#[distribute]` fn {function}: call `.redistribute()` first, or opt in with `#[distribute(.., implicit = \"allow\")]`"
    )]
    ImplicitCollective {
        /// The op.
        op: String,
        /// Which input, from which placements to which (`input 0 from (P(sum)) to (R)`).
        redistribution: String,
        /// The `#[distribute]` function and its source location (`` `f` (src/lib.rs:12) ``).
        function: String,
    },
    /// A typed op's dynamic op would have run a collective that the typed rule does not show
    /// (refused before anything is sent): the tensor's layout is not the one its type declares
    /// (a bypass of the typed layer wrote it), or the input's shape needs it (a size-1 dim
    /// broadcast against a sharded one).
    #[error(
        "typed `{op}` (at {at}) would redistribute its {redistribution}: typed ops run no collective that their layout rule does not show; redistribute the input explicitly first (`.redistribute()`), or check where its layout was written"
    )]
    TypedOpCollective {
        /// The typed op.
        op: String,
        /// Which input, from which placements to which.
        redistribution: String,
        /// The caller's source location.
        at: String,
    },
    /// Two DTensors live on different meshes.
    #[error("{context}: the tensors live on different device meshes ({left} vs {right})")]
    MeshMismatch {
        /// The op or call that combined the tensors.
        context: String,
        /// The first tensor's mesh.
        left: String,
        /// The other tensor's mesh.
        right: String,
    },
    /// Two tensors (or a tensor and a mesh) live on different devices.
    #[error("{context}: the tensors live on different devices ({left} vs {right})")]
    DeviceMismatch {
        /// The op or call that combined them.
        context: String,
        /// The first device.
        left: String,
        /// The other device.
        right: String,
    },
    /// A tensor that is already distributed was given a different layout.
    #[error(
        "tensor is already distributed as {existing}; requested {requested}: use `redistribute` to change the layout"
    )]
    AlreadyDistributed {
        /// The layout the tensor has.
        existing: String,
        /// The layout asked for.
        requested: String,
    },

    // -------------------------------------------------------------- shapes
    /// A shape does not match what was expected.
    #[error("{context}: shape mismatch, expected {expected:?}, got {actual:?}")]
    ShapeMismatch {
        /// The call that compared the shapes.
        context: String,
        /// The shape required.
        expected: Vec<usize>,
        /// The shape given.
        actual: Vec<usize>,
    },
    /// The ranks disagree about a shape or dtype (seen by run_check or distribute_tensor).
    #[error("{context}: rank {rank} has {actual:?} but rank {reference_rank} has {expected:?}")]
    InconsistentAcrossRanks {
        /// The check that found the disagreement.
        context: String,
        /// The rank that disagrees.
        rank: usize,
        /// The rank it was compared with.
        reference_rank: usize,
        /// The reference rank's value (a shape, or an encoded dtype/placement).
        expected: Vec<usize>,
        /// The disagreeing rank's value.
        actual: Vec<usize>,
    },
    /// `shape` and `stride` must be given together to `from_local`.
    #[error(
        "from_local: `shape` and `stride` must be given together (got shape={shape_given}, stride={stride_given})"
    )]
    ShapeStrideTogether {
        /// Whether `shape` was given.
        shape_given: bool,
        /// Whether `stride` was given.
        stride_given: bool,
    },
    /// A tensor dimension is out of range for an operation.
    #[error("{context}: dimension {dim} is out of range for a tensor of rank {ndim}")]
    DimOutOfRange {
        /// The op that got the dim.
        context: String,
        /// The dim as given (negative counts from the end).
        dim: isize,
        /// Rank of the tensor.
        ndim: usize,
    },
    /// A shape whose element count (or a stride or offset within it) does not fit in `isize`.
    #[error("{context}: shape {shape:?} is too large: its element count overflows")]
    ShapeOverflow {
        /// The call (or file) that supplied the shape.
        context: String,
        /// The shape whose size overflows.
        shape: Vec<usize>,
    },
    /// An allocation failed (or would exceed what the allocator can address).
    #[error("{context}: out of memory allocating {bytes} bytes")]
    OutOfMemory {
        /// What was being allocated.
        context: String,
        /// Size of the refused allocation, in bytes.
        bytes: usize,
    },
    /// A factory got an invalid argument.
    #[error("{context}: invalid argument: {reason}")]
    InvalidArgument {
        /// The function that got the argument.
        context: String,
        /// What is wrong with it.
        reason: String,
    },

    // --------------------------------------------------------------- ops
    /// An op has no sharding rule for the given placements.
    #[error("op `{op}` has no sharding rule for placements {placements}: {hint}")]
    NoShardingRule {
        /// The op.
        op: String,
        /// The input placements, formatted per input.
        placements: String,
        /// How to reach a supported layout.
        hint: String,
    },
    /// A user's op ([`CustomOp`](crate::ops::custom::CustomOp) or
    /// [`local_map`](crate::ops::local_map::local_map)) broke its own definition: a rule naming a
    /// dim the tensor does not have, two rules that contradict, a kernel returning the wrong
    /// local shape, a gradient of the wrong shape or mesh.
    #[error("op `{op}` is defined wrong: {problem}")]
    OpDefinition {
        /// The user's op.
        op: String,
        /// What is wrong, naming the rule, input or output.
        problem: String,
    },
    /// An input of a [`local_map`](crate::ops::local_map::local_map) function does not have
    /// the placements the function declares (and redistributing it was not asked for).
    #[error(
        "local_map `{op}`: input {input} is laid out {actual}, but the function declares {declared}: redistribute it first, or ask for it with `.redistribute_inputs(true)`"
    )]
    LocalMapInput {
        /// The local-map function's name.
        op: String,
        /// Which input.
        input: usize,
        /// The declared placements.
        declared: String,
        /// The input's placements.
        actual: String,
    },
    /// An op is not supported for this input.
    #[error("op `{op}`: {reason}")]
    Unsupported {
        /// The op (or kernel) asked for.
        op: String,
        /// Why it cannot run on this input or device.
        reason: String,
    },

    // -------------------------------------------------------- collectives
    /// A collective did not complete within the timeout (a peer is gone or stuck).
    #[error("collective `{op}` on group {group:?} timed out after {timeout_ms} ms on rank {rank}")]
    CollectiveTimeout {
        /// The collective.
        op: String,
        /// Global ranks of the group, in group order.
        group: Vec<usize>,
        /// The rank that gave up waiting.
        rank: usize,
        /// The timeout (`DTENSOR_TIMEOUT_MS`), in milliseconds.
        timeout_ms: u64,
    },
    /// Another rank failed; the group is poisoned and every pending collective aborts.
    #[error("collective aborted on rank {rank}: rank {failed_rank} failed: {reason}")]
    PeerFailed {
        /// The rank reporting the abort.
        rank: usize,
        /// The rank that failed first.
        failed_rank: usize,
        /// What the failed rank reported.
        reason: String,
    },
    /// The thread of a rank could not be started (the OS refused: thread or memory limits).
    #[error("could not start the thread of rank {rank} of {world_size}: {reason}")]
    ThreadSpawn {
        /// The rank whose thread did not start.
        rank: usize,
        /// Ranks the world was to have.
        world_size: usize,
        /// The OS error.
        reason: String,
    },
    /// A rank's closure panicked.
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank that panicked.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// This rank called a collective on a group it is not a member of.
    #[error("collective `{op}`: rank {rank} is not a member of group {group:?}")]
    NotInGroup {
        /// The collective.
        op: String,
        /// The calling rank.
        rank: usize,
        /// Global ranks of the group.
        group: Vec<usize>,
    },
    /// A second thread of the same rank entered a collective on a group while the first was
    /// still inside one (a rank takes part in at most one collective per group at a time).
    #[error(
        "collective `{op}` on group {group:?}: rank {rank} is already inside a collective on this group \
         (another thread of the same rank); serialise the collectives of a rank"
    )]
    ConcurrentCollective {
        /// The collective the second thread entered.
        op: String,
        /// The rank both threads belong to.
        rank: usize,
        /// Global ranks of the group.
        group: Vec<usize>,
    },
    /// The members of a group issued different collectives (seen by the collective fingerprint
    /// check, see [`crate::comm::fingerprint`]): `field` names what differs.
    #[error("collective mismatch on group {group:?} (seen by rank {rank}): {field} differs: {detail}")]
    CollectiveMismatch {
        /// The rank reporting (every member of the group reports).
        rank: usize,
        /// Global ranks of the group.
        group: Vec<usize>,
        /// The fingerprint field that differs (kind, dtype, count, root, op, sequence).
        field: String,
        /// What each rank issued.
        detail: String,
    },
    /// A collective was called with buffers of the wrong size.
    #[error("collective `{op}`: buffer size mismatch: {reason}")]
    BufferMismatch {
        /// The collective.
        op: String,
        /// Which buffer has which size, and what was needed.
        reason: String,
    },
    /// Backend specific failure (MPI, NCCL, CUDA).
    #[error("{backend} backend error: {message}")]
    Backend {
        /// The backend (`mpi`, `nccl`, `cuda`).
        backend: String,
        /// The backend's own error text.
        message: String,
    },
    /// A backend or device is not available on this machine.
    #[error("{what} is not available: {reason}")]
    Unavailable {
        /// The backend, library or device asked for.
        what: String,
        /// Why it is missing (feature off, library not found, no device).
        reason: String,
    },
    /// More GPU ranks were asked for than this machine has GPUs (checked before NCCL is
    /// touched: two NCCL ranks on one GPU hang or fail inside NCCL).
    #[error("{context}: {wanted} rank(s) need {wanted} GPU(s) but {available} are visible")]
    TooFewDevices {
        /// The launch mode or variable that asked (`launch(Launch::Nccl)`, `LOCAL_RANK`).
        context: String,
        /// GPUs needed.
        wanted: usize,
        /// GPUs visible to this process.
        available: usize,
    },

    // -------------------------------------------------------------- misc
    /// Autograd misuse (backward on a non-scalar, no grad_fn, ...).
    #[error("autograd: {0}")]
    Autograd(String),
    /// Module misuse (distribute_module called twice, unknown parameter path, ...).
    #[error("module: {0}")]
    Module(String),
    /// `fully_shard` refused a module, or a fully sharded module was misused.
    #[error("fully_shard `{module}`: {reason}")]
    FullyShard {
        /// The module's name (given in the options, or its type's).
        module: String,
        /// What is wrong, naming the parameter where there is one.
        reason: String,
    },
    /// Checkpoint I/O error naming the file.
    #[error("checkpoint file `{path}`: {reason}")]
    Checkpoint {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file that is refused for reading or writing: not a regular file, a symbolic link out
    /// of its directory, larger than allowed (see [`FileProblem`]).
    #[error("file `{path}` refused: {problem}")]
    UnsafeFile {
        /// The file.
        path: String,
        /// Why it is refused.
        problem: FileProblem,
    },
}

impl Error {
    /// A typed mismatch found in a function's argument, said as such: "argument `x` of
    /// `forward`: layout (at ..)". Other errors are returned as they are.
    pub(crate) fn in_argument(self, arg: &str, function: &str) -> Self {
        match self {
            Error::TypedMismatch { what, expected, actual } => {
                Error::TypedMismatch { what: format!("argument `{arg}` of `{function}`: {what}"), expected, actual }
            }
            e => e,
        }
    }
}

/// Result alias used throughout dtensor-rs.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a directory entry is, when it is not a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileKind {
    /// A directory.
    Directory,
    /// A named pipe (FIFO): opening it for reading blocks until a writer appears.
    Fifo,
    /// A character device (e.g. `/dev/null`).
    CharDevice,
    /// A block device (e.g. a disk).
    BlockDevice,
    /// A Unix domain socket.
    Socket,
    /// A symbolic link (not followed).
    Symlink,
    /// Any other kind the platform reports.
    Other,
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileKind::Directory => "a directory",
            FileKind::Fifo => "a FIFO (named pipe)",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
            FileKind::Socket => "a socket",
            FileKind::Symlink => "a symbolic link",
            FileKind::Other => "not a regular file",
        })
    }
}

/// Why a file was refused ([`Error::UnsafeFile`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileProblem {
    /// The entry (or the target of its link) is not a regular file.
    NotRegular(FileKind),
    /// A symbolic link whose resolved target lies outside the directory.
    LeavesDirectory {
        /// Where the link resolves to.
        target: String,
    },
    /// Longer than the cap of a whole-file read.
    TooLarge {
        /// The file's length, in bytes.
        len: u64,
        /// The cap of this read, in bytes.
        max: u64,
    },
    /// The name is not a plain file name inside the directory.
    NotPlainName,
    /// The entry changed between its inspection and its opening.
    Replaced,
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileProblem::NotRegular(k) => write!(f, "it is {k}, not a regular file"),
            FileProblem::LeavesDirectory { target } => {
                write!(f, "it is a symbolic link to `{target}`, outside the directory")
            }
            FileProblem::TooLarge { len, max } => write!(f, "it has {len} bytes, more than the {max} allowed"),
            FileProblem::NotPlainName => f.write_str("not a plain file name inside the directory"),
            FileProblem::Replaced => f.write_str("it was replaced while being opened"),
        }
    }
}
