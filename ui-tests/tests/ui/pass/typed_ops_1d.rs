//! Typed ops on a 1-D `tp` mesh: the annotated output layouts are what the rules compute
//! (a wrong annotation would not compile) and the values match the single-device result.
use dtensor::ndarray::{ArrayD, Axis, Ix2, IxDyn};
use dtensor::typed::dims::tp;
use dtensor::typed::Dim;
use dtensor::{Dt, Partial, Replicate, Shard, Sum};

type M = (tp,);

fn array(rows: usize, cols: usize, seed: usize) -> ArrayD<f64> {
    ArrayD::from_shape_fn(IxDyn(&[rows, cols]), |ix| ((ix[0] * cols + ix[1] + seed) % 5) as f64 - 2.0)
}

fn main() {
    let (a, b) = (array(5, 6, 1), array(6, 3, 2));
    let d2 = |x: &ArrayD<f64>| x.view().into_dimensionality::<Ix2>().unwrap().to_owned();
    let ab = d2(&a).dot(&d2(&b)).into_dyn();
    let out = dtensor::run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let a_r: Dt<f64, M, (Replicate,), 2> = Dt::distribute(&a, &mesh)?;
        let a_k: Dt<f64, M, (Shard<1>,), 2> = a_r.redistribute()?;
        let b_k: Dt<f64, M, (Shard<0>,), 2> = Dt::distribute(&b, &mesh)?;
        let b_n: Dt<f64, M, (Shard<1>,), 2> = b_k.redistribute()?;
        // Column parallel, row parallel (contraction over the shards), Partial stays linear.
        let col: Dt<f64, M, (Shard<1>,), 2> = a_r.matmul(&b_n)?;
        let row: Dt<f64, M, (Partial<Sum>,), 2> = a_k.matmul(&b_k)?;
        let twice: Dt<f64, M, (Partial<Sum>,), 2> = row.add(&row)?;
        let rows: Dt<f64, M, (Partial<Sum>,), 2> = col.redistribute::<(Replicate,)>()?.relu()?.sum(Dim::<1>)?.add(&row.sum(Dim::<1>)?)?;
        let col_t: Dt<f64, M, (Shard<0>,), 2> = col.t()?;
        let summed: Dt<f64, M, (Partial<Sum>,), 2> = col_t.sum(Dim::<0>)?;
        Ok((col.full_tensor()?, twice.full_tensor()?, rows.full_tensor()?, summed.full_tensor()?))
    })
    .unwrap();
    let relu_rows = ab.mapv(|v| v.max(0.0)).sum_axis(Axis(1)) + ab.sum_axis(Axis(1));
    for (col, twice, rows, summed) in out {
        assert_eq!(col, ab);
        assert_eq!(twice, &ab * 2.0);
        assert_eq!(rows, relu_rows.clone().insert_axis(Axis(1)));
        assert_eq!(summed, ab.t().sum_axis(Axis(0)).insert_axis(Axis(0)));
    }
}
