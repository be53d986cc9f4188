//! Matrix multiplication `[.., m, k] @ [k, n]` or `[.., m, k] @ [.., k, n]` (same batch dims).
//!
//! Rules per mesh dim (`P` = Partial(sum) or Partial(avg) when an input has it):
//! `(R,R)→R`, `(S(m),R)→S(m)`, `(R,S(n))→S(n)`, `(S(k),S(k))→Partial(sum)`, `(P,R)→P`,
//! `(R,P)→P`, batch dims `(S(b),S(b))→S(b)` (or `(S(b),R)→S(b)` when the right side is 2-D).

use super::new_output;
use super::strategy::{partial_ops, select, DimRule, Select};
use crate::autograd::{input_needs_grad, record, recording};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::placement::{Placement, ReduceOp};
use ndarray::{s, ArrayD, Axis, Ix2, Ix3, IxDyn};

const R: Placement = Placement::Replicate;

fn shard(d: usize) -> Placement {
    Placement::Shard(d as isize)
}

/// Output shape of `a @ b`, or the error naming both shapes.
fn out_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let bad = |why: &str| Error::ShapeMismatch {
        context: format!("matmul: {why}"),
        expected: a.to_vec(),
        actual: b.to_vec(),
    };
    if a.len() < 2 || b.len() < 2 {
        return Err(bad("both operands need at least 2 dims"));
    }
    let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
    let (k2, n) = (b[b.len() - 2], b[b.len() - 1]);
    if k != k2 {
        return Err(bad("inner dimensions differ"));
    }
    if b.len() > 2 && b[..b.len() - 2] != a[..a.len() - 2] {
        return Err(bad("batch dimensions differ (the right operand must be 2-D or have the same batch dims)"));
    }
    let mut out = a[..a.len() - 2].to_vec();
    out.extend([m, n]);
    Ok(out)
}

fn rules(na: usize, nb: usize, pops: &[ReduceOp]) -> Vec<DimRule> {
    let nbatch = na - 2;
    let (am, ak) = (na - 2, na - 1);
    let (bk, bn) = (nb - 2, nb - 1);
    let mut r = vec![
        DimRule::new(&[R, R], R),
        DimRule::new(&[shard(am), R], shard(am)),
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

/// Local kernel: `a` is `[.., m, k]`, `b` is `[k, n]` or `[.., k, n]` with a's batch dims.
fn local_matmul<T: Element>(a: &ArrayD<T>, b: &ArrayD<T>) -> Result<ArrayD<T>> {
    let na = a.ndim();
    let (m, k) = (a.shape()[na - 2], a.shape()[na - 1]);
    let n = b.shape()[b.ndim() - 1];
    let batch: Vec<usize> = a.shape()[..na - 2].to_vec();
    let nbatch: usize = batch.iter().product();
    let mut out_shape = batch.clone();
    out_shape.extend([m, n]);
    let shape_err = |e: ndarray::ShapeError| Error::Unsupported { op: "matmul".into(), reason: e.to_string() };
    let a3 = a.as_standard_layout().into_owned().into_shape_with_order(IxDyn(&[nbatch, m, k])).map_err(shape_err)?;
    let a3 = a3.into_dimensionality::<Ix3>().map_err(shape_err)?;
    let out = if b.ndim() == 2 {
        let b2 = b.view().into_dimensionality::<Ix2>().map_err(shape_err)?;
        let a2 = a3.into_shape_with_order((nbatch * m, k)).map_err(shape_err)?;
        a2.dot(&b2).into_dyn()
    } else {
        let b3 =
            b.as_standard_layout().into_owned().into_shape_with_order(IxDyn(&[nbatch, k, n])).map_err(shape_err)?;
        let b3 = b3.into_dimensionality::<Ix3>().map_err(shape_err)?;
        let mut o = ndarray::Array3::<T>::zeros((nbatch, m, n));
        for i in 0..nbatch {
            o.slice_mut(s![i, .., ..]).assign(&a3.index_axis(Axis(0), i).dot(&b3.index_axis(Axis(0), i)));
        }
        o.into_dyn()
    };
    // `dot` may return a column-major result; reshape needs row-major.
    out.as_standard_layout().into_owned().into_shape_with_order(IxDyn(&out_shape)).map_err(shape_err)
}

impl<T: Element> DTensor<T> {
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
        let shape = out_shape(&self.shape, &other.shape)?;
        let pops = partial_ops(&[self, other], &[ReduceOp::Sum, ReduceOp::Avg]);
        let rs = rules(self.ndim(), other.ndim(), &pops);
        let c = select("matmul", &[self, other], &rs, Select::default())?;
        let (a, b) = (&*c.inputs[0], &*c.inputs[1]);
        let local = local_matmul(&a.local, &b.local)?;
        let out = new_output(local, &a.mesh, c.output, shape);
        if !recording(&[a, b]) {
            return Ok(out);
        }
        let (sa, sb) = (a.detach(), b.detach());
        Ok(record("matmul_backward", out, &[a, b], move |g| {
            let ga = if input_needs_grad(0) { Some(g.matmul(&sb.transpose(-1, -2)?)?) } else { None };
            if !input_needs_grad(1) {
                return Ok(vec![ga, None]);
            }
            let gb = if sb.ndim() == 2 && sa.ndim() > 2 {
                // Sum over the batch of a_iᵀ g_i.
                let mut gb = sa.transpose(-1, -2)?.matmul(g)?;
                while gb.ndim() > 2 {
                    gb = gb.sum_dim(0, false)?;
                }
                gb
            } else {
                sa.transpose(-1, -2)?.matmul(g)?
            };
            Ok(vec![ga, Some(gb)])
        }))
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

    #[test]
    fn local_kernel_batched_equals_loop() {
        let a = ArrayD::from_shape_fn(IxDyn(&[2, 3, 4]), |ix| (ix[0] * 12 + ix[1] * 4 + ix[2]) as f64);
        let b = ArrayD::from_shape_fn(IxDyn(&[4, 2]), |ix| (ix[0] as f64) - (ix[1] as f64));
        let c = local_matmul(&a, &b).unwrap();
        for i in 0..2 {
            let ai = a.index_axis(Axis(0), i).into_dimensionality::<Ix2>().unwrap().to_owned();
            let bi = b.view().into_dimensionality::<Ix2>().unwrap().to_owned();
            assert_eq!(c.index_axis(Axis(0), i), ai.dot(&bi).into_dyn());
        }
    }
}
