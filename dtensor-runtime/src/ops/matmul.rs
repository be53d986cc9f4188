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
use crate::error::Result;
use crate::placement::{Placement, ReduceOp};
use crate::storage::matmul_shape as out_shape;

const R: Placement = Placement::Replicate;

fn shard(d: usize) -> Placement {
    Placement::Shard(d as isize)
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
        let local = a.local.matmul(&b.local)?;
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
}
