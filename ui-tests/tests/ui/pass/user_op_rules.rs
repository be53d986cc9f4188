//! A user's ops with typed rules, from a downstream crate: the fused ops of `dtensor-user-ops`
//! on every layout their rules allow, a rule defined here and lifted with `typed_rule!`, and
//! typed `local_map`s with legal gradient layouts.

use dtensor::typed::dims::{dp, tp};
use dtensor::typed::{Dt, MeshDims, Partial, PlacementMarker, Replicate, Shard, Sum, TypedOp1};
use dtensor::{CustomOp, DimRule, Element, Result};
use dtensor_user_ops::{Linear, RmsNormLinear, SwiGlu};

type T2<L> = Dt<f32, (dp, tp), L, 2>;
type T3<L> = Dt<f32, (dp, tp), L, 3>;

fn swiglu(a: &T2<(Shard<0>, Shard<1>)>, b: &T2<(Shard<0>, Shard<1>)>, r: &T2<(Replicate, Replicate)>) -> Result<()> {
    let _: T2<(Shard<0>, Shard<1>)> = a.apply_op2(&SwiGlu, b)?;
    let _: T2<(Replicate, Replicate)> = r.apply_op2(&SwiGlu, r)?;
    Ok(())
}

fn linear(
    x: &T3<(Shard<0>, Replicate)>,
    col: &T2<(Replicate, Shard<0>)>,
    h: &T3<(Shard<0>, Shard<2>)>,
    row: &T2<(Replicate, Shard<1>)>,
    p: &T2<(Partial<Sum>, Replicate)>,
    r: &T2<(Replicate, Replicate)>,
) -> Result<()> {
    let _: T3<(Shard<0>, Shard<2>)> = x.apply_op2(&Linear, col)?;
    let _: T3<(Shard<0>, Partial<Sum>)> = h.apply_op2(&Linear, row)?;
    let _: T2<(Partial<Sum>, Replicate)> = p.apply_op2(&Linear, r)?;
    Ok(())
}

fn norm_linear(
    x: &T3<(Shard<0>, Replicate)>,
    g: &Dt<f32, (dp, tp), (Replicate, Replicate), 1>,
    col: &T2<(Replicate, Shard<0>)>,
    seq: &T3<(Replicate, Shard<1>)>,
    r: &T2<(Replicate, Replicate)>,
) -> Result<()> {
    let op = RmsNormLinear { eps: 1e-6 };
    let _: T3<(Shard<0>, Shard<2>)> = x.apply_op3(&op, g, col)?;
    let _: T3<(Replicate, Shard<1>)> = seq.apply_op3(&op, g, r)?;
    Ok(())
}

/// A rule defined in this crate: sums over the last dim, which may not be split.
#[derive(Clone)]
struct RowSum;

impl<T: Element> CustomOp<T> for RowSum {
    fn name(&self) -> &'static str {
        "row_sum"
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        Ok(inputs[0][..1].to_vec())
    }
    fn rules(&self, _: &[&[usize]]) -> Vec<DimRule> {
        vec![DimRule::new(&[dtensor::Replicate], dtensor::Replicate)]
    }
    fn forward(&self, inputs: &[&dtensor::ndarray::ArrayD<T>]) -> Result<dtensor::ndarray::ArrayD<T>> {
        Ok(inputs[0].sum_axis(dtensor::ndarray::Axis(1)))
    }
}

#[diagnostic::on_unimplemented(message = "row_sum reads whole rows: `{Self}` on mesh dim `{Name}`")]
pub trait RowSumRule<Name> {
    type Out: PlacementMarker;
}
impl<N> RowSumRule<N> for Replicate {
    type Out = Replicate;
}
dtensor::typed_rule!(unary RowSumLayout = RowSumRule);
impl<T: Element, M: MeshDims, L: RowSumLayout<M>> TypedOp1<T, M, L, 2, 1> for RowSum {
    type Out = <L as RowSumLayout<M>>::Out;
}

fn own_rule(r: &T2<(Replicate, Replicate)>) -> Result<Dt<f32, (dp, tp), (Replicate, Replicate), 1>> {
    r.apply_op(&RowSum)
}

fn local_maps(s: &T2<(Shard<0>, Replicate)>, r: &T2<(Replicate, Replicate)>) -> Result<()> {
    // a replicated input every rank uses differently: its gradient is a Partial sum
    let _: T2<(Shard<0>, Replicate)> =
        s.local_map2::<(Shard<0>, Replicate), (Partial<Sum>, Replicate), _, _, _, _>(r, "scaled", Some(s.shape()), |a, b| {
            a.mul(b)
        })?;
    let _: Dt<f32, (dp, tp), (Partial<Sum>, Replicate), 0> =
        s.local_map::<(Shard<0>, Replicate), _, _>("local_sum", Some(&[]), |a| a.sum())?;
    Ok(())
}

fn main() {
    let _ = (swiglu, linear, norm_linear, own_rule, local_maps);
}
