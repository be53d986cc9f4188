//! Factories: `empty zeros ones full rand randn arange linspace logspace` build only this rank's
//! shard of a tensor of the given *global* size.

use crate::device::Target;
use crate::dtensor::DTensor;
use crate::element::{Element, Scalar};
use crate::error::{Error, Result};
use crate::launch::current_mesh;
use crate::layout::{local_shape_and_offset, shard_from_global_index};
use crate::mesh::DeviceMesh;
use crate::op::{Distribution, RandomFill};
use crate::placement::{normalize_placements, Placement};
use crate::rng;
use crate::storage::Storage;

/// Options of every factory (PyTorch's keyword arguments; the dtype is the element type).
///
/// ```
/// use dtensor_runtime::{run, ones, TensorOptions, Shard};
/// run(2, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
///     let t = ones::<f32>(&[3, 4], &TensorOptions::new().mesh(&mesh).placements(&[Shard(0)]))?;
///     assert_eq!(t.local().shape(), if ctx.rank() == 0 { &[2, 4] } else { &[1, 4] });
///     Ok(())
/// }).unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct TensorOptions {
    /// Mesh (default: the current mesh of this rank, see [`current_mesh`]).
    pub device_mesh: Option<DeviceMesh>,
    /// Placements (default: Replicate on every mesh dim).
    pub placements: Option<Vec<Placement>>,
    /// Track gradients.
    pub requires_grad: bool,
}

impl TensorOptions {
    /// Defaults: current mesh, all-Replicate, no grad.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the mesh.
    pub fn mesh(mut self, mesh: &DeviceMesh) -> Self {
        self.device_mesh = Some(mesh.clone());
        self
    }
    /// Sets the placements.
    pub fn placements(mut self, placements: &[Placement]) -> Self {
        self.placements = Some(placements.to_vec());
        self
    }
    /// Sets `requires_grad`.
    pub fn requires_grad(mut self, requires_grad: bool) -> Self {
        self.requires_grad = requires_grad;
        self
    }
}

/// Builds the shard of `shape` at `offset` on a target (a device random fill).
type ShardFn<'a, T> = &'a dyn Fn(&Target, &[usize], &[usize]) -> Result<Storage<T>>;

/// What a factory fills the local shard with.
enum Fill<'a, T: Scalar> {
    /// One value everywhere (a device fill).
    Value(T),
    /// Counter-based random numbers (a device Philox fill): the shard of `shape` at `offset`.
    Random(ShardFn<'a, T>),
    /// `f(global flat index)`, evaluated on the host, then placed on the mesh's device.
    Host(&'a dyn Fn(usize) -> T),
}

/// Builds this rank's shard of a tensor of global shape `size` on the mesh's device.
fn build<T: Scalar>(op: &str, size: &[usize], opts: &TensorOptions, fill: Fill<'_, T>) -> Result<DTensor<T>> {
    // The global shape first: its element count and byte size must exist before any shard
    // of it is laid out (the local shape of an overflowing one would be meaningless).
    crate::shape::checked_bytes::<T>(op, size)?;
    let mesh = match &opts.device_mesh {
        Some(m) => m.clone(),
        None => current_mesh().ok_or_else(|| Error::InvalidArgument {
            context: op.into(),
            reason: "no device mesh given and no current mesh (call init_device_mesh first)".into(),
        })?,
    };
    let placements = match &opts.placements {
        Some(p) => normalize_placements(p, size.len(), mesh.ndim())?,
        None => vec![Placement::Replicate; mesh.ndim()],
    };
    if let Some(p) = placements.iter().find(|p| p.is_partial()) {
        return Err(Error::PartialNotAllowed { placement: *p, context: op.into() });
    }
    let (shape, offset) = local_shape_and_offset(size, mesh.shape(), mesh.coordinate(), &placements);
    let local = match fill {
        Fill::Value(v) => Storage::full(mesh.target(), &shape, v)?,
        Fill::Random(f) => f(mesh.target(), &shape, &offset)?,
        Fill::Host(f) => Storage::from_host(shard_from_global_index(size, &offset, &shape, f)?, mesh.target())?,
    };
    let dt = DTensor::new_unchecked(local, mesh, placements, size.to_vec(), None);
    crate::autograd::with_requires_grad(dt, opts.requires_grad)
}

/// Uninitialised in PyTorch; zeros here (Rust never exposes uninitialised memory).
pub fn empty<T: Scalar>(size: &[usize], opts: &TensorOptions) -> Result<DTensor<T>> {
    build("empty", size, opts, Fill::Value(T::zero()))
}

/// All zeros.
pub fn zeros<T: Scalar>(size: &[usize], opts: &TensorOptions) -> Result<DTensor<T>> {
    build("zeros", size, opts, Fill::Value(T::zero()))
}

/// All ones.
pub fn ones<T: Scalar>(size: &[usize], opts: &TensorOptions) -> Result<DTensor<T>> {
    build("ones", size, opts, Fill::Value(T::one()))
}

/// Every element `fill_value`.
pub fn full<T: Scalar>(size: &[usize], fill_value: T, opts: &TensorOptions) -> Result<DTensor<T>> {
    build("full", size, opts, Fill::Value(fill_value))
}

/// Uniform in (0, 1); placement-invariant (see [`crate::rng`]).
///
/// ```
/// use dtensor_runtime::{run, rand, manual_seed, TensorOptions, Shard, Replicate};
/// let fulls = run(4, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2, 2], &[])?;
///     manual_seed(7);
///     let a = rand::<f32>(&[5, 3], &TensorOptions::new().placements(&[Shard(0), Shard(1)]))?;
///     manual_seed(7);
///     let b = rand::<f32>(&[5, 3], &TensorOptions::new().placements(&[Replicate, Replicate]))?;
///     Ok((a.full_tensor()?, b.full_tensor()?))
/// }).unwrap();
/// assert_eq!(fulls[0].0, fulls[0].1);
/// ```
pub fn rand<T: Element>(size: &[usize], opts: &TensorOptions) -> Result<DTensor<T>> {
    // Checked before the generator advances: a refused call leaves it where it was.
    let (seed, offset) = rng::reserve(crate::shape::checked_bytes::<T>("rand", size)? / std::mem::size_of::<T>());
    let fill = RandomFill { seed, offset, dist: Distribution::Uniform };
    build("rand", size, opts, Fill::Random(&|t, shape, at| Storage::random(t, &fill, size, at, shape)))
}

/// Standard normal; placement-invariant (see [`crate::rng`]).
pub fn randn<T: Element>(size: &[usize], opts: &TensorOptions) -> Result<DTensor<T>> {
    // Checked before the generator advances: a refused call leaves it where it was.
    let (seed, offset) = rng::reserve(crate::shape::checked_bytes::<T>("randn", size)? / std::mem::size_of::<T>());
    let fill = RandomFill { seed, offset, dist: Distribution::Normal };
    build("randn", size, opts, Fill::Random(&|t, shape, at| Storage::random(t, &fill, size, at, shape)))
}

/// A causal attention mask `[q_len, k_len]`: 1 where key `j ≤` query `i` (PyTorch's
/// `ones(L, S).tril()`, the mask of `is_causal=True`), else 0. Builds only this rank's shard
/// of the given placements.
///
/// ```
/// use dtensor_runtime::{run, causal_mask, TensorOptions, Shard};
/// let shards = run(2, |ctx| {
///     ctx.init_device_mesh(&[2], &["sp"])?;
///     let m = causal_mask::<f32>(4, 4, &TensorOptions::new().placements(&[Shard(0)]))?;
///     Ok(m.to_host()?.into_raw_vec_and_offset().0)
/// }).unwrap();
/// assert_eq!(shards[1], vec![1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
/// ```
pub fn causal_mask<T: Element>(q_len: usize, k_len: usize, opts: &TensorOptions) -> Result<DTensor<T>> {
    let cols = k_len.max(1);
    build(
        "causal_mask",
        &[q_len, k_len],
        opts,
        Fill::Host(&|i| if i % cols <= i / cols { T::one() } else { T::zero() }),
    )
}

/// A tensor whose element at global flat index `i` is `f(i)`; only this rank's shard is
/// computed.
pub(crate) fn from_fn<T: Scalar>(
    op: &str,
    size: &[usize],
    opts: &TensorOptions,
    f: &dyn Fn(usize) -> T,
) -> Result<DTensor<T>> {
    build(op, size, opts, Fill::Host(f))
}

/// The number of elements of `arange(start, end, step)`, or why there is none: a zero or
/// non-finite step, non-finite bounds, or a step whose sign points away from `end`. Integers
/// are counted exactly (in i128, no f64 rounding beyond 2⁵³); floats as PyTorch does,
/// `ceil((end - start) / step)` in f64.
fn arange_len<T: Scalar>(start: T, end: T, step: T) -> Result<usize> {
    let bad = |reason: String| Error::InvalidArgument { context: "arange".into(), reason };
    let n = if T::DTYPE.is_float() {
        let (a, b, s) = (start.as_f64(), end.as_f64(), step.as_f64());
        if !(a.is_finite() && b.is_finite() && s.is_finite()) {
            return Err(bad(format!("start {a}, end {b} and step {s} must be finite")));
        }
        if s == 0.0 {
            return Err(bad("step must be non-zero".into()));
        }
        let n = ((b - a) / s).ceil();
        if n < 0.0 {
            return Err(bad(format!("step {s} points away from end {b} (start {a})")));
        }
        if n > isize::MAX as f64 {
            return Err(bad(format!("{n} elements is too many")));
        }
        n as usize
    } else {
        let (a, b, s) = (start.as_i64() as i128, end.as_i64() as i128, step.as_i64() as i128);
        if s == 0 {
            return Err(bad("step must be non-zero".into()));
        }
        // ceil((b - a) / s) in exact integers.
        let n = (b - a + s - s.signum()) / s;
        if n < 0 {
            return Err(bad(format!("step {s} points away from end {b} (start {a})")));
        }
        usize::try_from(n).map_err(|_| bad(format!("{n} elements is too many")))?
    };
    Ok(n)
}

/// PyTorch `arange(start, end, step)`: `start, start + step, ...` up to but not including
/// `end` (1-D, global size `ceil((end - start) / step)`), in any element type; only this
/// rank's shard is computed. The bounds and the step are values of `T` (so an f32 step of
/// `0.3` is `0.3f32`). Integers are exact over their whole range; floats are `start + i·step`
/// computed in f64 and rounded once, as PyTorch's CPU kernel. A zero or
/// non-finite step, non-finite bounds, or a step of the wrong sign is an
/// [`Error::InvalidArgument`]; `start == end` is an empty tensor.
///
/// ```
/// use dtensor_runtime::{arange, run, Shard, TensorOptions};
/// let shards = run(2, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
///     let t = arange::<i64>(10, 0, -3, &TensorOptions::new().mesh(&mesh).placements(&[Shard(0)]))?;
///     Ok(t.to_host()?.into_raw_vec_and_offset().0)
/// })
/// .unwrap();
/// assert_eq!(shards, vec![vec![10, 7], vec![4, 1]]);
/// ```
pub fn arange<T: Scalar>(start: T, end: T, step: T, opts: &TensorOptions) -> Result<DTensor<T>> {
    let n = arange_len(start, end, step)?;
    if T::DTYPE.is_float() {
        let (a, s) = (start.as_f64(), step.as_f64());
        build("arange", &[n], opts, Fill::Host(&|i| T::of_f64(a + s * i as f64)))
    } else {
        // Every value lies between start and end, so it fits in i64; `step · i` alone may
        // not (start = i64::MIN, step = i64::MAX), hence i128.
        let (a, s) = (start.as_i64() as i128, step.as_i64() as i128);
        build("arange", &[n], opts, Fill::Host(&|i| T::of_i64((a + s * i as i128) as i64)))
    }
}

/// Value `i` of `linspace(start, end, steps)`, computed as PyTorch does (from both ends,
/// so the last element is exactly `end`).
pub fn linspace_value(start: f64, end: f64, steps: usize, i: usize) -> f64 {
    if steps <= 1 {
        return start;
    }
    let step = (end - start) / (steps - 1) as f64;
    if i < steps / 2 {
        start + step * i as f64
    } else {
        end - step * (steps - 1 - i) as f64
    }
}

/// `steps` evenly spaced values from `start` to `end` (1-D, global size `steps`).
pub fn linspace<T: Element>(start: f64, end: f64, steps: usize, opts: &TensorOptions) -> Result<DTensor<T>> {
    build("linspace", &[steps], opts, Fill::Host(&|i| T::of_f64(linspace_value(start, end, steps, i))))
}

/// `base ^ linspace(start, end, steps)`.
pub fn logspace<T: Element>(start: f64, end: f64, steps: usize, base: f64, opts: &TensorOptions) -> Result<DTensor<T>> {
    if base.is_nan() || base <= 0.0 {
        return Err(Error::InvalidArgument {
            context: "logspace".into(),
            reason: format!("base must be > 0, got {base}"),
        });
    }
    build("logspace", &[steps], opts, Fill::Host(&|i| T::of_f64(base.powf(linspace_value(start, end, steps, i)))))
}
