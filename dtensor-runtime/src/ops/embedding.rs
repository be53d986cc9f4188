//! Embedding lookup and one-hot encoding. Ids are carried in a DTensor of any
//! [`IndexElement`] type (`i64`, `i32`, or whole-number floats), so they shard and redistribute
//! like any tensor, and are read by the kernels as `i64` whatever the table's type: an id never
//! passes through the table's float type, which would round it (bf16 holds every integer only
//! up to 256, f16 up to 2048, f32 up to 2^24).
//!
//! Rules per mesh dim (table `[V, D]`, ids `[..]` → out `[.., D]`): `(R,R)→R`,
//! `(R,S(d))→S(d)`, `(S(1),R)→S(last)`, `(S(0),R)→Partial(sum)` (vocab-parallel: ids outside
//! this rank's rows give zeros), `(P,R)→P`.

use super::new_output;
use super::strategy::{partial_ops, select, select_pair, DimRule, Select};
use crate::autograd::{record, recording};
use crate::dtensor::DTensor;
use crate::element::{Element, IndexElement};
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::placement::{Placement, ReduceOp};
use std::borrow::Cow;

const R: Placement = Placement::Replicate;
const LINEAR: [ReduceOp; 2] = [ReduceOp::Sum, ReduceOp::Avg];

fn shard(d: usize) -> Placement {
    Placement::Shard(d as isize)
}

/// Gradient of the table: scatter-add of `g`'s rows at `ids`, laid out preferably as `prefer`.
fn embedding_backward<T: Element>(
    g: &DTensor<T>,
    ids: &DTensor<i64>,
    vocab: usize,
    prefer: &[Placement],
) -> Result<DTensor<T>> {
    let q = ids.ndim();
    let mut rs =
        vec![DimRule::new(&[R, R], R), DimRule::new(&[R, R], shard(0)), DimRule::new(&[shard(q), R], shard(1))];
    for d in 0..q {
        rs.push(DimRule::new(&[shard(d), shard(d)], Placement::Partial(ReduceOp::Sum)));
    }
    for op in partial_ops(&[g], &LINEAR) {
        rs.push(DimRule::new(&[Placement::Partial(op), R], Placement::Partial(op)));
    }
    let knobs = Select { prefer_output: Some(prefer), ..Select::default() };
    let (gi, ii, output) = select_pair("embedding_backward", g, ids, &rs, knobs)?;
    let dim = g.shape[q];
    let shape = vec![vocab, dim];
    let (lshape, loff) = local_shape_and_offset(&shape, gi.mesh.shape(), gi.mesh.coordinate(), &output);
    let out = gi.local.embedding_backward(&ii.local, lshape[0], loff[0], vocab)?;
    Ok(new_output(out, &gi.mesh, output, shape))
}

/// Whether a float id `v` is a whole number that `i64` holds (NaN and infinities are not).
fn whole_i64(v: f64) -> bool {
    // 2^63 itself is not an i64; -2^63 is.
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    v.fract() == 0.0 && (-TWO_63..TWO_63).contains(&v)
}

/// `ids` as the `i64` ids every indexing kernel reads: the tensor itself when it is one, an
/// exact cast for the other integer types, and for float ids a cast after checking that every
/// id is a whole number in `i64`'s range (else an [`Error::InvalidArgument`] naming `op`).
/// Never a conversion to the data's element type, which would round ids. Ranges (negative
/// ids, ids past the indexed dim) are the kernels' typed errors.
pub(crate) fn ids_i64<'a, I: IndexElement>(op: &str, ids: &'a DTensor<I>) -> Result<Cow<'a, DTensor<i64>>> {
    if I::DTYPE.is_float() {
        if let Some(v) = ids.local.host_data()?.iter().map(|v| v.as_f64()).find(|&v| !whole_i64(v)) {
            return Err(Error::InvalidArgument {
                context: op.into(),
                reason: format!("id {v} (dtype {}) is not a whole number in the range of i64", I::DTYPE),
            });
        }
    }
    super::in_type::<i64, I>(ids)
}

impl<T: Element> DTensor<T> {
    /// Looks up rows of this table (`[V, D]`) at `ids` (in `[0, V)`), giving `ids.shape + [D]`.
    /// With a vocab-sharded table (`Shard(0)`) every rank looks up only its rows and the result
    /// is Partial(sum). `ids` may be `i64`/`i32`, or floats holding whole numbers; they are read
    /// as `i64` whatever `T` is, so a bf16 table serves every id of a large vocabulary. A
    /// negative or out-of-range id, or a float id that is not a whole number, is an
    /// [`Error::InvalidArgument`].
    pub fn embedding<I: IndexElement>(&self, ids: &DTensor<I>) -> Result<DTensor<T>> {
        let ids = &*ids_i64("embedding", ids)?;
        if self.ndim() != 2 {
            return Err(Error::ShapeMismatch {
                context: "embedding: table must be [vocab, dim]".into(),
                expected: vec![0, 0],
                actual: self.shape.clone(),
            });
        }
        let q = ids.ndim();
        let mut rs = vec![DimRule::new(&[R, R], R), DimRule::new(&[shard(1), R], shard(q))];
        rs.push(DimRule::new(&[shard(0), R], Placement::Partial(ReduceOp::Sum)));
        for d in 0..q {
            rs.push(DimRule::new(&[R, shard(d)], shard(d)));
        }
        for op in partial_ops(&[self], &LINEAR) {
            rs.push(DimRule::new(&[Placement::Partial(op), R], Placement::Partial(op)));
        }
        let (w, ii, output) = select_pair("embedding", self, ids, &rs, Select::default())?;
        let w = &*w;
        let vocab = self.shape[0];
        let out = w.local.embedding(&ii.local, w.local_offset()[0], vocab)?;
        let mut shape = ids.shape.clone();
        shape.push(self.shape[1]);
        let out = new_output(out, &w.mesh, output, shape);
        if !recording(&[w]) {
            return Ok(out);
        }
        let (sids, wpl) = (ii.into_owned(), w.placements.clone());
        Ok(record("embedding_backward", out, &[w], move |g| Ok(vec![Some(embedding_backward(g, &sids, vocab, &wpl)?)])))
    }
}

impl<I: IndexElement> DTensor<I> {
    /// One-hot encoding of these ids (in `[0, classes)`) as ones of the float type `T`:
    /// `shape + [classes]` (PyTorch `one_hot`, in the float type a loss multiplies by). The ids
    /// are read as `i64`, never through `T`; float ids must be whole numbers. Layout follows
    /// the ids (R → R, S(d) → S(d)). No gradient.
    ///
    /// ```
    /// use dtensor_runtime::{distribute_tensor, run, Replicate};
    /// let out = run(1, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[1], &["x"])?;
    ///     let ids = distribute_tensor(ndarray::arr1(&[2i64, 0]).into_dyn(), &mesh, &[Replicate], None)?;
    ///     ids.one_hot::<f32>(3)?.full_tensor()
    /// })
    /// .unwrap();
    /// assert_eq!(out[0].as_slice().unwrap(), &[0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    /// ```
    pub fn one_hot<T: Element>(&self, classes: usize) -> Result<DTensor<T>> {
        let ids = ids_i64("one_hot", self)?;
        let mut shape = ids.shape.clone();
        shape.push(classes);
        crate::shape::checked_bytes::<T>("one_hot", &shape)?;
        let mut rs = vec![DimRule::new(&[R], R)];
        rs.extend((0..ids.ndim()).map(|d| DimRule::new(&[shard(d)], shard(d))));
        let c = select("one_hot", &[&*ids], &rs, Select::default())?;
        let ii = &*c.inputs[0];
        let out = ii.local.one_hot::<T>(classes)?;
        Ok(new_output(out, &ii.mesh, c.output, shape))
    }
}
