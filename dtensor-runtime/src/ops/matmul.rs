//! Matrix multiplication `[.., m, k] @ [k, n]` or `[.., m, k] @ [.., k, n]` (same batch dims).
//!
//! Rules per mesh dim (`P` = Partial(sum) or Partial(avg) when an input has it):
//! `(R,R)→R`, `(S(m),R)→S(m)`, `(R,S(n))→S(n)`, `(S(k),S(k))→Partial(sum)`, `(P,R)→P`,
//! `(R,P)→P`, batch dims `(S(b),S(b))→S(b)` (or `(S(b),R)→S(b)` when the right side is 2-D).

use super::dispatch::{dispatch, OpDef, Saved};
use super::strategy::{partial_ops, DimRule, Select};
use crate::autograd::input_needs_grad;
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::placement::{Placement, ReduceOp};
use crate::storage::{matmul_shape as out_shape, swapped_last, Storage};

const R: Placement = Placement::Replicate;

fn shard(d: usize) -> Placement {
    Placement::Shard(d as isize)
}

/// The rules of `op(a) @ op(b)` where `a` has `na` dims and `b` has `nb`; a transposed
/// operand's row and column dims trade places.
fn rules(na: usize, nb: usize, ta: bool, tb: bool, pops: &[ReduceOp]) -> Vec<DimRule> {
    let nbatch = na - 2;
    let (am, ak) = if ta { (na - 1, na - 2) } else { (na - 2, na - 1) };
    let (bk, bn) = if tb { (nb - 1, nb - 2) } else { (nb - 2, nb - 1) };
    let mut r = vec![
        DimRule::new(&[R, R], R),
        DimRule::new(&[shard(am), R], shard(na - 2)),
        DimRule::new(&[R, shard(bn)], shard(na - 1)),
        DimRule::new(&[shard(ak), shard(bk)], Placement::Partial(ReduceOp::Sum)),
    ];
    for d in 0..nbatch {
        let bside = if nb > 2 { shard(d) } else { R };
        r.push(DimRule::new(&[shard(d), bside], shard(d)));
    }
    for &op in pops {
        let p = Placement::Partial(op);
        r.push(DimRule::new(&[p, R], p));
        r.push(DimRule::new(&[R, p], p));
    }
    r
}

impl<T: Element> DTensor<T> {
    /// PyTorch `F.linear`: `self · weightᵀ (+ bias)` for a weight `[out, in]` (Hugging Face
    /// `nn.Linear`'s orientation) and an optional bias `[out]`; the weight is read through its
    /// strides (no transposed copy). Column-parallel is the weight `Shard(0)` (and the bias
    /// `Shard(0)`), row-parallel the input and the weight sharded on their input features (the
    /// output Partial(sum), the bias then added once, replicated, by `add`'s rule).
    ///
    /// ```
    /// use dtensor_runtime::{distribute_tensor, ndarray::ArrayD, run, Replicate, Shard};
    /// run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let x = ArrayD::from_shape_fn(vec![3, 4], |i| (i[0] * 4 + i[1]) as f64);
    ///     let w = ArrayD::from_shape_fn(vec![6, 4], |i| i[0] as f64 - i[1] as f64);
    ///     let b = ArrayD::from_shape_fn(vec![6], |i| i[0] as f64);
    ///     let dx = distribute_tensor(&x, &mesh, &[Replicate], None)?;
    ///     let (dw, db) = (distribute_tensor(&w, &mesh, &[Shard(0)], None)?, distribute_tensor(&b, &mesh, &[Shard(0)], None)?);
    ///     let y = dx.linear(&dw, Some(&db))?; // column-parallel: [3, 6] sharded on features
    ///     assert_eq!(y.placements(), &[Shard(1)]);
    ///     assert_eq!(y.full_tensor()?, dx.matmul(&dw.transpose(0, 1)?)?.add(&db)?.full_tensor()?);
    ///     Ok(())
    /// })
    /// .unwrap();
    /// ```
    pub fn linear(&self, weight: &DTensor<T>, bias: Option<&DTensor<T>>) -> Result<DTensor<T>> {
        if weight.ndim() != 2 {
            return Err(Error::ShapeMismatch {
                context: "linear: the weight must be [out, in]".into(),
                expected: vec![0, *self.shape.last().unwrap_or(&0)],
                actual: weight.shape.clone(),
            });
        }
        if let Some(b) = bias {
            if b.shape != weight.shape[..1] {
                return Err(Error::ShapeMismatch {
                    context: "linear: the bias must be [out]".into(),
                    expected: weight.shape[..1].to_vec(),
                    actual: b.shape.clone(),
                });
            }
        }
        let y = self.matmul_t(weight, false, true)?;
        match bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    /// `[.., m, k] @ [k, n]` or `[.., m, k] @ [.., k, n]` (same batch dims).
    ///
    /// ```
    /// use dtensor_runtime::{run, distribute_tensor, Shard, Replicate, Placement, ndarray::ArrayD};
    /// run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let a = distribute_tensor(&ArrayD::<f32>::ones(vec![4, 6]), &mesh, &[Shard(1)], None)?;
    ///     let b = distribute_tensor(&ArrayD::<f32>::ones(vec![6, 3]), &mesh, &[Shard(0)], None)?;
    ///     let c = a.matmul(&b)?; // (S(k), S(k)) -> Partial(sum), no communication
    ///     assert_eq!(c.placements(), &[Placement::PARTIAL_SUM]);
    ///     assert_eq!(c.full_tensor()?[[0, 0]], 6.0);
    ///     Ok(())
    /// }).unwrap();
    /// ```
    pub fn matmul(&self, other: &DTensor<T>) -> Result<DTensor<T>> {
        self.matmul_t(other, false, false)
    }

    /// [`matmul`](Self::matmul) with either operand's last two dims swapped first:
    /// `a.matmul_t(&b, false, true)` is `a.matmul(&b.transpose(-1, -2)?)` without the copy
    /// that `transpose` makes (the kernel reads the swapped operand through its strides).
    /// (Only the backward of a transposed batched left operand times a 2-D right one copies
    /// once: its input gradient is computed transposed.)
    ///
    /// ```
    /// use dtensor_runtime::{run, distribute_tensor, Shard, Replicate, ndarray::ArrayD};
    /// run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let a = ArrayD::<f64>::from_shape_fn(vec![4, 6], |i| (i[0] * 6 + i[1]) as f64);
    ///     let b = ArrayD::<f64>::from_shape_fn(vec![3, 6], |i| (i[0] + 2 * i[1]) as f64);
    ///     let (da, db) = (
    ///         distribute_tensor(&a, &mesh, &[Shard(0)], None)?,
    ///         distribute_tensor(&b, &mesh, &[Replicate], None)?,
    ///     );
    ///     let c = da.matmul_t(&db, false, true)?;
    ///     assert_eq!(c.full_tensor()?, da.matmul(&db.transpose(0, 1)?)?.full_tensor()?);
    ///     Ok(())
    /// }).unwrap();
    /// ```
    pub fn matmul_t(&self, other: &DTensor<T>, transpose_self: bool, transpose_other: bool) -> Result<DTensor<T>> {
        let (ta, tb) = (transpose_self, transpose_other);
        let shape = out_shape(&swapped_last(&self.shape, ta), &swapped_last(&other.shape, tb))?;
        let pops = partial_ops(&[self, other], &[ReduceOp::Sum, ReduceOp::Avg]);
        let rs = rules(self.ndim(), other.ndim(), ta, tb, &pops);
        let def = OpDef {
            name: "matmul",
            rules: rs,
            knobs: Select::default(),
            out_shape: shape,
            kernel: |l: &[&Storage<T>]| l[0].matmul_t(l[1], ta, tb),
            backward: Some(("matmul_backward", |(ins, _): Saved<'_, T>| {
                let (sa, sb) = (ins[0].detach(), ins[1].detach());
                move |g: &DTensor<T>| {
                    // With a' = op(a), b' = op(b): d a' = g b'ᵀ and d b' = a'ᵀ g, transposed back
                    // where the operand was, each as one strided product.
                    let ga = match (input_needs_grad(0), ta) {
                        (false, _) => None,
                        (true, false) => Some(g.matmul_t(&sb, false, !tb)?),
                        // dA = b' gᵀ; a batched `g` cannot follow a 2-D left operand: (g b'ᵀ)ᵀ.
                        (true, true) if sb.ndim() == 2 && g.ndim() > 2 => {
                            Some(g.matmul_t(&sb, false, !tb)?.transpose(-1, -2)?)
                        }
                        (true, true) => Some(sb.matmul_t(g, tb, true)?),
                    };
                    if !input_needs_grad(1) {
                        return Ok(vec![ga, None]);
                    }
                    let mut gb = if tb { g.matmul_t(&sa, true, ta)? } else { sa.matmul_t(g, !ta, false)? };
                    // A 2-D `b` shared by the batch: sum the per-batch products.
                    while gb.ndim() > sb.ndim() {
                        gb = gb.sum_dim(0, false)?;
                    }
                    Ok(vec![ga, Some(gb)])
                }
            })),
        };
        dispatch(def, &[self, other])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        assert_eq!(out_shape(&[2, 3, 4], &[4, 5]).unwrap(), vec![2, 3, 5]);
        assert_eq!(out_shape(&[2, 3, 4], &[2, 4, 5]).unwrap(), vec![2, 3, 5]);
        assert!(out_shape(&[3, 4], &[5, 6]).is_err());
        assert!(out_shape(&[2, 3, 4], &[3, 4, 5]).is_err());
        assert!(out_shape(&[4], &[4, 5]).is_err());
    }
}
