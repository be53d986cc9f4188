//! `DTensor<T>`: a logical (global) tensor laid out over a [`DeviceMesh`].

use crate::autograd::AutogradMeta;
use crate::device::Device;
use crate::element::{DType, Scalar};
use crate::error::{Error, Result};
use crate::layout::pack;
use crate::layout::{checked_global_shape_from_local, local_shape_and_offset};
use crate::mesh::storage as mesh_storage;
use crate::mesh::DeviceMesh;
use crate::placement::{fmt_placements, normalize_placements, Placement, ReduceOp};
use crate::shape::contiguous_strides;
use crate::storage::{pack_host, Storage};
use crate::Along;
use ndarray::{ArrayD, IxDyn};
use std::fmt;
use std::sync::Arc;

/// A distributed tensor: this rank's local shard plus the metadata that says how the
/// global tensor is laid out over the mesh (one [`Placement`] per mesh dimension).
///
/// The shard lives on the mesh's device ([`DeviceMesh::device`]): host memory, or a CUDA
/// device when the communicator provides one.
#[derive(Clone)]
pub struct DTensor<T: Scalar> {
    /// Shared, copy-on-write: clones and `detach` (which autograd uses to save inputs) share
    /// the shard as PyTorch's tensors share storage; a write copies only if it is shared.
    pub(crate) local: Arc<Storage<T>>,
    pub(crate) mesh: DeviceMesh,
    pub(crate) placements: Vec<Placement>,
    pub(crate) shape: Vec<usize>,
    pub(crate) stride: Vec<usize>,
    pub(crate) autograd: AutogradMeta<T>,
}

/// Options of [`from_local`] (PyTorch's keyword arguments).
#[derive(Debug, Clone, Default)]
pub struct FromLocal {
    /// All-gather metadata to check consistency, and broadcast replicated data from the first
    /// rank of each replicate group.
    pub run_check: bool,
    /// Global shape (needed for uneven sharding). Goes with `stride`.
    pub shape: Option<Vec<usize>>,
    /// Global stride. Goes with `shape`.
    pub stride: Option<Vec<usize>>,
    /// Placements the gradient flowing back into the local tensor has (default: same as
    /// forward). Used by [`from_local_grad`](crate::from_local_grad), whose input is a local
    /// tensor with history; [`from_local`] only checks it (an `ndarray` receives no gradient).
    pub grad_placements: Option<Vec<Placement>>,
}

impl FromLocal {
    /// `run_check = true`, everything else default.
    pub fn checked() -> Self {
        FromLocal { run_check: true, ..Default::default() }
    }
    /// Global shape with contiguous stride (uneven sharding). A shape too large for
    /// [`checked_numel`](crate::shape::checked_numel) is reported by [`from_local`].
    pub fn with_shape(shape: &[usize]) -> Self {
        let stride = crate::shape::checked_strides("FromLocal::with_shape", shape).unwrap_or_default();
        FromLocal { shape: Some(shape.to_vec()), stride: Some(stride), ..Default::default() }
    }
}

/// Anything [`distribute_tensor`] accepts: a full ndarray or [`Storage`] (a device one is read
/// through a host copy), or a DTensor (returned as is when the layout matches).
pub trait DistributeSource<T: Scalar> {
    #[doc(hidden)]
    fn distribute_source(self, mesh: &DeviceMesh, placements: &[Placement], src: Option<usize>) -> Result<DTensor<T>>;
}

impl<T: Scalar> DistributeSource<T> for &ArrayD<T> {
    fn distribute_source(self, mesh: &DeviceMesh, placements: &[Placement], src: Option<usize>) -> Result<DTensor<T>> {
        distribute_array(self, mesh, placements, src)
    }
}

impl<T: Scalar> DistributeSource<T> for ArrayD<T> {
    fn distribute_source(self, mesh: &DeviceMesh, placements: &[Placement], src: Option<usize>) -> Result<DTensor<T>> {
        distribute_array(&self, mesh, placements, src)
    }
}

impl<T: Scalar> DistributeSource<T> for &Storage<T> {
    fn distribute_source(self, mesh: &DeviceMesh, placements: &[Placement], src: Option<usize>) -> Result<DTensor<T>> {
        match self.as_cpu() {
            Some(a) => distribute_array(a, mesh, placements, src),
            None => distribute_array(&self.to_host()?, mesh, placements, src),
        }
    }
}

impl<T: Scalar> DistributeSource<T> for Storage<T> {
    fn distribute_source(self, mesh: &DeviceMesh, placements: &[Placement], src: Option<usize>) -> Result<DTensor<T>> {
        (&self).distribute_source(mesh, placements, src)
    }
}

impl<T: Scalar> DistributeSource<T> for &DTensor<T> {
    fn distribute_source(self, mesh: &DeviceMesh, placements: &[Placement], _src: Option<usize>) -> Result<DTensor<T>> {
        let wanted = normalize_placements(placements, self.ndim(), mesh.ndim())?;
        if self.mesh.same_as(mesh) && self.mesh.device() == mesh.device() && wanted == self.placements {
            return Ok(self.clone());
        }
        Err(Error::AlreadyDistributed {
            existing: format!("{} on {}", fmt_placements(&self.placements), self.mesh),
            requested: format!("{} on {mesh}", fmt_placements(&wanted)),
        })
    }
}

/// Distributes a full tensor over `mesh` (PyTorch `distribute_tensor`).
///
/// With `src_data_rank = Some(r)` only rank `r`'s data is used: it is scattered (Shard) or
/// broadcast (Replicate); other ranks' tensors only need the right shape. With `None` every
/// rank holds the full tensor and slices its shard locally (no communication). `Partial`
/// placements are rejected.
///
/// ```
/// use dtensor_runtime::{run, distribute_tensor, Shard, Replicate};
/// let shapes = run(4, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
///     let t = ndarray::ArrayD::<f64>::ones(vec![6, 5]);
///     let dt = distribute_tensor(&t, &mesh, &[Shard(0), Shard(1)], Some(0))?;
///     Ok(dt.local().shape().to_vec())
/// }).unwrap();
/// assert_eq!(shapes, vec![vec![3, 3], vec![3, 2], vec![3, 3], vec![3, 2]]);
/// ```
pub fn distribute_tensor<T: Scalar, S: DistributeSource<T>>(
    tensor: S,
    mesh: &DeviceMesh,
    placements: &[Placement],
    src_data_rank: Option<usize>,
) -> Result<DTensor<T>> {
    tensor.distribute_source(mesh, placements, src_data_rank)
}

fn distribute_array<T: Scalar>(
    tensor: &ArrayD<T>,
    mesh: &DeviceMesh,
    placements: &[Placement],
    src_data_rank: Option<usize>,
) -> Result<DTensor<T>> {
    let placements = normalize_placements(placements, tensor.ndim(), mesh.ndim())?;
    if let Some(p) = placements.iter().find(|p| p.is_partial()) {
        return Err(Error::PartialNotAllowed { placement: *p, context: "distribute_tensor".into() });
    }
    let (local_shape, local_offset) =
        local_shape_and_offset(tensor.shape(), mesh.shape(), mesh.coordinate(), &placements);
    // The shard is cut on the host, then placed on the mesh's device.
    let local = match src_data_rank {
        None => pack_host(tensor, &pack::slice(tensor.shape(), &local_offset, &local_shape))?,
        Some(src) => {
            let root = mesh
                .ranks()
                .iter()
                .position(|&r| r == src)
                .ok_or(Error::RankOutOfRange { rank: src, world_size: mesh.numel() })?;
            // Every rank must agree with the source about the global shape.
            let mine = shape_meta(tensor.shape())?;
            let mut meta = mine.clone();
            mesh.broadcast_u64(Along::All, &mut meta, root)?;
            if meta != mine {
                return Err(Error::InconsistentAcrossRanks {
                    context: "distribute_tensor: shape of the tensor passed on each rank".into(),
                    rank: mesh.rank(),
                    reference_rank: src,
                    expected: meta_shape(&meta),
                    actual: tensor.shape().to_vec(),
                });
            }
            if placements.iter().all(|p| p.is_replicate()) {
                let mut data: Vec<T> = tensor.iter().copied().collect();
                mesh.broadcast(Along::All, &mut data, root)?;
                ArrayD::from_shape_vec(IxDyn(tensor.shape()), data).expect("shape of broadcast data")
            } else {
                // One scatter of every rank's shard (padded to the largest) from the source,
                // packed by one plan.
                let boxes: Vec<(Vec<usize>, Vec<usize>)> = mesh
                    .ranks()
                    .iter()
                    .map(|&r| {
                        let c = mesh.coordinate_of(r)?;
                        let (shape, offset) = local_shape_and_offset(tensor.shape(), mesh.shape(), &c, &placements);
                        Ok((offset, shape))
                    })
                    .collect::<Result<_>>()?;
                let block = boxes.iter().map(|(_, s)| s.iter().product::<usize>()).max().unwrap_or(0);
                let send: Vec<T> = if mesh.rank() == src {
                    let plan = pack::gather_boxes(tensor.shape(), &boxes, block);
                    pack_host(tensor, &plan)?.into_raw_vec_and_offset().0
                } else {
                    Vec::new()
                };
                let mut got = mesh.scatter(Along::All, &send, block, root)?;
                got.truncate(local_shape.iter().product());
                ArrayD::from_shape_vec(IxDyn(&local_shape), got).expect("local shard shape")
            }
        }
    };
    let local = Storage::from_host(local, mesh.target())?;
    Ok(DTensor::new_unchecked(local, mesh.clone(), placements, tensor.shape().to_vec(), None))
}

/// Wraps each rank's local tensor as a DTensor without moving data (PyTorch `from_local`).
///
/// Without `shape` the global shape assumes even sharding (local size × mesh size on every
/// sharded dim). Default placements in PyTorch are all-Replicate; pass `&[]` for that.
///
/// ```
/// use dtensor_runtime::{run, from_local, FromLocal, Shard};
/// let shapes = run(2, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
///     let local = ndarray::ArrayD::<f32>::zeros(vec![3 - ctx.rank(), 4]);
///     let dt = from_local(local, &mesh, &[Shard(0)], FromLocal { run_check: true, ..FromLocal::with_shape(&[5, 4]) })?;
///     Ok(dt.shape().to_vec())
/// }).unwrap();
/// assert_eq!(shapes[1], vec![5, 4]);
/// ```
///
/// The local data may be a host array or a [`Storage`] on the mesh's device; a host array is
/// placed on the mesh's device, storage on another device is an [`Error::DeviceMismatch`].
pub fn from_local<T: Scalar>(
    local: impl Into<Storage<T>>,
    mesh: &DeviceMesh,
    placements: &[Placement],
    opts: FromLocal,
) -> Result<DTensor<T>> {
    let local = on_mesh_device(local.into(), mesh, "from_local")?;
    let replicate_all;
    let placements = if placements.is_empty() {
        replicate_all = vec![Placement::Replicate; mesh.ndim()];
        &replicate_all[..]
    } else {
        placements
    };
    let placements = normalize_placements(placements, local.ndim(), mesh.ndim())?;
    let (shape, stride) = match (opts.shape, opts.stride) {
        (Some(s), Some(st)) => {
            crate::shape::checked_numel("from_local: global `shape`", &s)?;
            if s.len() != local.ndim() || st.len() != local.ndim() {
                return Err(Error::ShapeMismatch {
                    context: "from_local: rank of `shape`/`stride` vs local tensor".into(),
                    expected: vec![local.ndim()],
                    actual: vec![s.len(), st.len()],
                });
            }
            let (expected, _) = local_shape_and_offset(&s, mesh.shape(), mesh.coordinate(), &placements);
            if expected != local.shape() {
                return Err(Error::ShapeMismatch {
                    context: format!(
                        "from_local: local shard on rank {} for global shape {s:?} with {}",
                        mesh.rank(),
                        fmt_placements(&placements)
                    ),
                    expected,
                    actual: local.shape().to_vec(),
                });
            }
            (s, st)
        }
        (None, None) => {
            let s = checked_global_shape_from_local(local.shape(), mesh.shape(), &placements)?;
            let st = contiguous_strides(&s);
            (s, st)
        }
        (s, st) => return Err(Error::ShapeStrideTogether { shape_given: s.is_some(), stride_given: st.is_some() }),
    };
    let mut local = local;
    if opts.run_check {
        check_consistency(local.shape(), mesh, &placements, &shape)?;
        for (i, p) in placements.iter().enumerate() {
            if p.is_replicate() && mesh.size(i) > 1 {
                local = mesh_storage::broadcast(mesh, Along::Dim(i), local, 0)?;
            }
        }
    }
    let mut dt = DTensor::new_unchecked(local, mesh.clone(), placements, shape, None);
    dt.stride = stride;
    crate::autograd::on_from_local(&mut dt, opts.grad_placements)?;
    Ok(dt)
}

/// `local` on the mesh's device: host data is copied there, data already there is kept,
/// data on another device is an [`Error::DeviceMismatch`].
fn on_mesh_device<T: Scalar>(local: Storage<T>, mesh: &DeviceMesh, context: &str) -> Result<Storage<T>> {
    match (local.device(), mesh.device()) {
        (a, b) if a == b => Ok(local),
        (Device::Cpu, _) => Storage::from_host(local.into_host()?, mesh.target()),
        (a, b) => Err(Error::DeviceMismatch { context: context.into(), left: a.to_string(), right: b.to_string() }),
    }
}

/// Largest tensor rank whose shape travels in a metadata message.
const MAX_META_NDIM: usize = 16;

fn shape_meta(shape: &[usize]) -> Result<Vec<u64>> {
    if shape.len() > MAX_META_NDIM {
        return Err(Error::Unsupported {
            op: "distribute".into(),
            reason: format!("tensor rank {} > {MAX_META_NDIM}", shape.len()),
        });
    }
    let mut meta = vec![0u64; 1 + MAX_META_NDIM];
    meta[0] = shape.len() as u64;
    for (m, &s) in meta[1..].iter_mut().zip(shape) {
        *m = s as u64;
    }
    Ok(meta)
}

fn meta_shape(meta: &[u64]) -> Vec<usize> {
    let n = (meta[0] as usize).min(meta.len() - 1);
    meta[1..=n].iter().map(|&x| x as usize).collect()
}

const REDUCE_OPS: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product];

/// A placement as one metadata word: kind in the low byte, shard dim or reduce op above it.
fn placement_code(p: &Placement) -> u64 {
    match *p {
        Placement::Replicate => 1,
        Placement::Shard(d) => 2 | ((d as i64 as u64) << 8),
        Placement::Partial(op) => 3 | ((REDUCE_OPS.iter().position(|&o| o == op).unwrap_or(0) as u64) << 8),
    }
}

/// The placement a word from [`placement_code`] stands for, as text.
fn placement_of_code(c: u64) -> String {
    match c & 0xff {
        1 => Placement::Replicate.to_string(),
        2 => Placement::Shard((c >> 8) as i64 as isize).to_string(),
        3 => REDUCE_OPS.get((c >> 8) as usize).map_or("?".into(), |&op| Placement::Partial(op).to_string()),
        _ => "?".into(),
    }
}

/// All-gathers every rank's (ndim, global shape, local shape, placements) and checks them.
fn check_consistency(
    local_shape: &[usize],
    mesh: &DeviceMesh,
    placements: &[Placement],
    shape: &[usize],
) -> Result<()> {
    let mut meta = shape_meta(shape)?;
    meta.extend(shape_meta(local_shape)?);
    let shapes_len = meta.len();
    // One word per mesh dim (the mesh is the same on every rank): placements, Partial's
    // reduce op included, must agree too.
    meta.extend(placements.iter().map(placement_code));
    let all = mesh.all_gather_u64(Along::All, &meta)?;
    let len = meta.len();
    for (pos, &rank) in mesh.ranks().iter().enumerate() {
        let m = &all[pos * len..(pos + 1) * len];
        let codes = &m[shapes_len..];
        if codes != &meta[shapes_len..] {
            let theirs: Vec<String> = codes.iter().map(|&c| placement_of_code(c)).collect();
            return Err(Error::InconsistentAcrossRanks {
                context: format!(
                    "from_local(run_check): placements (codes below): rank {rank} has [{}], this rank {}",
                    theirs.join(", "),
                    fmt_placements(placements)
                ),
                rank,
                reference_rank: mesh.rank(),
                expected: meta[shapes_len..].iter().map(|&c| c as usize).collect(),
                actual: codes.iter().map(|&c| c as usize).collect(),
            });
        }
        let m = &m[..shapes_len];
        let len = shapes_len;
        let (r_shape, r_local) = (meta_shape(&m[..len / 2]), meta_shape(&m[len / 2..]));
        if r_shape != shape {
            return Err(Error::InconsistentAcrossRanks {
                context: "from_local(run_check): global shape".into(),
                rank,
                reference_rank: mesh.rank(),
                expected: shape.to_vec(),
                actual: r_shape,
            });
        }
        let c = mesh.coordinate_of(rank)?;
        let (expected, _) = local_shape_and_offset(shape, mesh.shape(), &c, placements);
        if r_local != expected {
            return Err(Error::InconsistentAcrossRanks {
                context: format!(
                    "from_local(run_check): local shard of global {shape:?} {}",
                    fmt_placements(placements)
                ),
                rank,
                reference_rank: mesh.rank(),
                expected,
                actual: r_local,
            });
        }
    }
    Ok(())
}

impl<T: Scalar> DTensor<T> {
    /// Element-type conversion of the data (no autograd history), with Rust's `as` rule
    /// (PyTorch's casts): floats round to nearest, floats into integers truncate toward zero
    /// and saturate, integers convert through i64 and wrap into a narrower integer.
    ///
    /// The conversion runs on each rank's shard, so a `Partial` tensor keeps its placement
    /// only where converting the terms and then reducing gives the conversion of the reduced
    /// value. Where it does not, the cast is an [`Error::PartialNotAllowed`] (reduce first:
    /// `redistribute` to Replicate or a Shard, then cast), never a silently different value:
    /// float to integer with `Partial(sum)`, `Partial(avg)` or `Partial(product)` (each term
    /// would truncate on its own: 0.6 + 0.6 gives 0, not 1; integers have no average),
    /// integer into a narrower integer with `Partial(max)` / `Partial(min)` (wrapping is not
    /// monotonic), and integer into a wider integer or a float with `Partial(sum)` /
    /// `Partial(product)` (a sum that wrapped in the integer type would not wrap). Float-to-float
    /// casts keep every Partial: max/min commute with rounding, and a sum or product rounds each
    /// term, as PyTorch's casts of partial tensors do.
    pub fn cast<U: Scalar>(&self) -> Result<DTensor<U>> {
        if let Some(&p) = self.placements.iter().find(|p| match p {
            Placement::Partial(op) => !cast_keeps_partial(T::DTYPE, U::DTYPE, *op),
            _ => false,
        }) {
            return Err(Error::PartialNotAllowed {
                placement: p,
                context: format!(
                    "cast from {} to {}: each rank's partial term would convert on its own and reduce to \
                     another value; reduce first (redistribute to Replicate or a Shard), then cast",
                    T::DTYPE,
                    U::DTYPE
                ),
            });
        }
        let local = self.local.cast::<U>()?;
        let mut d = DTensor::new_unchecked(local, self.mesh.clone(), self.placements.clone(), self.shape.clone(), None);
        d.stride = self.stride.clone();
        Ok(d)
    }

    /// Assembles a DTensor from parts that are known to be consistent.
    pub(crate) fn new_unchecked(
        local: impl Into<Arc<Storage<T>>>,
        mesh: DeviceMesh,
        placements: Vec<Placement>,
        shape: Vec<usize>,
        autograd: Option<AutogradMeta<T>>,
    ) -> Self {
        let stride = contiguous_strides(&shape);
        DTensor { local: local.into(), mesh, placements, shape, stride, autograd: autograd.unwrap_or_default() }
    }

    /// See [`from_local`].
    pub fn from_local(
        local: impl Into<Storage<T>>,
        mesh: &DeviceMesh,
        placements: &[Placement],
        opts: FromLocal,
    ) -> Result<Self> {
        from_local(local, mesh, placements, opts)
    }

    /// The local shard, where it lives (PyTorch `to_local()` without autograd or copy).
    pub fn local(&self) -> &Storage<T> {
        &self.local
    }
    /// The local shard's host array; [`Error::Unsupported`] when it lives on a device (use
    /// [`DTensor::to_host`] there).
    pub fn local_cpu(&self) -> Result<&ArrayD<T>> {
        self.local.cpu("DTensor::local_cpu")
    }
    /// A host copy of the local shard (from any device).
    pub fn to_host(&self) -> Result<ArrayD<T>> {
        self.local.to_host()
    }
    /// The local shard, owned, on its device (PyTorch `to_local()`).
    pub fn to_local(&self) -> Storage<T> {
        Storage::clone(&self.local)
    }
    /// Consumes the DTensor and returns the local shard (without copying unless another
    /// DTensor shares it).
    pub fn into_local(self) -> Storage<T> {
        Arc::unwrap_or_clone(self.local)
    }
    /// The device the local shard lives on (the mesh's).
    pub fn device(&self) -> Device {
        self.local.device()
    }
    /// The mesh.
    pub fn device_mesh(&self) -> &DeviceMesh {
        &self.mesh
    }
    /// Placements, one per mesh dimension (normalised: no negative shard dims).
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }
    /// Global (logical) shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Global stride.
    pub fn stride(&self) -> &[usize] {
        &self.stride
    }
    /// Tensor rank.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements of the global tensor.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Global offset of this rank's shard.
    pub fn local_offset(&self) -> Vec<usize> {
        local_shape_and_offset(&self.shape, self.mesh.shape(), self.mesh.coordinate(), &self.placements).1
    }
    /// The global tensor on every rank, on the host: redistribute to all-Replicate, then the
    /// local data (copied from a device).
    pub fn full_tensor(&self) -> Result<ArrayD<T>> {
        let r = vec![Placement::Replicate; self.mesh.ndim()];
        self.redistribute(&r)?.into_local().into_host()
    }
}

impl<T: Scalar> fmt::Debug for DTensor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DTensor(shape={:?}, placements={}, mesh={}, rank={}, local_shape={:?})",
            self.shape,
            fmt_placements(&self.placements),
            self.mesh,
            self.mesh.rank(),
            self.local.shape()
        )
    }
}

/// Whether converting every rank's term of a `Partial(op)` tensor from `from` to `to` and then
/// reducing gives the conversion of the reduced value (see [`DTensor::cast`]).
pub(crate) fn cast_keeps_partial(from: DType, to: DType, op: ReduceOp) -> bool {
    let order = matches!(op, ReduceOp::Max | ReduceOp::Min);
    match (from.is_float(), to.is_float()) {
        // Rounding is monotonic (max/min commute); sums and products round as float ops do.
        (true, true) => true,
        // Monotonic too; but an integer sum or product that wrapped would not wrap in a float.
        (false, true) => order,
        // Truncation toward zero with saturation is monotonic, but not additive.
        (true, false) => order,
        (false, false) if from == to => true,
        // Widening (sign or zero extension) keeps order; it does not keep a sum or product
        // that wrapped in the narrower type.
        (false, false) if to.size_of() > from.size_of() => order,
        // Wrapping into a narrower (or same-width) integer is a ring map: sums and products
        // commute with it, order does not (256 wraps below 10 in u8).
        (false, false) => matches!(op, ReduceOp::Sum | ReduceOp::Product),
    }
}
