//! The host kernels: ndarray loops behind the [`Storage`](super::Storage) surface.
//!
//! Each kernel matches its op enum once, outside the loop, and runs a monomorphised closure
//! per element (no `dyn` call per element). Inputs may have any memory layout; outputs are
//! row-major (standard layout), which the pack plans and the collectives rely on.

use super::backend::BackendStorage;
use super::vmath::{self, Fast};
use crate::element::{DType, Element, Scalar};
use crate::error::{Error, Result};
use crate::layout::pack::{CopyBlock, PackPlan};
use crate::layout::shard_from_global_index;
use crate::op::{
    gelu, gelu_erf, gelu_erf_grad, gelu_grad, AdamWStep, BinaryOp, Distribution, RandomFill, Reduction, SgdStep,
    SoftmaxKind,
};
use crate::op::{with_unary_ops, UnaryOp};
use crate::rng::Stream;
use ndarray::{ArrayD, ArrayViewD, Axis, Dimension, IxDyn, Zip};
use std::borrow::Cow;

/// Row-major data of `a`, borrowed when `a` already is row-major.
pub(super) fn row_major<T: Scalar>(a: &ArrayD<T>) -> Cow<'_, [T]> {
    match a.as_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().copied().collect()),
    }
}

/// `a` as a row-major array, moved when it already is one.
pub(super) fn into_standard<T: Scalar>(a: ArrayD<T>) -> ArrayD<T> {
    if a.is_standard_layout() {
        a
    } else {
        a.as_standard_layout().into_owned()
    }
}

/// The first `shape.iter().product()` elements of `a` in row-major order, as an array of
/// `shape`, cutting the buffer short instead of copying it (when `a` is row-major from its
/// buffer's start; otherwise its elements are moved down first).
pub(super) fn into_prefix<T: Scalar>(a: ArrayD<T>, shape: &[usize]) -> Result<ArrayD<T>> {
    let n: usize = shape.iter().product();
    let len = a.len();
    if n > len {
        return Err(Error::ShapeMismatch {
            context: format!("prefix of a host buffer of {len} elements"),
            expected: shape.to_vec(),
            actual: vec![len],
        });
    }
    let (mut v, offset) = into_standard(a).into_raw_vec_and_offset();
    let start = offset.unwrap_or(0);
    v.truncate(start + n);
    v.drain(..start);
    from_vec(shape, v)
}

pub(super) fn from_vec<T: Scalar>(shape: &[usize], v: Vec<T>) -> Result<ArrayD<T>> {
    let len = v.len();
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|_| Error::ShapeMismatch {
        context: format!("host buffer of {len} elements"),
        expected: shape.to_vec(),
        actual: vec![len],
    })
}

/// For the 16-bit floats, `f` of `a` widened to f32 and rounded back once (PyTorch's CPU
/// kernels compute these types in f32 too); `None` for f32 and f64.
fn widened<T: Element>(a: &ArrayD<T>, f: impl FnOnce(&ArrayD<f32>) -> ArrayD<f32>) -> Option<ArrayD<T>> {
    T::DTYPE.is_half().then(|| cast(&f(&cast(a))))
}

/// A kernel of [`vmath`] (given for f32 and for f64) on the row-major data of `a`, into an
/// array of `a`'s shape; `None` for the other element types.
fn vectorised<T: Element>(
    a: &ArrayD<T>,
    k32: impl FnOnce(&[f32], &mut Vec<f32>),
    k64: impl FnOnce(&[f64], &mut Vec<f64>),
) -> Option<ArrayD<T>> {
    let src = row_major(a);
    let out: Vec<T> = match T::DTYPE {
        DType::F32 => {
            let mut o = Vec::new();
            k32(bytemuck::cast_slice(&src), &mut o);
            bytemuck::allocation::cast_vec(o)
        }
        DType::F64 => {
            let mut o = Vec::new();
            k64(bytemuck::cast_slice(&src), &mut o);
            bytemuck::allocation::cast_vec(o)
        }
        _ => return None,
    };
    from_vec(a.shape(), out).ok()
}

pub(super) fn unary<T: Element>(a: &ArrayD<T>, op: UnaryOp) -> ArrayD<T> {
    if let Some(r) = widened(a, |a| unary(a, op)) {
        return r;
    }
    let fast = match op {
        UnaryOp::Exp => Some(Fast::Exp),
        UnaryOp::Gelu => Some(Fast::Gelu),
        UnaryOp::GeluGrad => Some(Fast::GeluGrad),
        UnaryOp::Silu => Some(Fast::Silu),
        UnaryOp::SiluGrad => Some(Fast::SiluGrad),
        UnaryOp::Sigmoid => Some(Fast::Sigmoid),
        _ => None,
    };
    if let Some(r) = fast.and_then(|f| vectorised(a, |x, o| vmath::map(f, x, o), |x, o| vmath::map(f, x, o))) {
        return r;
    }
    let (s, t) = op.scalars();
    let (s, t) = (T::of_f64(s), T::of_f64(t));
    // The host arm of every entry of the unary vocabulary (`op::with_unary_ops`).
    macro_rules! host_arms {
        ($(
            $(#[$doc:meta])* $V:ident $( ( $($tup:ty),* ) )? $( { $($fields:tt)* } )?
                => $name:literal, $code:literal, |$x:ident, $s:pat_param, $t:pat_param| $host:expr, $cuda:literal;
        )*) => {
            match op {$(
                UnaryOp::$V { .. } => {
                    let ($s, $t) = (s, t);
                    a.mapv(|$x| $host)
                }
            )*}
        };
    }
    with_unary_ops!(host_arms)
}

/// `a` and `b` broadcast to `shape` for the two-input `op`, or the typed error naming both
/// shards' shapes.
fn broadcast_pair<'a, T>(
    a: &'a ArrayD<T>,
    b: &'a ArrayD<T>,
    op: BinaryOp,
    shape: &[usize],
) -> Result<(ArrayViewD<'a, T>, ArrayViewD<'a, T>)> {
    let bad = || Error::ShapeMismatch {
        context: format!("{op}: local shards do not broadcast"),
        expected: a.shape().to_vec(),
        actual: b.shape().to_vec(),
    };
    Ok((a.broadcast(IxDyn(shape)).ok_or_else(bad)?, b.broadcast(IxDyn(shape)).ok_or_else(bad)?))
}

pub(super) fn binary<T: Element>(a: &ArrayD<T>, b: &ArrayD<T>, op: BinaryOp, shape: &[usize]) -> Result<ArrayD<T>> {
    let (av, bv) = broadcast_pair(a, b, op, shape)?;
    let z = Zip::from(&av).and(&bv);
    Ok(match op {
        BinaryOp::Add => z.map_collect(|&x, &y| x + y),
        BinaryOp::Sub => z.map_collect(|&x, &y| x - y),
        BinaryOp::Mul => z.map_collect(|&x, &y| x * y),
        BinaryOp::Div => z.map_collect(|&x, &y| x / y),
        BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => {
            return compare(a, b, op, shape)
        }
        BinaryOp::Maximum => z.map_collect(|&x, &y| if x.is_nan() || x > y { x } else { y }),
        BinaryOp::Minimum => z.map_collect(|&x, &y| if x.is_nan() || x < y { x } else { y }),
    })
}

/// The comparison `op` of `a` and `b` broadcast to `shape`: 1 where it holds, else 0 (any
/// element type; a NaN compares false except under `Ne`). `op` is a comparison (checked by
/// the callers).
pub(super) fn compare<T: Scalar>(a: &ArrayD<T>, b: &ArrayD<T>, op: BinaryOp, shape: &[usize]) -> Result<ArrayD<T>> {
    let (av, bv) = broadcast_pair(a, b, op, shape)?;
    let test: fn(&T, &T) -> bool = match op {
        BinaryOp::Eq => |x, y| x == y,
        BinaryOp::Ne => |x, y| x != y,
        BinaryOp::Lt => |x, y| x < y,
        BinaryOp::Le => |x, y| x <= y,
        BinaryOp::Gt => |x, y| x > y,
        BinaryOp::Ge => |x, y| x >= y,
        _ => return Err(Error::InvalidArgument { context: op.name().into(), reason: "not a comparison".into() }),
    };
    Ok(Zip::from(&av).and(&bv).map_collect(|x, y| mask(test(x, y))))
}

/// A mask element: 1 for true, 0 for false.
fn mask<T: Scalar>(b: bool) -> T {
    if b {
        T::one()
    } else {
        T::zero()
    }
}

/// `a` where `cond` is non-zero, else `b` (all three broadcast to `shape`).
pub(super) fn where_<T: Scalar>(cond: &ArrayD<T>, a: &ArrayD<T>, b: &ArrayD<T>, shape: &[usize]) -> Result<ArrayD<T>> {
    let bad = |what: &[usize]| Error::ShapeMismatch {
        context: "where: local shards do not broadcast".into(),
        expected: shape.to_vec(),
        actual: what.to_vec(),
    };
    let cv = cond.broadcast(IxDyn(shape)).ok_or_else(|| bad(cond.shape()))?;
    let av = a.broadcast(IxDyn(shape)).ok_or_else(|| bad(a.shape()))?;
    let bv = b.broadcast(IxDyn(shape)).ok_or_else(|| bad(b.shape()))?;
    let zero = T::zero();
    Ok(Zip::from(&cv).and(&av).and(&bv).map_collect(|&c, &x, &y| if c != zero { x } else { y }))
}

/// Keeps the lower (`lower`) or upper triangle of the last two dims, relative to `diagonal`,
/// of a shard whose last two dims start at global (`row0`, `col0`); zeros elsewhere.
pub(super) fn tri<T: Element>(a: &ArrayD<T>, lower: bool, diagonal: i64, row0: usize, col0: usize) -> ArrayD<T> {
    let nd = a.ndim();
    let mut out = into_standard(a.to_owned());
    for (ix, v) in out.indexed_iter_mut() {
        let (i, j) = ((ix[nd - 2] + row0) as i64, (ix[nd - 1] + col0) as i64);
        let keep = if lower { j - i <= diagonal } else { j - i >= diagonal };
        if !keep {
            *v = T::zero();
        }
    }
    out
}

/// Index (first occurrence) of the maximum (`max`) or minimum of every lane along `dim`, as
/// `i64` (PyTorch; never an element value, which would round an index in the 16-bit floats);
/// a NaN counts as the extreme (PyTorch). The lanes are not empty (checked).
pub(super) fn arg_reduce<T: Element>(a: &ArrayD<T>, dim: usize, max: bool, keepdim: bool) -> ArrayD<i64> {
    let better = |v: T, best: T| {
        if best.is_nan() {
            false
        } else if v.is_nan() {
            true
        } else if max {
            v > best
        } else {
            v < best
        }
    };
    let mut out = a.map_axis(Axis(dim), |lane| {
        let mut best = (0usize, lane[0]);
        for (k, &v) in lane.iter().enumerate().skip(1) {
            if better(v, best.1) {
                best = (k, v);
            }
        }
        best.0 as i64
    });
    if keepdim {
        out.insert_axis_inplace(Axis(dim));
    }
    into_standard(out)
}

/// Concatenation along `dim` (shapes checked by the caller).
pub(super) fn cat<T: Scalar>(parts: &[&ArrayD<T>], dim: usize) -> Result<ArrayD<T>> {
    let views: Vec<ArrayViewD<'_, T>> = parts.iter().map(|a| a.view()).collect();
    ndarray::concatenate(Axis(dim), &views)
        .map(into_standard)
        .map_err(|e| Error::Unsupported { op: "cat".into(), reason: e.to_string() })
}

/// `ids` as indices below `n`.
fn indices(op: &str, ids: &ArrayD<i64>, n: usize) -> Result<Vec<usize>> {
    row_major(ids).iter().map(|&v| index_of(op, v, n)).collect()
}

/// The slices `ids` (1-D) of `a` along `dim`.
pub(super) fn index_select<T: Scalar>(a: &ArrayD<T>, dim: usize, ids: &ArrayD<i64>) -> Result<ArrayD<T>> {
    let idx = indices("index_select", ids, a.shape()[dim])?;
    Ok(into_standard(a.select(Axis(dim), &idx)))
}

/// Gradient of [`index_select`]: the slices of `g` added at `ids` along `dim` of a zero
/// tensor whose `dim` has size `n`.
pub(super) fn index_add<T: Element>(g: &ArrayD<T>, dim: usize, ids: &ArrayD<i64>, n: usize) -> Result<ArrayD<T>> {
    // The 16-bit floats accumulate in f32 and round once.
    if T::DTYPE.is_half() {
        return index_add(&cast::<T, f32>(g), dim, ids, n).map(|a| cast(&a));
    }
    let idx = indices("index_select_backward", ids, n)?;
    let mut shape = g.shape().to_vec();
    shape[dim] = n;
    let mut out = ArrayD::<T>::zeros(IxDyn(&shape));
    for (k, &i) in idx.iter().enumerate() {
        let mut dst = out.index_axis_mut(Axis(dim), i);
        dst += &g.index_axis(Axis(dim), k);
    }
    Ok(out)
}

/// `out[ix] = a[ix with ix[dim] = ids[ix]]` (PyTorch `gather`): the shape of `ids`.
pub(super) fn gather<T: Scalar>(a: &ArrayD<T>, dim: usize, ids: &ArrayD<i64>) -> Result<ArrayD<T>> {
    let n = a.shape()[dim];
    let mut out = ArrayD::<T>::zeros(ids.raw_dim());
    let mut src = vec![0usize; a.ndim()];
    for (ix, o) in out.indexed_iter_mut() {
        src.copy_from_slice(ix.slice());
        src[dim] = index_of("gather", ids[ix.clone()], n)?;
        *o = a[src.as_slice()];
    }
    Ok(out)
}

/// Gradient of [`gather`]: `g` added at the gathered positions of a zero tensor of `shape`.
pub(super) fn scatter_add<T: Element>(
    g: &ArrayD<T>,
    dim: usize,
    ids: &ArrayD<i64>,
    shape: &[usize],
) -> Result<ArrayD<T>> {
    // The 16-bit floats accumulate in f32 and round once.
    if T::DTYPE.is_half() {
        return scatter_add(&cast::<T, f32>(g), dim, ids, shape).map(|a| cast(&a));
    }
    let n = shape[dim];
    let mut out = ArrayD::<T>::zeros(IxDyn(shape));
    let mut dst = vec![0usize; shape.len()];
    for (ix, &v) in g.indexed_iter() {
        dst.copy_from_slice(ix.slice());
        dst[dim] = index_of("gather_backward", ids[ix.clone()], n)?;
        out[dst.as_slice()] += v;
    }
    Ok(out)
}

/// Reduces `dims` (sorted, distinct) of `a`.
pub(super) fn reduce<T: Element>(a: &ArrayD<T>, kind: Reduction, dims: &[usize], keepdim: bool) -> ArrayD<T> {
    if let Some(r) = widened(a, |a| reduce(a, kind, dims, keepdim)) {
        return r;
    }
    let axis = |x: ArrayViewD<'_, T>, d: usize| match kind {
        Reduction::Sum | Reduction::Mean => x.sum_axis(Axis(d)),
        // A NaN wins and stays (PyTorch propagates NaN through max/min).
        Reduction::Max => x.fold_axis(Axis(d), T::neg_infinity(), |m, &v| if v > *m || v.is_nan() { v } else { *m }),
        Reduction::Min => x.fold_axis(Axis(d), T::infinity(), |m, &v| if v < *m || v.is_nan() { v } else { *m }),
    };
    let mut out: Option<ArrayD<T>> = None;
    // Highest dim first, so the lower dims keep their index.
    for &d in dims.iter().rev() {
        let mut r = match &out {
            None => axis(a.view(), d),
            Some(o) => axis(o.view(), d),
        };
        if keepdim {
            r.insert_axis_inplace(Axis(d));
        }
        out = Some(r);
    }
    let mut out = out.unwrap_or_else(|| a.to_owned());
    if kind == Reduction::Mean {
        let count: usize = dims.iter().map(|&d| a.shape()[d]).product();
        let scale = T::one() / T::of_f64(count as f64);
        out.mapv_inplace(|v| v * scale);
    }
    out
}

pub(super) fn softmax<T: Element>(a: &ArrayD<T>, dim: usize, kind: SoftmaxKind) -> ArrayD<T> {
    if let Some(r) = widened(a, |a| softmax(a, dim, kind)) {
        return r;
    }
    let n = a.shape()[dim];
    if dim + 1 == a.ndim() && n > 0 {
        let (k32, k64) = (
            |x: &[f32], o: &mut _| vmath::softmax_rows(x, n, kind, o),
            |x: &[f64], o: &mut _| vmath::softmax_rows(x, n, kind, o),
        );
        if let Some(r) = vectorised(a, k32, k64) {
            return r;
        }
    }
    let mut out = a.to_owned();
    for mut lane in out.lanes_mut(Axis(dim)) {
        let m = lane.fold(T::neg_infinity(), |a, &b| if b > a { b } else { a });
        let s: T = lane.iter().map(|&v| (v - m).exp()).sum();
        match kind {
            SoftmaxKind::LogSoftmax => {
                let ls = s.ln();
                lane.mapv_inplace(|v| v - m - ls);
            }
            SoftmaxKind::Softmax => lane.mapv_inplace(|v| (v - m).exp() / s),
        }
    }
    out
}

/// Input gradient of a softmax along `dim` from its output `y` and output gradient `g`:
/// softmax `y·(g - Σ g·y)`, log-softmax `g - eʸ·Σ g`.
pub(super) fn softmax_backward<T: Element>(y: &ArrayD<T>, g: &ArrayD<T>, dim: usize, kind: SoftmaxKind) -> ArrayD<T> {
    if let Some(r) = widened(y, |y| softmax_backward(y, &cast(g), dim, kind)) {
        return r;
    }
    let mut out = g.to_owned();
    for (mut go, yl) in out.lanes_mut(Axis(dim)).into_iter().zip(y.lanes(Axis(dim))) {
        match kind {
            SoftmaxKind::Softmax => {
                let dot: T = go.iter().zip(yl.iter()).map(|(&g, &y)| g * y).sum();
                Zip::from(&mut go).and(&yl).for_each(|g, &y| *g = y * (*g - dot));
            }
            SoftmaxKind::LogSoftmax => {
                let sum: T = go.iter().copied().sum();
                Zip::from(&mut go).and(&yl).for_each(|g, &y| *g -= y.exp() * sum);
            }
        }
    }
    out
}

/// `a [.., m, k] @ b [k, n]` or `a [.., m, k] @ b [.., k, n]` (same batch dims); the shapes
/// were checked by the caller. The `gemm` crate reads any strides, so transposed operands are
/// not copied; only batch dims that cannot be merged without a copy are. The 16-bit floats
/// are widened to f32, multiplied and accumulated in f32, and rounded once.
pub(super) fn matmul<T: Element>(a: ArrayViewD<T>, b: ArrayViewD<T>, out_shape: &[usize]) -> Result<ArrayD<T>> {
    if T::DTYPE.is_half() {
        let widen = |v: ArrayViewD<T>| v.mapv(|x| f32::of_f64(x.as_f64()));
        return matmul::<f32>(widen(a).view(), widen(b).view(), out_shape).map(|o| cast(&o));
    }
    let na = a.ndim();
    let (m, k) = (a.shape()[na - 2], a.shape()[na - 1]);
    let n = b.shape()[b.ndim() - 1];
    let nbatch: usize = a.shape()[..na - 2].iter().product();
    let len: usize = out_shape.iter().product();
    if len == 0 || k == 0 {
        return Ok(ArrayD::<T>::zeros(IxDyn(out_shape)));
    }
    // No zero fill: gemm, called with `read_dst = false`, writes every output element.
    let mut buf: Vec<T> = crate::alloc::try_with_capacity("matmul output", len)?;
    let shape_err = |what: &str| Error::Unsupported { op: "matmul".into(), reason: format!("{what} is not {m}x{k}") };
    let a3 = a.to_shape((nbatch, m, k)).map_err(|_| shape_err("the left operand"))?;
    let b3 = b.to_shape((b.len() / (k * n), k, n)).map_err(|_| shape_err("the right operand"))?;
    // A 2-D right operand is shared by every batch: a zero batch stride.
    let b3 = b3.broadcast((nbatch, k, n)).ok_or_else(|| shape_err("the right operand"))?;
    let o = buf.spare_capacity_mut().as_mut_ptr().cast::<T>();
    let (sa, sb) = (a3.strides(), b3.strides());
    if sb[0] == 0 && sa[0] == sa[1] * m as isize {
        // Batch rows of `a` are evenly strided rows of one gemm with a shared `b`.
        gemm_into(nbatch * m, k, n, a3.as_ptr(), [sa[1], sa[2]], b3.as_ptr(), [sb[1], sb[2]], o);
    } else {
        for i in 0..nbatch {
            let (ai, bi) = (a3.index_axis(Axis(0), i), b3.index_axis(Axis(0), i));
            let (sa, sb) = (ai.strides(), bi.strides());
            // SAFETY: batch `i`'s `m × n` block lies inside the capacity of `len = nbatch·m·n`.
            let oi = unsafe { o.add(i * m * n) };
            gemm_into(m, k, n, ai.as_ptr(), [sa[0], sa[1]], bi.as_ptr(), [sb[0], sb[1]], oi);
        }
    }
    // SAFETY: the gemm calls above wrote all `nbatch` blocks of `m × n`, i.e. every one of the
    // `len` elements.
    unsafe { buf.set_len(len) };
    from_vec(out_shape, buf)
}

/// `c = a @ b` for an `m × k` `a` and a `k × n` `b` at the given (row, column) element strides,
/// into a row-major `m × n` `c`, on this thread (a rank is one thread).
#[allow(clippy::too_many_arguments)]
fn gemm_into<T: Element>(
    m: usize,
    k: usize,
    n: usize,
    a: *const T,
    sa: [isize; 2],
    b: *const T,
    sb: [isize; 2],
    c: *mut T,
) {
    // SAFETY: the callers pass pointers and strides of live ndarray views of these shapes, and
    // `c` points to an exclusively owned, possibly uninitialised, row-major m × n block, which
    // gemm only writes (`read_dst = false`); `gemm` supports f32 and f64 (`matmul` widens the
    // 16-bit floats before calling), and reads strides of any sign.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            n as isize,
            false,
            a,
            sa[1],
            sa[0],
            b,
            sb[1],
            sb[0],
            T::zero(),
            T::one(),
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Executes a pack plan (checked by the caller) from row-major `src` into a fresh array.
pub(super) fn pack<T: Scalar>(src: &[T], plan: &PackPlan) -> Result<ArrayD<T>> {
    let n = plan.dst_len();
    if plan.writes_in_order() {
        // Every element is written once, by a block or as padding between them: no zero fill
        // of the whole destination first (the padded send buffers of uneven shards).
        let mut dst: Vec<T> = crate::alloc::try_with_capacity("redistribution (pack)", n)?;
        let out = &mut dst.spare_capacity_mut()[..n];
        let mut end = 0;
        for b in &plan.blocks {
            out[end..b.dst_offset].fill(std::mem::MaybeUninit::new(T::zero()));
            copy_block(src, out, b, |d, v| {
                d.write(v);
            });
            end = b.dst_offset + b.len();
        }
        out[end..].fill(std::mem::MaybeUninit::new(T::zero()));
        // SAFETY: `writes_in_order` holds: the blocks' runs lie in order inside the `n`
        // elements, and the gaps before, between and after them were zero-filled.
        unsafe { dst.set_len(n) };
        return from_vec(&plan.dst_shape, dst);
    }
    // Zeroed allocations are free (calloc); only the padding stays zero.
    let mut dst = crate::alloc::try_zeroed::<T>("redistribution (pack)", n)?;
    for b in &plan.blocks {
        copy_block(src, &mut dst, b, |d, v| *d = v);
    }
    from_vec(&plan.dst_shape, dst)
}

/// One strided box copy into slots `D` (elements, or uninitialised elements) written by `put`;
/// the innermost dim is a straight loop LLVM turns into a `memcpy`, a fill or a strided loop.
fn copy_block<T: Copy, D>(src: &[T], dst: &mut [D], b: &CopyBlock, put: impl Fn(&mut D, T)) {
    let nd = b.extents.len();
    let (inner, si, di) = (b.extents[nd - 1], b.src_strides[nd - 1], b.dst_strides[nd - 1]);
    let outer = &b.extents[..nd - 1];
    let mut idx = vec![0usize; outer.len()];
    let (mut so, mut doff) = (b.src_offset, b.dst_offset);
    for _ in 0..outer.iter().product::<usize>() {
        match (si, di) {
            (1, 1) => dst[doff..doff + inner].iter_mut().zip(&src[so..so + inner]).for_each(|(d, &v)| put(d, v)),
            (0, 1) => dst[doff..doff + inner].iter_mut().for_each(|d| put(d, src[so])),
            (_, 1) => {
                for (k, d) in dst[doff..doff + inner].iter_mut().enumerate() {
                    put(d, src[so + k * si]);
                }
            }
            _ => {
                for k in 0..inner {
                    put(&mut dst[doff + k * di], src[so + k * si]);
                }
            }
        }
        // Odometer over the outer dims, moving both offsets incrementally.
        for k in (0..outer.len()).rev() {
            idx[k] += 1;
            so += b.src_strides[k];
            doff += b.dst_strides[k];
            if idx[k] < outer[k] {
                break;
            }
            so -= outer[k] * b.src_strides[k];
            doff -= outer[k] * b.dst_strides[k];
            idx[k] = 0;
        }
    }
}

/// Checks one id and converts it to an index (in integers: no id is rounded).
fn index_of(op: &str, id: i64, n: usize) -> Result<usize> {
    match usize::try_from(id) {
        Ok(v) if v < n => Ok(v),
        _ => Err(Error::InvalidArgument { context: op.into(), reason: format!("index {id} is out of range [0, {n})") }),
    }
}

/// Rows `ids - row0` of the table shard `table` (`[rows, cols]`), zeros for ids outside it:
/// `ids.shape + [cols]`.
pub(super) fn embedding<T: Element>(
    table: &ArrayD<T>,
    ids: &ArrayD<i64>,
    row0: usize,
    vocab: usize,
) -> Result<ArrayD<T>> {
    let (rows, cols) = (table.shape()[0], table.shape()[1]);
    let t = row_major(table);
    let mut shape = ids.shape().to_vec();
    shape.push(cols);
    // As many rows as ids: sized by the caller's ids, so checked and allocated fallibly.
    let mut out = crate::alloc::try_zeroed::<T>("embedding output", crate::shape::checked_numel("embedding", &shape)?)?;
    for (dst, &id) in out.chunks_exact_mut(cols.max(1)).zip(row_major(ids).iter()) {
        let v = index_of("embedding", id, vocab)?;
        if v >= row0 && v < row0 + rows {
            let r = v - row0;
            dst.copy_from_slice(&t[r * cols..(r + 1) * cols]);
        }
    }
    from_vec(&shape, out)
}

/// Scatter-add of `g`'s rows (`ids.shape + [cols]`) at `ids - row0` into a zero table shard
/// of `rows` rows; ids outside it are skipped.
pub(super) fn embedding_backward<T: Element>(
    g: &ArrayD<T>,
    ids: &ArrayD<i64>,
    rows: usize,
    row0: usize,
    vocab: usize,
) -> Result<ArrayD<T>> {
    // The 16-bit floats accumulate in f32 and round once.
    if T::DTYPE.is_half() {
        return embedding_backward(&cast::<T, f32>(g), ids, rows, row0, vocab).map(|a| cast(&a));
    }
    let cols = *g.shape().last().unwrap_or(&0);
    let gd = row_major(g);
    let mut out = crate::alloc::try_zeroed::<T>(
        "embedding_backward output",
        crate::shape::checked_numel("embedding_backward", &[rows, cols])?,
    )?;
    for (row, &id) in gd.chunks_exact(cols.max(1)).zip(row_major(ids).iter()) {
        let v = index_of("embedding_backward", id, vocab)?;
        if v >= row0 && v < row0 + rows {
            let r = v - row0;
            for (o, &x) in out[r * cols..(r + 1) * cols].iter_mut().zip(row) {
                *o += x;
            }
        }
    }
    from_vec(&[rows, cols], out)
}

/// Ones of `T` at `ids` along a new last dim of `classes`, zeros elsewhere.
pub(super) fn one_hot<T: Element>(ids: &ArrayD<i64>, classes: usize) -> Result<ArrayD<T>> {
    let mut shape = ids.shape().to_vec();
    shape.push(classes);
    // `classes` is the caller's: the product is checked and the buffer allocated fallibly.
    let mut out = crate::alloc::try_zeroed::<T>("one_hot output", crate::shape::checked_numel("one_hot", &shape)?)?;
    for (k, &id) in row_major(ids).iter().enumerate() {
        out[k * classes + index_of("one_hot", id, classes)?] = T::one();
    }
    from_vec(&shape, out)
}

/// Element-type conversion with Rust's `as` semantics, as PyTorch's: from an integer through
/// i64 (exact, and wrapping when the target integer is narrower: f64 would round values beyond
/// 2⁵³), from a float through f64 (integers from floats truncate toward zero and saturate); a
/// conversion to the same type is a bit copy.
pub(super) fn cast<T: Scalar, U: Scalar>(a: &ArrayD<T>) -> ArrayD<U> {
    if T::DTYPE == U::DTYPE {
        return a.mapv(|x| bytemuck::cast(x));
    }
    if T::DTYPE.is_float() {
        a.mapv(|x| U::of_f64(x.as_f64()))
    } else {
        a.mapv(|x| U::of_i64(x.as_i64()))
    }
}

/// The shard (`shape` at `offset`) of a random tensor of `global` shape.
pub(super) fn random<T: Element>(
    fill: &RandomFill,
    global: &[usize],
    offset: &[usize],
    shape: &[usize],
) -> Result<ArrayD<T>> {
    let mut s = Stream::new(fill.seed, fill.offset);
    match fill.dist {
        Distribution::Uniform => shard_from_global_index(global, offset, shape, |i| s.uniform(i)),
        Distribution::Normal => shard_from_global_index(global, offset, shape, |i| s.normal(i)),
    }
}

pub(super) fn sgd_step<T: Element>(w: &mut ArrayD<T>, g: &ArrayD<T>, buf: Option<&mut ArrayD<T>>, p: &SgdStep) {
    if T::DTYPE.is_half() {
        // Each element's update in f32, rounded once into the 16-bit weight and buffer.
        let (mut w32, mut b32) = (cast::<T, f32>(w), buf.as_deref().map(cast::<T, f32>));
        sgd_step(&mut w32, &cast(g), b32.as_mut(), p);
        *w = cast(&w32);
        if let (Some(b), Some(b32)) = (buf, b32) {
            *b = cast(&b32);
        }
        return;
    }
    let (lr, m, wd) = (T::of_f64(p.lr), T::of_f64(p.momentum), T::of_f64(p.weight_decay));
    let decayed = |g: T, w: T| if wd != T::zero() { g + wd * w } else { g };
    match buf {
        Some(b) => Zip::from(w).and(g).and(b).for_each(|w, &g, b| {
            let d = decayed(g, *w);
            *b = if p.first { d } else { m * *b + d };
            *w -= lr * *b;
        }),
        None => Zip::from(w).and(g).for_each(|w, &g| {
            let d = decayed(g, *w);
            *w -= lr * d;
        }),
    }
}

pub(super) fn adamw_step<T: Element>(
    w: &mut ArrayD<T>,
    g: &ArrayD<T>,
    m: &mut ArrayD<T>,
    v: &mut ArrayD<T>,
    p: &AdamWStep,
) {
    if T::DTYPE.is_half() {
        // Each element's update in f32, rounded once into the 16-bit weight and moments.
        let (mut w32, mut m32, mut v32) = (cast::<T, f32>(w), cast::<T, f32>(m), cast::<T, f32>(v));
        adamw_step(&mut w32, &cast(g), &mut m32, &mut v32, p);
        (*w, *m, *v) = (cast(&w32), cast(&m32), cast(&v32));
        return;
    }
    let (lr, b1, b2) = (T::of_f64(p.lr), T::of_f64(p.beta1), T::of_f64(p.beta2));
    let (eps, wd) = (T::of_f64(p.eps), T::of_f64(p.weight_decay));
    let (c1, c2) = (T::of_f64(p.bias_correction1), T::of_f64(p.bias_correction2));
    Zip::from(w).and(g).and(m).and(v).for_each(|w, &g, m, v| {
        *w -= lr * wd * *w;
        *m = b1 * *m + (T::one() - b1) * g;
        *v = b2 * *v + (T::one() - b2) * g * g;
        *w -= lr * (*m / c1) / ((*v / c2).sqrt() + eps);
    });
}

/// The host as a compute device: every kernel of the checklist, on ndarray arrays.
impl<T: Scalar> BackendStorage<T> for ArrayD<T> {
    type Handle = ();
    type Of<U: Scalar> = ArrayD<U>;

    fn from_host(_: &(), a: ArrayD<T>) -> Result<Self> {
        Ok(into_standard(a))
    }
    fn full(_: &(), shape: &[usize], value: T) -> Result<Self> {
        let n = shape.iter().product();
        let data = if bytemuck::bytes_of(&value).iter().all(|&b| b == 0) {
            // Zeroed by the allocator: untouched pages cost nothing.
            crate::alloc::try_zeroed("full", n)?
        } else {
            let mut v = crate::alloc::try_with_capacity("full", n)?;
            v.resize(n, value);
            v
        };
        from_vec(shape, data)
    }
    fn random(_: &(), fill: &RandomFill, global: &[usize], offset: &[usize], shape: &[usize]) -> Result<Self>
    where
        T: Element,
    {
        random(fill, global, offset, shape)
    }
    fn dims(&self) -> &[usize] {
        self.shape()
    }
    fn to_host(&self) -> Result<ArrayD<T>> {
        Ok(self.clone())
    }
    fn into_reshape(self, shape: &[usize]) -> Result<Self> {
        into_standard(self)
            .into_shape_with_order(shape)
            .map_err(|e| Error::Unsupported { op: "reshape".into(), reason: e.to_string() })
    }
    fn cast<U: Scalar>(&self) -> Result<ArrayD<U>> {
        Ok(cast::<T, U>(self))
    }
    fn pack(&self, plan: &PackPlan) -> Result<Self> {
        pack(&row_major(self), plan)
    }
    fn cat(parts: &[&Self], dim: usize) -> Result<Self> {
        cat(parts, dim)
    }
    fn compare(&self, op: BinaryOp, other: &Self, shape: &[usize]) -> Result<Self> {
        compare(self, other, op, shape)
    }
    fn where_(&self, a: &Self, b: &Self, shape: &[usize]) -> Result<Self> {
        where_(self, a, b, shape)
    }
    fn index_select(&self, dim: usize, ids: &ArrayD<i64>) -> Result<Self> {
        index_select(self, dim, ids)
    }
    fn gather(&self, dim: usize, ids: &ArrayD<i64>) -> Result<Self> {
        gather(self, dim, ids)
    }
    fn unary(&self, op: UnaryOp) -> Result<Self>
    where
        T: Element,
    {
        Ok(unary(self, op))
    }
    fn binary(&self, op: BinaryOp, other: &Self, shape: &[usize]) -> Result<Self>
    where
        T: Element,
    {
        binary(self, other, op, shape)
    }
    fn reduce(&self, kind: Reduction, dims: &[usize], keepdim: bool) -> Result<Self>
    where
        T: Element,
    {
        Ok(reduce(self, kind, dims, keepdim))
    }
    fn softmax(&self, dim: usize, kind: SoftmaxKind) -> Result<Self>
    where
        T: Element,
    {
        Ok(softmax(self, dim, kind))
    }
    fn softmax_backward(&self, g: &Self, dim: usize, kind: SoftmaxKind) -> Result<Self>
    where
        T: Element,
    {
        Ok(softmax_backward(self, g, dim, kind))
    }
    /// The swapped operands are read through their strides: nothing is copied.
    fn matmul(&self, other: &Self, transpose_self: bool, transpose_other: bool, out_shape: &[usize]) -> Result<Self>
    where
        T: Element,
    {
        let (mut va, mut vb) = (self.view(), other.view());
        if transpose_self {
            va.swap_axes(self.ndim() - 2, self.ndim() - 1);
        }
        if transpose_other {
            vb.swap_axes(other.ndim() - 2, other.ndim() - 1);
        }
        matmul(va, vb, out_shape)
    }
    fn embedding(&self, ids: &ArrayD<i64>, row0: usize, vocab: usize) -> Result<Self>
    where
        T: Element,
    {
        embedding(self, ids, row0, vocab)
    }
    fn embedding_backward(&self, ids: &ArrayD<i64>, rows: usize, row0: usize, vocab: usize) -> Result<Self>
    where
        T: Element,
    {
        embedding_backward(self, ids, rows, row0, vocab)
    }
    fn tri(&self, lower: bool, diagonal: i64, row0: usize, col0: usize) -> Result<Self>
    where
        T: Element,
    {
        Ok(tri(self, lower, diagonal, row0, col0))
    }
    fn arg_reduce(&self, dim: usize, max: bool, keepdim: bool) -> Result<ArrayD<i64>>
    where
        T: Element,
    {
        Ok(arg_reduce(self, dim, max, keepdim))
    }
    fn index_add(&self, dim: usize, ids: &ArrayD<i64>, n: usize) -> Result<Self>
    where
        T: Element,
    {
        index_add(self, dim, ids, n)
    }
    fn scatter_add(&self, dim: usize, ids: &ArrayD<i64>, shape: &[usize]) -> Result<Self>
    where
        T: Element,
    {
        scatter_add(self, dim, ids, shape)
    }
    fn one_hot(ids: &ArrayD<i64>, classes: usize) -> Result<Self>
    where
        T: Element,
    {
        one_hot(ids, classes)
    }
    fn sgd_step(&mut self, grad: &Self, buf: Option<&mut Self>, step: &SgdStep) -> Result<()>
    where
        T: Element,
    {
        sgd_step(self, grad, buf, step);
        Ok(())
    }
    fn adamw_step(&mut self, grad: &Self, m: &mut Self, v: &mut Self, step: &AdamWStep) -> Result<()>
    where
        T: Element,
    {
        adamw_step(self, grad, m, v, step);
        Ok(())
    }
}
