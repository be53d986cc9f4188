//! Issue 33, finding 3 (as a class): work on a tensor with no elements is bounded by the bytes
//! it moves, never by a shape's product. A zero-element tensor with a huge dim (`[2^40 + 1, 0]`
//! redistributed S(0) -> S(1) walked 2^39 rows of empty runs for minutes) goes through every
//! redistribution transition, and every variable-size collective gets huge row counts of
//! empty runs, on every CPU backend: each must finish in milliseconds.

mod equal_blocks;

use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::{distribute_tensor, run, Along, Communicator, DType, Placement, ReduceOp, ThreadWorld};
use equal_blocks::EqualBlocksOnly;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Huge extents: odd (uneven shards: the variable-size collectives) and even (the padded and
/// strided ones).
const HUGE: [usize; 2] = [(1 << 40) + 1, 1 << 40];

/// The shapes with no element: a huge dim next to a zero one, in every position.
fn empty_shapes() -> Vec<Vec<usize>> {
    let mut v = Vec::new();
    for h in HUGE {
        v.extend([vec![h, 0], vec![0, h], vec![h, 0, 3], vec![3, h, 0], vec![h, 3, 0]]);
    }
    // Two large dims (their product must still fit a shape's bound).
    v.push(vec![(1 << 20) + 1, (1 << 20) + 1, 0]);
    v
}

/// Every placement of one mesh dim for a tensor of `ndim` dims.
fn placements(ndim: usize) -> Vec<Placement> {
    let mut p = vec![Placement::Replicate, Placement::Partial(ReduceOp::Sum), Placement::Partial(ReduceOp::Max)];
    p.extend((0..ndim).map(|d| Placement::Shard(d as isize)));
    p
}

/// `global` laid out as `placements` on `mesh` (a Partial through Replicate first, as
/// `distribute_tensor` refuses Partial).
fn make<T: dtensor_runtime::Scalar>(
    global: &ArrayD<T>,
    mesh: &dtensor_runtime::DeviceMesh,
    placements: &[Placement],
) -> dtensor_runtime::Result<dtensor_runtime::DTensor<T>> {
    let replicated: Vec<Placement> =
        placements.iter().map(|p| if p.is_partial() { Placement::Replicate } else { *p }).collect();
    distribute_tensor(global, mesh, &replicated, None)?.redistribute(placements)
}

/// `t` redistributed to `to`: `None` when that is not a transition the runtime has (a
/// Partial changing its reduce op, Shard -> Partial(max): refused with a typed error).
fn redistribute<T: dtensor_runtime::Scalar>(
    t: &dtensor_runtime::DTensor<T>,
    to: &[Placement],
) -> dtensor_runtime::Result<Option<dtensor_runtime::DTensor<T>>> {
    match t.redistribute(to) {
        Ok(out) => Ok(Some(out)),
        Err(dtensor_runtime::Error::InvalidRedistribute { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Bound on one case (debug build, two ranks on a shared machine: generous for "milliseconds").
const LIMIT: Duration = Duration::from_secs(2);

/// Finding 3: every transition of every empty shape on a 1-d mesh of 2 and 3 ranks finishes
/// within `LIMIT`, and gives an empty tensor of the same shape.
#[test]
fn every_redistribution_of_an_empty_tensor_with_huge_dims_is_fast() {
    for n in [2, 3] {
        let shapes = empty_shapes();
        run(n, |ctx| {
            let mesh = ctx.init_device_mesh(&[n], &["x"])?;
            let mut done = 0;
            for shape in &shapes {
                let global = ArrayD::<f32>::zeros(IxDyn(shape));
                for from in placements(shape.len()) {
                    for to in placements(shape.len()) {
                        let start = Instant::now();
                        let t = make(&global, &mesh, &[from])?;
                        let Some(out) = redistribute(&t, &[to])? else { continue };
                        let full = out.full_tensor()?;
                        let took = start.elapsed();
                        assert!(took < LIMIT, "{n} ranks, {shape:?} {from} -> {to}: {took:?}");
                        assert_eq!((out.shape(), full.shape()), (&shape[..], &shape[..]), "{from} -> {to}");
                        done += 1;
                    }
                }
            }
            // Every shape's 25 or 36 pairs of placements, less the refused ones (Partial op
            // changes, Shard -> Partial(max)): a sanity check that the cases ran.
            assert!(done >= shapes.len() * 20, "only {done} transitions ran");
            Ok(())
        })
        .unwrap();
    }
}

/// The same on a 2-d mesh (2 x 2): transitions on either mesh dim, with the other dim sharded.
#[test]
fn empty_tensors_with_huge_dims_on_a_2d_mesh() {
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["a", "b"])?;
        for shape in [vec![HUGE[0], 0, 3], vec![3, HUGE[0], 0], vec![(1 << 20) + 1, 1 << 20, 0]] {
            let global = ArrayD::<f64>::zeros(IxDyn(&shape));
            for from in placements(3) {
                for to in placements(3) {
                    for (src, dst) in [
                        ([from, Placement::Shard(2)], [to, Placement::Shard(2)]),
                        ([Placement::Shard(0), from], [Placement::Shard(0), to]),
                    ] {
                        let start = Instant::now();
                        let t = make(&global, &mesh, &src)?;
                        let Some(out) = redistribute(&t, &dst)? else { continue };
                        assert!(start.elapsed() < LIMIT, "{shape:?} {src:?} -> {dst:?}: {:?}", start.elapsed());
                        assert_eq!(out.shape(), &shape[..]);
                    }
                }
            }
        }
        Ok(())
    })
    .unwrap();
}

/// Finding 3 at the collectives: `all_to_all_v` and `all_to_all_strided` of 2^40 rows of empty
/// runs, and the variable-size all-gather and reduce-scatter of empty blocks, through the
/// thread backend and through the padded defaults, each within `LIMIT`.
#[test]
fn collectives_of_many_empty_rows_are_fast() {
    for padded in [false, true] {
        let world = ThreadWorld::new(2, Duration::from_secs(30));
        let comms: Vec<Arc<dyn Communicator>> = (0..2)
            .map(|r| {
                let c = world.communicator(r).unwrap();
                if padded {
                    Arc::new(EqualBlocksOnly(c)) as Arc<dyn Communicator>
                } else {
                    Arc::new(c)
                }
            })
            .collect();
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let g = [0, 1];
                    for rows in [1usize << 40, usize::MAX] {
                        let start = Instant::now();
                        c.all_to_all_v(&g, (&[]).into(), rows, &[0, 0], (&mut []).into(), &[0, 0]).unwrap();
                        c.all_to_all_strided(&g, (&[]).into(), rows, 0, (&mut []).into()).unwrap();
                        assert!(start.elapsed() < LIMIT, "padded {padded} rows {rows}: {:?}", start.elapsed());
                    }
                    // One member sends nothing in 2^40 rows, the other real bytes in one row.
                    let start = Instant::now();
                    let (rows, runs, recv_counts) =
                        if c.rank() == 0 { (1 << 40, [0, 0], [0, 2]) } else { (1, [2, 0], [0, 0]) };
                    let send = vec![7u8; runs.iter().sum::<usize>() * usize::from(rows == 1)];
                    let mut recv = vec![0u8; recv_counts.iter().sum()];
                    c.all_to_all_v(&g, (&send).into(), rows, &runs, (&mut recv).into(), &recv_counts).unwrap();
                    assert_eq!(recv, if c.rank() == 0 { vec![7, 7] } else { vec![] });
                    c.all_gather_v(&g, (&[]).into(), &[0, 0], (&mut []).into()).unwrap();
                    c.reduce_scatter_v(&g, (&[]).into(), &[0, 0], (&mut []).into(), DType::F32, ReduceOp::Sum).unwrap();
                    assert!(start.elapsed() < LIMIT, "padded {padded}: {:?}", start.elapsed());
                });
            }
        });
    }
}

/// The typed mesh collectives of the same (what redistribution calls), with the fingerprint
/// check on as well.
#[test]
fn mesh_variable_collectives_of_many_empty_rows_are_fast() {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        for checks in [false, true] {
            mesh.set_collective_checks(checks);
            let start = Instant::now();
            let got = mesh.all_to_all_v::<f32>(Along::Dim(0), &[], 1 << 40, &[0, 0], &[0, 0])?;
            let strided = mesh.all_to_all_strided::<f32>(Along::Dim(0), &[], 1 << 40, 0)?;
            let gathered = mesh.all_gather_v::<f64>(Along::Dim(0), &[], &[0, 0])?;
            assert!(got.is_empty() && strided.is_empty() && gathered.is_empty());
            assert!(start.elapsed() < LIMIT, "checks {checks}: {:?}", start.elapsed());
        }
        Ok(())
    })
    .unwrap();
}
