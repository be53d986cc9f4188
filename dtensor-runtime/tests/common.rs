//! Helpers shared by the integration tests: reference slicing and reductions on the global tensor.
#![allow(dead_code)]

use dtensor_runtime::layout::checked_local_shape_and_offset;
use dtensor_runtime::ndarray::{ArrayD, Axis, IxDyn, Slice};
use dtensor_runtime::{Placement, ReduceOp};

/// A global tensor with distinct small integer values (exact in f32/f64 sums).
pub fn global(shape: &[usize], seed: u64) -> ArrayD<f64> {
    let mut i = 0u64;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        i += 1;
        ((i.wrapping_mul(7919).wrapping_add(seed.wrapping_mul(104729))) % 97) as f64 - 48.0
    })
}

/// Row-major coordinate of a rank.
pub fn coord_of(rank: usize, mesh: &[usize]) -> Vec<usize> {
    let mut c = vec![0; mesh.len()];
    let mut r = rank;
    for i in (0..mesh.len()).rev() {
        c[i] = r % mesh[i];
        r /= mesh[i];
    }
    c
}

/// The slice of `g` that mesh coordinate `coord` holds (Partials count as Replicate).
pub fn expected_shard(g: &ArrayD<f64>, mesh: &[usize], coord: &[usize], placements: &[Placement]) -> ArrayD<f64> {
    let (shape, offset) = checked_local_shape_and_offset(g.shape(), mesh, coord, placements).unwrap();
    let mut v = g.view();
    for d in 0..shape.len() {
        v.slice_axis_inplace(Axis(d), Slice::from(offset[d]..offset[d] + shape[d]));
    }
    v.to_owned()
}

/// Reduces the local tensors of all ranks over the Partial mesh dims and checks that what
/// each rank then logically holds equals the slice of `g`. `locals[rank]`.
pub fn check_layout(
    g: &ArrayD<f64>,
    mesh: &[usize],
    placements: &[Placement],
    locals: &[ArrayD<f64>],
    tol: f64,
) -> Result<(), String> {
    let world: usize = mesh.iter().product();
    let partial_dims: Vec<usize> = (0..mesh.len()).filter(|&i| placements[i].is_partial()).collect();
    // All Partials of one list share a reduce op (the generators guarantee it).
    let op = partial_dims
        .iter()
        .find_map(|&i| match placements[i] {
            Placement::Partial(o) => Some(o),
            _ => None,
        })
        .unwrap_or(ReduceOp::Sum);
    for rank in 0..world {
        let c = coord_of(rank, mesh);
        // Reduce over the ranks that differ from `c` only on Partial mesh dims.
        let mut acc: Option<ArrayD<f64>> = None;
        let mut count = 0usize;
        for (other, l) in locals.iter().enumerate().take(world) {
            let oc = coord_of(other, mesh);
            if (0..mesh.len()).any(|i| !partial_dims.contains(&i) && oc[i] != c[i]) {
                continue;
            }
            count += 1;
            match acc.as_mut() {
                None => acc = Some(l.clone()),
                Some(a) => a.zip_mut_with(l, |x, y| {
                    *x = match op {
                        ReduceOp::Sum | ReduceOp::Avg => *x + *y,
                        ReduceOp::Min => x.min(*y),
                        ReduceOp::Max => x.max(*y),
                        ReduceOp::Product => *x * *y,
                    }
                }),
            }
        }
        let mut got = acc.expect("at least the rank itself");
        if op == ReduceOp::Avg && !partial_dims.is_empty() {
            got.mapv_inplace(|x| x / count as f64);
        }
        let want = expected_shard(g, mesh, &c, placements);
        if got.shape() != want.shape() {
            return Err(format!("rank {rank} {placements:?}: shape {:?} != expected {:?}", got.shape(), want.shape()));
        }
        if let Some((a, b)) = got.iter().zip(want.iter()).find(|(a, b)| (*a - *b).abs() > tol * (1.0 + b.abs())) {
            return Err(format!("rank {rank} {placements:?}: value {a} != expected {b}"));
        }
    }
    Ok(())
}

/// AdamW hyper-parameters (PyTorch's defaults, weight decay 0.1) at step `t` (from 1), with
/// the bias corrections the optimizer computes.
pub fn adamw_step_at(t: i32) -> dtensor_runtime::op::AdamWStep {
    dtensor_runtime::op::AdamWStep {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        bias_correction1: 1.0 - 0.9f64.powi(t),
        bias_correction2: 1.0 - 0.999f64.powi(t),
    }
}

/// The part shapes of a concatenation along `dim`: `base` with dim `dim` set to each of `sizes`
/// (list uneven and empty parts there).
pub fn cat_shapes(base: &[usize], dim: usize, sizes: &[usize]) -> Vec<Vec<usize>> {
    sizes
        .iter()
        .map(|&k| {
            let mut sh = base.to_vec();
            sh[dim] = k;
            sh
        })
        .collect()
}
