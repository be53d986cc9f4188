//! The arguments of the device kernels of [`source`](super::source), built on the host: op
//! codes, index structs with the layout of their C counterparts, and the pack-plan table.
//!
//! Plain Rust (no CUDA), so the CPU tests run the kernels' C text through the host compiler with
//! exactly these arguments (`tests/cuda_kernels_host.rs`); `storage::cuda` passes them to the
//! device.

use super::source::MAX_DIMS;
use crate::error::{Error, Result};
use crate::layout::pack::PackPlan;
use crate::op::{BinaryOp, Reduction, UnaryOp};
use crate::shape::contiguous_strides;

/// Output shape and the element strides of up to two operands: the kernels' `struct Strided`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    /// Number of dims.
    pub nd: i32,
    /// Output shape.
    pub shape: [i64; MAX_DIMS],
    /// Strides of the first operand (0 where broadcast).
    pub s0: [i64; MAX_DIMS],
    /// Strides of the second operand (0 where broadcast).
    pub s1: [i64; MAX_DIMS],
}

/// Kept dims (output order) and reduced dims of a reduction with their input strides: the
/// kernels' `struct Reduce`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduce {
    /// Number of kept dims.
    pub nk: i32,
    /// Kept dims' sizes.
    pub kshape: [i64; MAX_DIMS],
    /// Kept dims' input strides.
    pub kstride: [i64; MAX_DIMS],
    /// Number of reduced dims.
    pub nr: i32,
    /// Reduced dims' sizes.
    pub rshape: [i64; MAX_DIMS],
    /// Reduced dims' input strides.
    pub rstride: [i64; MAX_DIMS],
}

/// Index struct of `gather` and of its gradient: the iterated shape and the row-major strides
/// and shape of the other operand (the gathered input, or the gradient a scatter reads): the
/// kernels' `struct Gather`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gather {
    /// Number of dims.
    pub nd: i32,
    /// The indexed dim.
    pub dim: i32,
    /// The iterated shape (the ids' for `gather`, the output's for `scatter_add`).
    pub shape: [i64; MAX_DIMS],
    /// Row-major strides of the other operand.
    pub stride: [i64; MAX_DIMS],
    /// Shape of the other operand.
    pub bound: [i64; MAX_DIMS],
}

/// Number of `u64` per block in the pack table (the kernels' `PACK_ROW`): src offset, dst
/// offset, dims, first element, then extents, src strides and dst strides (`MAX_DIMS` each).
pub const PACK_ROW: usize = 4 + 3 * MAX_DIMS;

/// `v` in an `i64` index array of the kernels (at most `MAX_DIMS` values, checked by callers).
fn dims_array(v: &[usize]) -> [i64; MAX_DIMS] {
    let mut a = [0i64; MAX_DIMS];
    for (x, &y) in a.iter_mut().zip(v) {
        *x = y as i64;
    }
    a
}

/// `Ok` when the kernels can index `nd` dims, else the typed error of `op`.
pub fn check_dims(op: &str, nd: usize) -> Result<()> {
    if nd <= MAX_DIMS {
        Ok(())
    } else {
        Err(Error::Unsupported {
            op: op.into(),
            reason: format!("{nd} dims; the CUDA kernels index at most {MAX_DIMS}"),
        })
    }
}

/// The op code of a unary op in the kernels' `dt_unary` switch (every op has one; a `Result`
/// so that an op added later can answer [`no_kernel`] until its kernel exists).
pub fn unary_code(op: UnaryOp) -> Result<i32> {
    Ok(op.code())
}

/// The two scalars `(s, t)` the kernels' `dt_unary` takes for `op`, as `f64` (the caller
/// converts them to the element type once): softplus `(β, threshold)`, clamp `(lo, hi)`,
/// dropout `(p, 1 / (1 - p))` (the keep scale computed in `f64`, as the host kernel does),
/// else `(op.scalar(), 0)`.
pub fn unary_scalars(op: UnaryOp) -> (f64, f64) {
    op.scalars()
}

/// The op code of a binary op in the kernels' `dt_binary` switch (a `Result` as above).
pub fn binary_code(op: BinaryOp) -> Result<i32> {
    Ok(match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
        BinaryOp::Eq => 4,
        BinaryOp::Ne => 5,
        BinaryOp::Lt => 6,
        BinaryOp::Le => 7,
        BinaryOp::Gt => 8,
        BinaryOp::Ge => 9,
        BinaryOp::Maximum => 10,
        BinaryOp::Minimum => 11,
    })
}

/// The typed error of an op of the storage surface that has no CUDA kernel yet.
pub fn no_kernel(op: &str) -> Error {
    Error::Unsupported { op: op.into(), reason: "no CUDA kernel yet; run this op on a host mesh".into() }
}

/// The combine code of a reduction in the kernels' `dt_combine` (0 sum, 1 max, 2 min) and
/// whether the sum is scaled to a mean.
pub fn reduce_code(kind: Reduction) -> (i32, bool) {
    match kind {
        Reduction::Sum => (0, false),
        Reduction::Mean => (0, true),
        Reduction::Max => (1, false),
        Reduction::Min => (2, false),
    }
}

/// Index struct of `a op b` broadcast to `shape` (numpy rules, checked by the caller):
/// broadcast dims get stride 0.
pub fn broadcast(op: &str, shape: &[usize], a: &[usize], b: &[usize]) -> Result<Strided> {
    check_dims(op, shape.len())?;
    let strides = |s: &[usize]| {
        let st = contiguous_strides(s);
        let mut out = [0i64; MAX_DIMS];
        let lead = shape.len() - s.len();
        for (d, (&len, &stride)) in s.iter().zip(&st).enumerate() {
            out[lead + d] = if len == 1 { 0 } else { stride as i64 };
        }
        out
    };
    Ok(Strided { nd: shape.len() as i32, shape: dims_array(shape), s0: strides(a), s1: strides(b) })
}

/// Index struct, output shape and reduced element count of reducing `dims` (sorted, distinct,
/// checked) of a row-major `shape`.
pub fn reduce(op: &str, shape: &[usize], dims: &[usize], keepdim: bool) -> Result<(Reduce, Vec<usize>, usize)> {
    check_dims(op, shape.len())?;
    let st = contiguous_strides(shape);
    let (mut kshape, mut kstride, mut rshape, mut rstride, mut out) = (vec![], vec![], vec![], vec![], vec![]);
    for (d, (&len, &s)) in shape.iter().zip(&st).enumerate() {
        if dims.contains(&d) {
            rshape.push(len);
            rstride.push(s);
            if keepdim {
                out.push(1);
            }
        } else {
            kshape.push(len);
            kstride.push(s);
            out.push(len);
        }
    }
    let g = Reduce {
        nk: kshape.len() as i32,
        kshape: dims_array(&kshape),
        kstride: dims_array(&kstride),
        nr: rshape.len() as i32,
        rshape: dims_array(&rshape),
        rstride: dims_array(&rstride),
    };
    Ok((g, out, rshape.iter().product()))
}

/// Index struct and base of the random kernel for the shard `shape` at `offset` of `global`:
/// local element `i` is global element `base + Σ i_d·s0_d`.
pub fn random(global: &[usize], offset: &[usize], shape: &[usize]) -> Result<(Strided, u64)> {
    check_dims("random fill", shape.len())?;
    let gs = contiguous_strides(global);
    let base = offset.iter().zip(&gs).map(|(&o, &s)| (o * s) as u64).sum();
    let g = Strided { nd: shape.len() as i32, shape: dims_array(shape), s0: dims_array(&gs), s1: [0; MAX_DIMS] };
    Ok((g, base))
}

/// `(lanes, len, inner)` of the lanes along `dim` of a row-major `shape` (softmax kernels).
pub fn lanes(shape: &[usize], dim: usize) -> (u64, u64, u64) {
    let len = shape[dim];
    let inner: usize = shape[dim + 1..].iter().product();
    let n: usize = shape.iter().product();
    ((n / len.max(1)) as u64, len as u64, inner as u64)
}

/// The device table of a (checked) pack plan, [`PACK_ROW`] values per non-empty block, and
/// the number of elements the blocks copy.
pub fn pack_table(plan: &PackPlan) -> Result<(Vec<u64>, u64)> {
    let mut table: Vec<u64> = Vec::with_capacity(plan.blocks.len() * PACK_ROW);
    let mut total = 0u64;
    for blk in plan.blocks.iter().filter(|b| !b.is_empty()) {
        check_dims("pack", blk.extents.len())?;
        let mut row = [0u64; PACK_ROW];
        row[0] = blk.src_offset as u64;
        row[1] = blk.dst_offset as u64;
        row[2] = blk.extents.len() as u64;
        row[3] = total;
        for (k, ((&e, &s), &d)) in blk.extents.iter().zip(&blk.src_strides).zip(&blk.dst_strides).enumerate() {
            row[4 + k] = e as u64;
            row[4 + MAX_DIMS + k] = s as u64;
            row[4 + 2 * MAX_DIMS + k] = d as u64;
        }
        table.extend_from_slice(&row);
        total += blk.len() as u64;
    }
    Ok((table, total))
}

/// Index structs of `where(cond, a, b)` broadcast to `shape` (checked by the caller): the
/// strides of `cond` and `a`, then those of `b`.
pub fn where_(shape: &[usize], cond: &[usize], a: &[usize], b: &[usize]) -> Result<(Strided, Strided)> {
    Ok((broadcast("where", shape, cond, a)?, broadcast("where", shape, b, b)?))
}

/// `(outer, len, inner)` of a row-major `shape` around `dim`: the products of the dims before
/// it, its size, and the product of the dims after it.
pub fn along(shape: &[usize], dim: usize) -> (u64, u64, u64) {
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    (outer as u64, shape[dim] as u64, inner as u64)
}

/// `(width, stride, offset)` of the `cat` kernel for a part of `shape` that starts at `start`
/// along `dim` of an output whose `dim` has size `total`.
pub fn cat_part(shape: &[usize], dim: usize, total: usize, start: usize) -> (u64, u64, u64) {
    let inner: usize = shape[dim + 1..].iter().product();
    ((shape[dim] * inner) as u64, (total * inner) as u64, (start * inner) as u64)
}

/// Index struct of `gather` along `dim` (iterating the ids' `shape` over the input `other`) or
/// of its gradient (iterating the output's `shape` over the gradient `other`).
pub fn gather(op: &str, shape: &[usize], other: &[usize], dim: usize) -> Result<Gather> {
    check_dims(op, shape.len())?;
    Ok(Gather {
        nd: shape.len() as i32,
        dim: dim as i32,
        shape: dims_array(shape),
        stride: dims_array(&contiguous_strides(other)),
        bound: dims_array(other),
    })
}
