//! `DeviceMesh`: an n-d grid of ranks with named dimensions.

pub(crate) mod current;
pub(crate) mod storage;

use crate::comm::debug::{record, CollectiveKind};
use crate::comm::fingerprint::{self, Fingerprint};
use crate::comm::in_flight::{self, PendingGather, PendingReduce};
use crate::comm::{filled, variable, Buf, BufInOut, Communicator, Gather, OwnedBytes};
use crate::device::{Device, Target};
use crate::element::{DType, Scalar};
use crate::error::{Error, Result};
use crate::placement::ReduceOp;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// An n-dimensional arrangement of the world's ranks, with named dimensions.
///
/// Rank `r` sits at the row-major coordinate of `r` (as `torch.arange(world).view(shape)`).
/// Each mesh dimension partitions the ranks into groups (the ranks that differ only in that
/// coordinate); collectives of a placement on mesh dim `i` run over this rank's group `i`.
///
/// ```
/// let dims = dtensor_runtime::run(4, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
///     let tp = mesh.submesh("tp")?;
///     Ok((mesh.coordinate().to_vec(), tp.ranks().to_vec()))
/// }).unwrap();
/// assert_eq!(dims[3], (vec![1, 1], vec![2, 3]));
/// ```
#[derive(Clone)]
pub struct DeviceMesh {
    inner: Arc<MeshInner>,
}

struct MeshInner {
    comm: Arc<dyn Communicator>,
    shape: Vec<usize>,
    names: Vec<String>,
    /// Global rank of every mesh position, row-major.
    ranks: Vec<usize>,
    /// This rank's coordinate.
    coord: Vec<usize>,
    /// This rank's group along each mesh dim (global ranks, in coordinate order).
    groups: Vec<Vec<usize>>,
    /// Where this rank's shards live (from the communicator).
    target: Target,
    /// Whether collectives first agree on their fingerprint (see [`crate::comm::fingerprint`]).
    checks: AtomicBool,
    /// The meshes [`DeviceMesh::unflatten`] made from this one, by (dim, sizes, names).
    unflattened: Mutex<HashMap<Unflattened, DeviceMesh>>,
}

/// What [`DeviceMesh::unflatten`] was asked: the dim, the sizes, the names.
type Unflattened = (usize, Vec<usize>, Vec<String>);

impl DeviceMesh {
    /// A mesh over the whole world of `comm`. Collective: every rank must call it with the
    /// same arguments. `names` may be empty (dims are then called `dim0`, `dim1`, ...).
    pub fn new(comm: Arc<dyn Communicator>, shape: &[usize], names: &[&str]) -> Result<DeviceMesh> {
        let world = comm.world_size();
        // Before the list of the world's ranks is built (one entry per rank): a shape that
        // does not cover the world is an error whatever the world's size.
        if let Ok(size) = crate::shape::checked_numel("device mesh", shape) {
            if size != world && size > 0 && !shape.is_empty() {
                return Err(Error::MeshSizeMismatch { shape: shape.to_vec(), mesh_size: size, world_size: world });
            }
        }
        let mesh = Self::build(comm, shape, names, (0..world).collect())?;
        mesh.inner.comm.prepare_groups(&mesh.prepared_partitions())?;
        Ok(mesh)
    }

    /// The groups a backend with sub-communicators (MPI, NCCL) must create when the mesh is
    /// made: every mesh dim's groups, the whole mesh (`Along::All`), and on meshes of 3 or
    /// more dims the groups spanning every set of 2..ndim-1 dims in mesh order (the
    /// `Along::All` groups of [`submesh_dims`](Self::submesh_dims) given names in mesh order).
    pub fn prepared_partitions(&self) -> Vec<Vec<Vec<usize>>> {
        let n = self.ndim();
        let mut out: Vec<Vec<Vec<usize>>> = (0..n).map(|d| self.all_groups(d)).collect();
        for set in 1u32..(1 << n) {
            let dims: Vec<usize> = (0..n).filter(|d| set & (1 << d) != 0).collect();
            if dims.len() >= 2 && dims.len() < n {
                out.push(self.span_groups(&dims));
            }
        }
        out.push(vec![self.ranks().to_vec()]);
        out
    }

    /// The partition of the mesh into groups spanning `dims` (each group in row-major order
    /// over `dims`, as [`submesh_dims`](Self::submesh_dims) orders its ranks).
    fn span_groups(&self, dims: &[usize]) -> Vec<Vec<usize>> {
        let shape: Vec<usize> = dims.iter().map(|&d| self.inner.shape[d]).collect();
        let span: usize = shape.iter().product();
        (0..self.numel())
            .map(|pos| unravel(pos, &self.inner.shape))
            .filter(|c| dims.iter().all(|&d| c[d] == 0))
            .map(|mut c| {
                (0..span)
                    .map(|p| {
                        let sub = unravel(p, &shape);
                        for (i, &d) in dims.iter().enumerate() {
                            c[d] = sub[i];
                        }
                        self.inner.ranks[ravel(&c, &self.inner.shape)]
                    })
                    .collect()
            })
            .collect()
    }

    /// Parses `"dp=2,tp=4"` and builds the mesh.
    pub fn from_spec(comm: Arc<dyn Communicator>, spec: &str) -> Result<DeviceMesh> {
        let (names, shape) = parse_mesh_spec(spec)?;
        let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        Self::new(comm, &shape, &names)
    }

    fn build(comm: Arc<dyn Communicator>, shape: &[usize], names: &[&str], ranks: Vec<usize>) -> Result<DeviceMesh> {
        if shape.is_empty() {
            return Err(Error::InvalidMesh { reason: "a mesh needs at least one dimension".into() });
        }
        if let Some(i) = shape.iter().position(|&s| s == 0) {
            return Err(Error::InvalidMesh { reason: format!("mesh dimension {i} has size 0") });
        }
        let names: Vec<String> = if names.is_empty() {
            (0..shape.len()).map(|i| format!("dim{i}")).collect()
        } else {
            names.iter().map(|s| s.to_string()).collect()
        };
        if names.len() != shape.len() {
            return Err(Error::InvalidMesh {
                reason: format!("{} names for a mesh with {} dimensions", names.len(), shape.len()),
            });
        }
        for (i, n) in names.iter().enumerate() {
            if n.is_empty() {
                return Err(Error::InvalidMesh { reason: format!("mesh dimension {i} has an empty name") });
            }
            if names[..i].contains(n) {
                return Err(Error::DuplicateMeshDim { name: n.clone() });
            }
        }
        let size = crate::shape::checked_numel("device mesh", shape)?;
        if size != ranks.len() {
            return Err(Error::MeshSizeMismatch { shape: shape.to_vec(), mesh_size: size, world_size: ranks.len() });
        }
        let me = comm.rank();
        let pos = ranks
            .iter()
            .position(|&r| r == me)
            .ok_or(Error::RankOutOfRange { rank: me, world_size: comm.world_size() })?;
        let coord = unravel(pos, shape);
        let target = target_of(comm.as_ref())?;
        let checks = AtomicBool::new(crate::env::debug_detail()?);
        let unflattened = Mutex::new(HashMap::new());
        let mut mesh =
            MeshInner { comm, shape: shape.to_vec(), names, ranks, coord, groups: vec![], target, checks, unflattened };
        mesh.groups = (0..shape.len()).map(|d| group_of(&mesh, d, &mesh.coord)).collect();
        Ok(DeviceMesh { inner: Arc::new(mesh) })
    }

    /// Switches the collective fingerprint check on or off for this mesh, its clones and the
    /// sub-meshes created from it afterwards (see [`crate::comm::fingerprint`]; the default is
    /// on when `DTENSOR_DEBUG=detail`). Every rank must make the same choice at the same point.
    pub fn set_collective_checks(&self, on: bool) {
        self.inner.checks.store(on, Ordering::Relaxed);
    }

    /// Whether the collective fingerprint check is on for this mesh.
    pub fn collective_checks(&self) -> bool {
        self.inner.checks.load(Ordering::Relaxed)
    }

    /// The communicator collectives on this mesh go through. Calling it directly bypasses the
    /// mesh's ordering of background collectives ([`all_reduce_start`](Self::all_reduce_start)):
    /// a direct collective on a group with a started one in flight may meet a peer's started
    /// one (the thread backend may answer `Error::ConcurrentCollective`); wait first.
    pub fn comm(&self) -> &Arc<dyn Communicator> {
        &self.inner.comm
    }
    /// Size of each mesh dimension.
    pub fn shape(&self) -> &[usize] {
        &self.inner.shape
    }
    /// Number of mesh dimensions.
    pub fn ndim(&self) -> usize {
        self.inner.shape.len()
    }
    /// Size of mesh dimension `dim`.
    ///
    /// # Panics
    /// If `dim >= self.ndim()`, like indexing [`shape`](Self::shape). Use
    /// [`dim_index`](Self::dim_index) to look a dimension up by name with an error instead.
    pub fn size(&self, dim: usize) -> usize {
        self.check_dim(dim);
        self.inner.shape[dim]
    }

    /// Panics with a message naming the mesh (the `Index`-like accessors).
    fn check_dim(&self, dim: usize) {
        assert!(dim < self.ndim(), "mesh dimension {dim} is out of range for {self}, which has {} dims", self.ndim());
    }
    /// Total number of ranks in the mesh.
    pub fn numel(&self) -> usize {
        self.inner.ranks.len()
    }
    /// Names of the mesh dimensions.
    pub fn dim_names(&self) -> &[String] {
        &self.inner.names
    }
    /// Global ranks of the mesh, row-major.
    pub fn ranks(&self) -> &[usize] {
        &self.inner.ranks
    }
    /// This process' global rank.
    pub fn rank(&self) -> usize {
        self.inner.comm.rank()
    }
    /// This rank's coordinate in the mesh.
    pub fn coordinate(&self) -> &[usize] {
        &self.inner.coord
    }
    /// This rank's group (global ranks) along mesh dim `dim`.
    ///
    /// # Panics
    /// If `dim >= self.ndim()`, like [`size`](Self::size). Collectives given an out-of-range
    /// `Along::Dim` return [`Error::MeshDimOutOfRange`] instead.
    pub fn group(&self, dim: usize) -> &[usize] {
        self.check_dim(dim);
        &self.inner.groups[dim]
    }
    /// The device this rank's shards live on (the communicator's).
    pub fn device(&self) -> Device {
        self.inner.target.device()
    }
    /// Where new shards of this rank are allocated.
    pub fn target(&self) -> &Target {
        &self.inner.target
    }

    /// `Ok` when tensors on `self` and `other` may be combined: the same layout of the same
    /// ranks ([`Error::MeshMismatch`] otherwise) on the same device ([`Error::DeviceMismatch`]).
    pub fn check_compatible(&self, other: &DeviceMesh, context: &str) -> Result<()> {
        if !self.same_as(other) {
            return Err(Error::MeshMismatch {
                context: context.into(),
                left: self.to_string(),
                right: other.to_string(),
            });
        }
        if self.device() != other.device() {
            return Err(Error::DeviceMismatch {
                context: context.into(),
                left: self.device().to_string(),
                right: other.device().to_string(),
            });
        }
        Ok(())
    }

    /// Index of the mesh dimension called `name`.
    pub fn dim_index(&self, name: &str) -> Result<usize> {
        self.inner
            .names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| Error::UnknownMeshDim { name: name.into(), available: self.inner.names.clone() })
    }

    /// Coordinate of mesh position of global rank `rank`.
    pub fn coordinate_of(&self, rank: usize) -> Result<Vec<usize>> {
        let pos = self
            .inner
            .ranks
            .iter()
            .position(|&r| r == rank)
            .ok_or(Error::RankOutOfRange { rank, world_size: self.numel() })?;
        Ok(unravel(pos, &self.inner.shape))
    }

    /// Global rank at a mesh coordinate.
    pub fn rank_at(&self, coord: &[usize]) -> Result<usize> {
        if coord.len() != self.ndim() || coord.iter().zip(self.shape()).any(|(c, s)| c >= s) {
            return Err(Error::InvalidArgument {
                context: "DeviceMesh::rank_at".into(),
                reason: format!("coordinate {coord:?} is outside mesh shape {:?}", self.shape()),
            });
        }
        Ok(self.inner.ranks[ravel(coord, &self.inner.shape)])
    }

    /// Every group along mesh dim `dim` (a partition of the mesh's ranks).
    ///
    /// # Panics
    /// If `dim >= self.ndim()`, like [`size`](Self::size).
    pub fn all_groups(&self, dim: usize) -> Vec<Vec<usize>> {
        self.check_dim(dim);
        let mut out: Vec<Vec<usize>> = Vec::new();
        for pos in 0..self.numel() {
            let c = unravel(pos, &self.inner.shape);
            if c[dim] == 0 {
                out.push(group_of(&self.inner, dim, &c));
            }
        }
        out
    }

    /// The 1-d sub-mesh of this rank's group along the named dimension (`mesh["tp"]` in PyTorch).
    pub fn submesh(&self, name: &str) -> Result<DeviceMesh> {
        self.submesh_dims(&[name])
    }

    /// The sub-mesh spanned by several named dims (in the given order), through this rank.
    pub fn submesh_dims(&self, names: &[&str]) -> Result<DeviceMesh> {
        let dims: Vec<usize> = names.iter().map(|n| self.dim_index(n)).collect::<Result<_>>()?;
        for (i, d) in dims.iter().enumerate() {
            if dims[..i].contains(d) {
                return Err(Error::DuplicateMeshDim { name: names[i].to_string() });
            }
        }
        let shape: Vec<usize> = dims.iter().map(|&d| self.size(d)).collect();
        let mut ranks = Vec::with_capacity(shape.iter().product());
        let mut c = self.inner.coord.clone();
        for pos in 0..shape.iter().product() {
            let sub = unravel(pos, &shape);
            for (k, &d) in dims.iter().enumerate() {
                c[d] = sub[k];
            }
            ranks.push(self.inner.ranks[ravel(&c, &self.inner.shape)]);
        }
        let sub = Self::build(Arc::clone(&self.inner.comm), &shape, names, ranks)?;
        sub.set_collective_checks(self.collective_checks());
        Ok(sub)
    }

    /// This mesh with dim `name` split into dims of `sizes` named `names` (PyTorch
    /// `DeviceMesh._unflatten`): the same ranks in the same row-major order, so the last new
    /// dim's groups are runs of consecutive coordinates of the old dim (with node-major ranks,
    /// the ranks of one node). Collective: on a mesh spanning the communicator's world,
    /// backends with sub-communicators (MPI, NCCL) create the new groups now (on a sub-mesh
    /// they are made on first use, as a sub-mesh's are), so every rank calls it alike. The
    /// split is made once per mesh and arguments: calling it again returns the same mesh.
    ///
    /// ```
    /// let groups = dtensor_runtime::run(4, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[4], &["dp"])?;
    ///     let split = mesh.unflatten("dp", &[2, 2], &["node", "local"])?;
    ///     Ok((split.shape().to_vec(), split.group(1).to_vec()))
    /// }).unwrap();
    /// assert_eq!(groups[3], (vec![2, 2], vec![2, 3]));
    /// ```
    pub fn unflatten(&self, name: &str, sizes: &[usize], names: &[&str]) -> Result<DeviceMesh> {
        let dim = self.dim_index(name)?;
        let product = crate::shape::checked_numel("device mesh", sizes)?;
        if sizes.is_empty() || product != self.size(dim) || names.len() != sizes.len() {
            return Err(Error::InvalidMesh {
                reason: format!(
                    "cannot split mesh dim `{name}` of size {} into {sizes:?} named {names:?}: the sizes must \
                     multiply to its size, one name each",
                    self.size(dim)
                ),
            });
        }
        let key = (dim, sizes.to_vec(), names.iter().map(|n| n.to_string()).collect::<Vec<_>>());
        let mut made = self.inner.unflattened.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = made.get(&key) {
            return Ok(m.clone());
        }
        let mut shape = self.inner.shape.clone();
        shape.splice(dim..=dim, sizes.iter().copied());
        let mut all: Vec<&str> = self.inner.names.iter().map(|n| n.as_str()).collect();
        all.splice(dim..=dim, names.iter().copied());
        let mesh = Self::build(Arc::clone(&self.inner.comm), &shape, &all, self.inner.ranks.clone())?;
        mesh.set_collective_checks(self.collective_checks());
        if self.numel() == self.inner.comm.world_size() {
            mesh.inner.comm.prepare_groups(&mesh.prepared_partitions())?;
        }
        made.insert(key, mesh.clone());
        Ok(mesh)
    }

    /// Same layout of the same ranks (communicators are not compared).
    pub fn same_as(&self, other: &DeviceMesh) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || (self.inner.shape == other.inner.shape
                && self.inner.names == other.inner.names
                && self.inner.ranks == other.inner.ranks)
    }
}

// ------------------------------------------------------------------ collectives
// The typed collectives on a mesh dim: the only way redistribution and ops talk to a
// backend. Every call is recorded for `CommDebugMode` and, when enabled, fingerprinted.

/// Which ranks a collective runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Along {
    /// This rank's group along one mesh dimension.
    Dim(usize),
    /// Every rank of the mesh.
    All,
}

impl DeviceMesh {
    fn group_of(&self, along: Along) -> Result<(&[usize], Option<usize>)> {
        match along {
            Along::Dim(d) if d >= self.ndim() => {
                Err(Error::MeshDimOutOfRange { context: format!("collective on {self}"), dim: d, ndim: self.ndim() })
            }
            Along::Dim(d) => Ok((self.group(d), Some(d))),
            Along::All => Ok((self.ranks(), None)),
        }
    }

    /// Records a collective; `along` was checked by `group_of` first. A group of one rank
    /// records nothing: its "collective" is a local copy, and a plan of the step's
    /// communication (`CommDebugMode`) should not change with a mesh dim of size 1.
    fn note(&self, kind: CollectiveKind, along: Along, bytes: usize) {
        let Ok((g, d)) = self.group_of(along) else { return };
        if g.len() == 1 {
            return;
        }
        record(kind, d.map(|d| self.dim_names()[d].as_str()), g.len(), bytes);
    }

    /// Prepares a collective on `g`: first completes what this thread started in the
    /// background on `g` (so the call cannot overtake it), then, with the fingerprint check
    /// on, agrees with the group on this call before it runs (a group of one has nobody to
    /// agree with: nothing is sent).
    #[allow(clippy::too_many_arguments)] // the fields of a fingerprint
    fn agree(
        &self,
        g: &[usize],
        kind: CollectiveKind,
        dtype: Option<DType>,
        count: usize,
        root: Option<usize>,
        op: Option<ReduceOp>,
        detail: u64,
    ) -> Result<()> {
        in_flight::settle(g);
        if g.len() == 1 || !self.collective_checks() {
            return Ok(());
        }
        let comm = self.comm();
        let seq = comm.sequences().map_or(0, |s| s.next(g));
        let dtype = match dtype {
            Some(d) => d.name(),
            None if kind == CollectiveKind::Barrier => "",
            None => "u64",
        };
        fingerprint::agree(comm.as_ref(), g, Fingerprint { seq, kind, dtype, count, root, op, detail })
    }

    /// Runs `run` (a collective of the communicator, on host or device buffers) on the group of
    /// `along`, recorded for `CommDebugMode` and, with the fingerprint check on, agreed first:
    /// the prologue of every equal-block collective below and of the collectives on storage
    /// (`mesh/storage.rs`). `count` elements of `dtype` (`bytes` bytes; `None`: `u64`
    /// metadata) go in; a reduction `op` is checked against `dtype` first.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn collective<R>(
        &self,
        kind: CollectiveKind,
        along: Along,
        dtype: Option<DType>,
        count: usize,
        root: Option<usize>,
        op: Option<ReduceOp>,
        bytes: usize,
        run: impl FnOnce(&dyn Communicator, &[usize]) -> Result<R>,
    ) -> Result<R> {
        let (g, _) = self.group_of(along)?;
        if let (Some(dtype), Some(op)) = (dtype, op) {
            crate::comm::reduce::check_op(dtype, op)?;
        }
        self.note(kind, along, bytes);
        self.agree(g, kind, dtype, count, root, op, 0)?;
        run(self.comm().as_ref(), g)
    }

    /// All-gather equal-sized blocks; returns `n * send.len()` elements in group order.
    pub fn all_gather<T: Scalar>(&self, along: Along, send: &[T]) -> Result<Vec<T>> {
        let bytes = std::mem::size_of_val(send);
        self.collective(CollectiveKind::AllGather, along, Some(T::DTYPE), send.len(), None, None, bytes, |c, g| {
            // SAFETY (of `filled`): a `Communicator` writes all of its receive buffer on `Ok`.
            unsafe { filled("all_gather", send.len() * g.len(), |r| c.all_gather(g, host(send), r.into())) }
        })
    }

    /// All-reduce in place.
    pub fn all_reduce<T: Scalar>(&self, along: Along, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let (count, bytes) = (buf.len(), std::mem::size_of_val(buf));
        self.collective(CollectiveKind::AllReduce, along, Some(T::DTYPE), count, None, Some(op), bytes, |c, g| {
            c.all_reduce(g, BufInOut::Host(bytemuck::cast_slice_mut(buf)), T::DTYPE, op)
        })
    }

    /// All-reduce out of place: the reduction of every member's `send`, in a fresh buffer
    /// (`send` is left as it is, and not copied first).
    pub fn all_reduce_into<T: Scalar>(&self, along: Along, send: &[T], op: ReduceOp) -> Result<Vec<T>> {
        let (count, bytes) = (send.len(), std::mem::size_of_val(send));
        self.collective(CollectiveKind::AllReduce, along, Some(T::DTYPE), count, None, Some(op), bytes, |c, g| {
            // SAFETY (of `filled`): a `Communicator` writes all of its receive buffer on `Ok`.
            unsafe { filled("all_reduce", count, |r| c.all_reduce_into(g, host(send), r.into(), T::DTYPE, op)) }
        })
    }

    /// Starts an in-place all-reduce of `buf` that completes in the background, where the
    /// backend can (the thread backend on a per-rank worker thread, MPI through
    /// `MPI_Iallreduce`; other backends run it at once). [`PendingReduce::wait`] returns the
    /// reduced elements. Recorded as an all-reduce now, when it is issued.
    ///
    /// Until it is waited for, this thread's next collective on the same group (another start
    /// included) first waits for it, so that the calls meet their peers' in the same order;
    /// collectives on other groups run alongside it. Every rank must start its background
    /// collectives in the same order (as for blocking ones).
    ///
    /// ```
    /// use dtensor_runtime::{Along, ReduceOp};
    /// let sums = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
    ///     let pending = mesh.all_reduce_start(Along::Dim(0), vec![ctx.rank() as f32 + 1.0; 3], ReduceOp::Sum)?;
    ///     // ... work that does not need the sum ...
    ///     pending.wait()
    /// }).unwrap();
    /// assert_eq!(sums, vec![vec![3.0; 3], vec![3.0; 3]]);
    /// ```
    pub fn all_reduce_start<T: Scalar>(&self, along: Along, buf: Vec<T>, op: ReduceOp) -> Result<PendingReduce<T>> {
        let (count, bytes) = (buf.len(), std::mem::size_of_val(buf.as_slice()));
        self.all_reduce_start_of::<T, Vec<T>>(along, Box::new(buf), count, bytes, op, 0)
    }

    /// Starts an [`all_gather_v`](Self::all_gather_v) of `send` (this member's
    /// `counts[me]` elements) that completes in the background where the backend can (the
    /// thread backend on the rank's worker thread, MPI as an `MPI_Iallgatherv`; the device
    /// backends run it at once);
    /// [`PendingGather::wait`] returns every member's elements, back to back in group order.
    /// Recorded as an all-gather now; the ordering rules of
    /// [`all_reduce_start`](Self::all_reduce_start) apply. FSDP prefetches with it.
    ///
    /// ```
    /// use dtensor_runtime::Along;
    /// let all = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
    ///     let mine = vec![ctx.rank() as f32; ctx.rank() + 1]; // 1 and 2 elements
    ///     let pending = mesh.all_gather_v_start(Along::Dim(0), mine, &[1, 2])?;
    ///     pending.wait()
    /// }).unwrap();
    /// assert_eq!(all[0], vec![0.0, 1.0, 1.0]);
    /// ```
    pub fn all_gather_v_start<T: Scalar>(
        &self,
        along: Along,
        send: Vec<T>,
        counts: &[usize],
    ) -> Result<PendingGather<T>> {
        let bytes = std::mem::size_of_val(send.as_slice());
        self.all_gather_v_start_batch::<T>(along, vec![(Box::new(send), bytes, counts.to_vec())])
    }

    /// Starts a batch of [`all_gather_v`](Self::all_gather_v)s over one group, each of an owned
    /// host buffer of `bytes` bytes with its `counts` (elements per member), as one background
    /// job (so that none waits for the one before it, as separate starts on a group would);
    /// each is recorded and agreed now, in order (`mesh/storage.rs` starts shards).
    pub(crate) fn all_gather_v_start_batch<T: Scalar>(
        &self,
        along: Along,
        items: Vec<(Box<dyn OwnedBytes>, usize, Vec<usize>)>,
    ) -> Result<PendingGather<T>> {
        let (g, _) = self.group_of(along)?;
        let me = crate::comm::group_index("all_gather_v", self.rank(), g)?;
        let mut gathers = Vec::with_capacity(items.len());
        for (send, bytes, counts) in items {
            let total = variable::total("all_gather_v", &counts)?;
            let byte_counts = byte_counts::<T>("all_gather_v", &counts)?;
            variable::one_per_member("all_gather_v", "counts", &counts, g.len())?;
            if byte_counts[me] != bytes {
                return Err(Error::InvalidArgument {
                    context: "all_gather_v_start".into(),
                    reason: format!("this member sends {bytes} bytes, its count says {}", byte_counts[me]),
                });
            }
            self.note(CollectiveKind::AllGather, along, bytes);
            self.agree(g, CollectiveKind::AllGather, Some(T::DTYPE), total, None, None, counts_hash(&counts))?;
            let recv = vec![<T as bytemuck::Zeroable>::zeroed(); total];
            gathers.push(Gather { send, counts: byte_counts, recv: Box::new(recv) });
        }
        let len = gathers.len();
        let pending = self.comm().all_gather_v_start(g, gathers)?;
        Ok(PendingGather::register(g, pending, len))
    }

    /// [`all_reduce_start`](Self::all_reduce_start) of an owned buffer `B` of `count` elements
    /// `T` (`bytes` bytes; host or device memory: `mesh/storage.rs` starts `Storage`s) whose
    /// fingerprint also carries `detail` ([`Fingerprint::detail`]: what a gradient bucket
    /// holds), when the check is on.
    pub(crate) fn all_reduce_start_of<T: Scalar, B: 'static>(
        &self,
        along: Along,
        buf: Box<dyn OwnedBytes>,
        count: usize,
        bytes: usize,
        op: ReduceOp,
        detail: u64,
    ) -> Result<PendingReduce<T, B>> {
        let (g, _) = self.group_of(along)?;
        crate::comm::reduce::check_op(T::DTYPE, op)?;
        self.note(CollectiveKind::AllReduce, along, bytes);
        // A start first waits for this thread's previous start on the group, as a blocking
        // call does: one in flight per group. Queueing several (the backends would keep them
        // in order) measured slower on MPI, whose transfers progress only inside MPI calls,
        // so a wait at each start keeps the peers' transfers moving together (mlp_tp, 2x1,
        // 128/256/1024: 0.31–0.37 s against 0.39–0.43 s, plain 0.41–0.48 s); on the thread
        // backend it made no difference.
        self.agree(g, CollectiveKind::AllReduce, Some(T::DTYPE), count, None, Some(op), detail)?;
        let pending = self.comm().all_reduce_start(g, buf, T::DTYPE, op)?;
        Ok(PendingReduce::register(g, pending))
    }

    /// Reduce-scatter of `n` equal blocks; returns this member's reduced block.
    pub fn reduce_scatter<T: Scalar>(&self, along: Along, send: &[T], op: ReduceOp) -> Result<Vec<T>> {
        let (count, bytes) = (send.len(), std::mem::size_of_val(send));
        self.collective(CollectiveKind::ReduceScatter, along, Some(T::DTYPE), count, None, Some(op), bytes, |c, g| {
            // SAFETY (of `filled`): a `Communicator` writes all of its receive buffer on `Ok`.
            unsafe {
                filled("reduce_scatter", count / g.len().max(1), |r| {
                    c.reduce_scatter(g, host(send), r.into(), T::DTYPE, op)
                })
            }
        })
    }

    /// All-to-all of `n` equal blocks.
    pub fn all_to_all<T: Scalar>(&self, along: Along, send: &[T]) -> Result<Vec<T>> {
        let (count, bytes) = (send.len(), std::mem::size_of_val(send));
        self.collective(CollectiveKind::AllToAll, along, Some(T::DTYPE), count, None, None, bytes, |c, g| {
            // SAFETY (of `filled`): a `Communicator` writes all of its receive buffer on `Ok`.
            unsafe { filled("all_to_all", count, |r| c.all_to_all(g, host(send), r.into())) }
        })
    }

    /// All-to-all of the column blocks of a row-major `send` of `rows` rows of `n` runs of
    /// `run` elements: member `j` gets run `j` of every row; returns `n` contiguous blocks
    /// (`rows * run` elements each) in group order, as [`all_to_all`](Self::all_to_all) of
    /// the packed blocks would, without packing them first.
    pub fn all_to_all_strided<T: Scalar>(&self, along: Along, send: &[T], rows: usize, run: usize) -> Result<Vec<T>> {
        let (g, _) = self.group_of(along)?;
        self.note(CollectiveKind::AllToAll, along, std::mem::size_of_val(send));
        // Every member splits its rows alike (the thread backend checks it too).
        let layout = fingerprint::hash_words([rows as u64, run as u64]);
        self.agree(g, CollectiveKind::AllToAll, Some(T::DTYPE), send.len(), None, None, layout)?;
        let (es, send_bytes) = (std::mem::size_of::<T>(), bytemuck::cast_slice(send));
        // SAFETY (of `filled`): a `Communicator` writes all of its receive buffer on `Ok`.
        unsafe {
            filled("all_to_all", send.len(), |r| {
                self.comm().all_to_all_strided(g, Buf::Host(send_bytes), rows, run * es, r.into())
            })
        }
    }

    /// All-gather of blocks of different sizes (uneven shards): member `i` contributes
    /// `counts[i]` elements (this rank's are `send`); returns every member's, back to back in
    /// group order. Every member passes the same `counts`.
    ///
    /// ```
    /// use dtensor_runtime::Along;
    /// let got = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["x"])?;
    ///     // torch.chunk of 3 rows over 2 ranks: 2 and 1.
    ///     let mine: Vec<f32> = if ctx.rank() == 0 { vec![0.0, 1.0] } else { vec![2.0] };
    ///     mesh.all_gather_v(Along::Dim(0), &mine, &[2, 1])
    /// }).unwrap();
    /// assert_eq!(got[1], vec![0.0, 1.0, 2.0]);
    /// ```
    pub fn all_gather_v<T: Scalar>(&self, along: Along, send: &[T], counts: &[usize]) -> Result<Vec<T>> {
        let (g, _) = self.group_of(along)?;
        let total = variable::total("all_gather_v", counts)?;
        let bytes = byte_counts::<T>("all_gather_v", counts)?;
        self.note(CollectiveKind::AllGather, along, std::mem::size_of_val(send));
        self.agree(g, CollectiveKind::AllGather, Some(T::DTYPE), total, None, None, counts_hash(counts))?;
        // SAFETY (of `filled`): a `Communicator` writes all of its receive buffer on `Ok`.
        unsafe { filled("all_gather_v", total, |r| self.comm().all_gather_v(g, host(send), &bytes, r.into())) }
    }

    /// Reduce-scatter of blocks of different sizes: `send` holds one block per member, back to
    /// back, block `i` of `counts[i]` elements; returns the reduction of every member's block
    /// of this rank. Every member passes the same `counts`.
    pub fn reduce_scatter_v<T: Scalar>(
        &self,
        along: Along,
        send: &[T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<Vec<T>> {
        let (g, _) = self.group_of(along)?;
        crate::comm::reduce::check_op(T::DTYPE, op)?;
        let me = crate::comm::group_index("reduce_scatter_v", self.rank(), g)?;
        let bytes = byte_counts::<T>("reduce_scatter_v", counts)?;
        variable::one_per_member("reduce_scatter_v", "counts", counts, g.len())?;
        let mine = counts[me];
        self.note(CollectiveKind::ReduceScatter, along, std::mem::size_of_val(send));
        self.agree(g, CollectiveKind::ReduceScatter, Some(T::DTYPE), send.len(), None, Some(op), counts_hash(counts))?;
        let send_bytes = bytemuck::cast_slice(send);
        // SAFETY (of `filled`): a `Communicator` writes all of its receive buffer on `Ok`.
        unsafe {
            filled("reduce_scatter_v", mine, |r| {
                self.comm().reduce_scatter_v(g, Buf::Host(send_bytes), &bytes, r.into(), T::DTYPE, op)
            })
        }
    }

    /// All-to-all of blocks of different sizes: `send` is `rows` rows of one run per member
    /// (`runs[j]` elements for member `j`); members may differ in `rows` and `runs`. Returns
    /// what each member sends this rank, in group order: `recv_counts[i]` elements from member
    /// `i` (its run for us, row after row), which must be member `i`'s `rows × runs[me]`.
    /// `rows = 1` is a plain all-to-all of blocks of `runs[j]` elements. Every backend checks
    /// before any data moves that what each member sends each peer is what that peer expects
    /// (a typed error on every member otherwise); the fingerprint check compares the number of
    /// blocks, as the counts differ between members.
    pub fn all_to_all_v<T: Scalar>(
        &self,
        along: Along,
        send: &[T],
        rows: usize,
        runs: &[usize],
        recv_counts: &[usize],
    ) -> Result<Vec<T>> {
        let (g, _) = self.group_of(along)?;
        let total = variable::total("all_to_all_v", recv_counts)?;
        let run_bytes = byte_counts::<T>("all_to_all_v", runs)?;
        let recv_bytes = byte_counts::<T>("all_to_all_v", recv_counts)?;
        self.note(CollectiveKind::AllToAll, along, std::mem::size_of_val(send));
        self.agree(g, CollectiveKind::AllToAll, Some(T::DTYPE), runs.len(), None, None, 0)?;
        let send_bytes = bytemuck::cast_slice(send);
        // SAFETY (of `filled`): a `Communicator` writes all of its receive buffer on `Ok`.
        unsafe {
            filled("all_to_all_v", total, |r| {
                self.comm().all_to_all_v(g, Buf::Host(send_bytes), rows, &run_bytes, r.into(), &recv_bytes)
            })
        }
    }

    /// Broadcast from group member `root`.
    pub fn broadcast<T: Scalar>(&self, along: Along, buf: &mut [T], root: usize) -> Result<()> {
        let (count, bytes) = (buf.len(), std::mem::size_of_val(buf));
        self.collective(CollectiveKind::Broadcast, along, Some(T::DTYPE), count, Some(root), None, bytes, |c, g| {
            c.broadcast(g, BufInOut::Host(bytemuck::cast_slice_mut(buf)), root)
        })
    }

    /// Broadcast of `u64` metadata (shapes, counts: fixed width, so ranks of different
    /// pointer sizes agree).
    pub fn broadcast_u64(&self, along: Along, buf: &mut [u64], root: usize) -> Result<()> {
        let (count, bytes) = (buf.len(), std::mem::size_of_val(buf));
        self.collective(CollectiveKind::Broadcast, along, None, count, Some(root), None, bytes, |c, g| {
            c.broadcast(g, BufInOut::Host(bytemuck::cast_slice_mut(buf)), root)
        })
    }

    /// All-gather of `u64` metadata (shapes, counts).
    pub fn all_gather_u64(&self, along: Along, send: &[u64]) -> Result<Vec<u64>> {
        let (count, bytes) = (send.len(), std::mem::size_of_val(send));
        self.collective(CollectiveKind::AllGather, along, None, count, None, None, bytes, |c, g| {
            // SAFETY (of `filled`): a `Communicator` writes all of its receive buffer on `Ok`.
            unsafe { filled("all_gather", count * g.len(), |r| c.all_gather(g, host(send), r.into())) }
        })
    }

    /// Scatter `n` equal blocks of `block` elements from group member `root`.
    pub fn scatter<T: Scalar>(&self, along: Along, send: &[T], block: usize, root: usize) -> Result<Vec<T>> {
        let (g, _) = self.group_of(along)?;
        self.note(CollectiveKind::Scatter, along, std::mem::size_of_val(send));
        self.agree(g, CollectiveKind::Scatter, Some(T::DTYPE), block, Some(root), None, 0)?;
        // SAFETY (of `filled`): a `Communicator` writes all of its receive buffer on `Ok`.
        unsafe { filled("scatter", block, |r| self.comm().scatter(g, host(send), r.into(), root)) }
    }

    /// Barrier over the group.
    pub fn barrier(&self, along: Along) -> Result<()> {
        let (g, _) = self.group_of(along)?;
        self.note(CollectiveKind::Barrier, along, 0);
        self.agree(g, CollectiveKind::Barrier, None, 0, None, None, 0)?;
        self.comm().barrier(g)
    }
}

/// A typed host slice as a collective's input.
fn host<T: bytemuck::Pod>(send: &[T]) -> Buf<'_> {
    Buf::Host(bytemuck::cast_slice(send))
}

impl PartialEq for DeviceMesh {
    fn eq(&self, other: &Self) -> bool {
        self.same_as(other)
    }
}

impl fmt::Display for DeviceMesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> =
            self.inner.names.iter().zip(&self.inner.shape).map(|(n, s)| format!("{n}={s}")).collect();
        write!(f, "DeviceMesh({})", dims.join(", "))
    }
}

impl fmt::Debug for DeviceMesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self} ranks={:?} backend={}", self.inner.ranks, self.inner.comm.backend())
    }
}

/// [`Fingerprint::detail`] of a variable-size collective: its per-member counts.
fn counts_hash(counts: &[usize]) -> u64 {
    fingerprint::hash_words(counts.iter().map(|&c| c as u64))
}

/// Element counts as byte counts of `T`.
fn byte_counts<T>(op: &str, counts: &[usize]) -> Result<Vec<usize>> {
    let es = std::mem::size_of::<T>();
    counts
        .iter()
        .map(|&c| {
            c.checked_mul(es).ok_or_else(|| Error::BufferMismatch {
                op: op.into(),
                reason: format!("{c} elements of {es} bytes overflow"),
            })
        })
        .collect()
}

/// The allocation target of a communicator's rank: the host, or its CUDA device handle.
fn target_of(comm: &dyn Communicator) -> Result<Target> {
    match comm.device() {
        Device::Cpu => Ok(Target::Cpu),
        Device::Cuda(k) => match comm.cuda_device() {
            Some(d) if d.ordinal() == k => Ok(Target::Cuda(d)),
            _ => Err(Error::Unavailable {
                what: format!("the CUDA device handle of the `{}` communicator", comm.backend()),
                reason: format!("it reports device cuda:{k} but provides no handle for that ordinal"),
            }),
        },
    }
}

fn group_of(m: &MeshInner, dim: usize, coord: &[usize]) -> Vec<usize> {
    let mut c = coord.to_vec();
    (0..m.shape[dim])
        .map(|k| {
            c[dim] = k;
            m.ranks[ravel(&c, &m.shape)]
        })
        .collect()
}

fn unravel(mut pos: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for i in (0..shape.len()).rev() {
        c[i] = pos % shape[i];
        pos /= shape[i];
    }
    c
}

fn ravel(coord: &[usize], shape: &[usize]) -> usize {
    coord.iter().zip(shape).fold(0, |acc, (c, s)| acc * s + c)
}

/// Parses `"dp=2,tp=4"` into names and sizes.
pub fn parse_mesh_spec(spec: &str) -> Result<(Vec<String>, Vec<usize>)> {
    let mut names = vec![];
    let mut shape = vec![];
    if spec.trim().is_empty() {
        return Err(Error::InvalidMesh { reason: "empty mesh spec".into() });
    }
    for part in spec.split(',') {
        let (n, s) = part.split_once('=').ok_or_else(|| Error::InvalidMesh {
            reason: format!("`{part}` is not `name=size` (full spec: `{spec}`)"),
        })?;
        let size = s
            .trim()
            .parse::<usize>()
            .map_err(|_| Error::InvalidMesh { reason: format!("size `{s}` of mesh dim `{n}` is not a number") })?;
        names.push(n.trim().to_string());
        shape.push(size);
    }
    Ok((names, shape))
}
