//! Dropout: the mask is the same for every mesh and placement (placement-invariant Philox
//! stream), each call draws a fresh mask, the gradient uses the same mask, eval is the
//! identity, and the kept fraction matches `1 - p`.

use dtensor_runtime::module::{Dropout, Forward};
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::{
    distribute_tensor, manual_seed, run, Error, Partial, Placement, ReduceOp, Replicate as R, Shard as S,
};

fn x() -> ArrayD<f64> {
    ArrayD::from_shape_fn(IxDyn(&[9, 7]), |ix| 1.0 + ix[0] as f64 * 0.1 + ix[1] as f64 * 0.2)
}

/// Full dropout output on a mesh of `mesh` ranks with `pl`, after `manual_seed(11)`.
fn dropped(mesh: &[usize], pl: &[Placement]) -> ArrayD<f64> {
    let n: usize = mesh.iter().product();
    run(n, |ctx| {
        let m = ctx.init_device_mesh(mesh, &[])?;
        let start: Vec<Placement> = pl.iter().map(|p| if p.is_partial() { R } else { *p }).collect();
        let mut d = distribute_tensor(x(), &m, &start, None)?;
        if start != pl {
            d = d.redistribute(pl)?;
        }
        manual_seed(11);
        d.dropout(0.4, true)?.full_tensor()
    })
    .unwrap()
    .remove(0)
}

#[test]
fn the_mask_is_the_same_for_every_mesh_and_placement() {
    let one = dropped(&[1], &[R]);
    let zeros = one.iter().filter(|v| **v == 0.0).count();
    assert!(zeros > 0 && zeros < one.len(), "{zeros} of {}", one.len());
    for (mesh, pl) in [
        (vec![2, 2], vec![S(0), S(1)]),
        (vec![2, 2], vec![S(1), S(1)]),
        (vec![3], vec![S(0)]),
        (vec![2, 2], vec![R, S(0)]),
        (vec![2], vec![Partial(ReduceOp::Sum)]),
    ] {
        assert_eq!(dropped(&mesh, &pl), one, "{mesh:?} {pl:?}");
    }
    // kept elements are scaled by 1/(1-p)
    for (o, i) in one.iter().zip(x().iter()) {
        assert!(*o == 0.0 || (o - i / 0.6).abs() < 1e-12);
    }
}

#[test]
fn fresh_mask_per_call_gradient_and_eval() {
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &[])?;
        manual_seed(5);
        let big = distribute_tensor(ArrayD::<f64>::ones(IxDyn(&[100, 100])), &mesh, &[S(0), S(1)], None)?;
        let a = big.dropout(0.25, true)?.full_tensor()?;
        let b = big.dropout(0.25, true)?.full_tensor()?;
        let leaf = distribute_tensor(x(), &mesh, &[S(1), S(0)], None)?.requires_grad_(true);
        let y = leaf.dropout(0.5, true)?;
        y.sum()?.backward()?;
        let (yf, g) = (y.full_tensor()?, leaf.grad().expect("grad").full_tensor()?);
        let mut layer = Dropout::new(0.5)?;
        layer.eval();
        let same = Forward::<f64>::forward(&layer, &leaf)?.full_tensor()? == x();
        Ok((a, b, yf, g, same, Dropout::new(1.5).err(), big.dropout(-0.1, true).err()))
    })
    .unwrap();
    let (a, b, y, g, same, bad_layer, bad_p) = &out[0];
    assert_ne!(a, b, "each call draws a new mask");
    let kept = a.iter().filter(|v| **v != 0.0).count() as f64 / a.len() as f64;
    assert!((kept - 0.75).abs() < 0.02, "kept fraction {kept}");
    for (gy, (yy, xx)) in g.iter().zip(y.iter().zip(x().iter())) {
        assert_eq!(*gy, if *yy == 0.0 { 0.0 } else { 2.0 }, "x = {xx}");
    }
    assert!(same, "eval mode is the identity");
    assert!(matches!(bad_layer, Some(Error::InvalidArgument { .. })));
    assert!(matches!(bad_p, Some(Error::InvalidArgument { .. })));
}

/// Dropout of a `Partial` reduces it first: an implicit move, logged like every op's
/// (`implicit_redistributions`), attributed to `dropout`, and planned once.
#[test]
fn reducing_a_partial_is_a_logged_implicit_move() {
    let out = run(2, |ctx| {
        let m = ctx.init_device_mesh(&[2], &[])?;
        let d = distribute_tensor(x(), &m, &[R], None)?.redistribute(&[Partial(ReduceOp::Sum)])?;
        let _ = dtensor_runtime::implicit_redistributions();
        manual_seed(3);
        let full = d.dropout(0.4, true)?.full_tensor()?;
        let log = dtensor_runtime::implicit_redistributions();
        Ok((full, log.iter().map(|r| (r.op, r.from.clone(), r.to.clone())).collect::<Vec<_>>()))
    })
    .unwrap();
    for (_, log) in &out {
        assert_eq!(log, &vec![("dropout", vec![Partial(ReduceOp::Sum)], vec![R])]);
    }
    assert_eq!(out[0].0, out[1].0);
}
