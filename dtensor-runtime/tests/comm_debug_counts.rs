//! CommDebugMode counts exactly the collectives a redistribution plan issues, on every rank.

mod common;

use common::global;
use dtensor_runtime::{
    distribute_tensor, from_local, op_scope, run, CollectiveKind, CommDebugMode, FromLocal, Partial, Placement,
    ReduceOp, Replicate, Shard,
};
use std::collections::BTreeMap;

use CollectiveKind::*;

/// Redistributes a tensor of `shape` on a 2×2 (dp, tp) mesh from `from` to `to` and returns,
/// per rank, the recorded (kind, mesh dim, bytes) plus the plan's own list of collectives.
#[allow(clippy::type_complexity)]
fn record_2x2(
    shape: &[usize],
    from: &[Placement],
    to: &[Placement],
) -> Vec<(Vec<(CollectiveKind, String, usize)>, Vec<(CollectiveKind, String, usize)>)> {
    let g = global(shape, 9);
    run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let start: Vec<Placement> = from.iter().map(|p| if p.is_partial() { Replicate } else { *p }).collect();
        let mut dt = distribute_tensor(&g, &mesh, &start, None)?;
        if start != from {
            dt = dt.redistribute(from)?; // R -> P is local
        }
        let plan = dt.plan_redistribute(to)?;
        let mode = CommDebugMode::new();
        mode.scope(|| dt.redistribute(to))?;
        let got = mode.records().iter().map(|r| (r.kind, r.mesh_dim_label().to_string(), r.bytes)).collect();
        let planned = plan
            .steps
            .iter()
            .filter_map(|s| s.collective.map(|c| (c, mesh.dim_names()[s.mesh_dim].clone(), s.bytes)))
            .collect();
        Ok((got, planned))
    })
    .unwrap()
}

fn kinds(r: &[(CollectiveKind, String, usize)]) -> Vec<(CollectiveKind, &str)> {
    r.iter().map(|(k, d, _)| (*k, d.as_str())).collect()
}

#[test]
fn nested_shard_to_replicate_is_two_all_gathers_per_rank() {
    // (S0, S0) -> (R, S0): undo tp, undo dp (all-gathers), redo tp locally.
    for (rank, (got, planned)) in record_2x2(&[8, 3], &[Shard(0), Shard(0)], &[Replicate, Shard(0)]).iter().enumerate()
    {
        assert_eq!(kinds(got), vec![(AllGather, "tp"), (AllGather, "dp")], "rank {rank}");
        assert_eq!(kinds(got), kinds(planned), "rank {rank}");
        // tp gathers padded chunks of 2 rows x 3 of the dp block (4 rows), dp chunks of 4 rows.
        assert_eq!(got.iter().map(|x| x.2).collect::<Vec<_>>(), vec![2 * 3 * 8, 4 * 3 * 8], "rank {rank}");
    }
}

/// P(sum) -> S(0) on a 2-rank mesh: the recorded collectives (and the resulting shard).
fn partial_to_shard_1d(shape: &[usize]) -> Vec<(BTreeMap<CollectiveKind, usize>, usize, Vec<CollectiveKind>)> {
    let g = global(shape, 2);
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let p = from_local(g.clone(), &mesh, &[Partial(ReduceOp::Sum)], FromLocal::default())?;
        let plan = p.plan_redistribute(&[Shard(0)])?;
        let mode = CommDebugMode::new();
        let s = mode.scope(|| p.redistribute(&[Shard(0)]))?;
        // The shard is the sum of both ranks' copies (torch.chunk rows).
        let c = shape[0].div_ceil(2);
        let (lo, hi) = (c * ctx.rank(), (c * ctx.rank() + c).min(shape[0]));
        let want = g.slice(dtensor_runtime::ndarray::s![lo..hi, ..]).mapv(|x| 2.0 * x).into_dyn();
        assert_eq!(s.to_host()?, want);
        let planned = plan.steps.iter().filter_map(|s| s.collective).collect();
        Ok((mode.get_comm_counts(), mode.count_on(ReduceScatter, "tp"), planned))
    })
    .unwrap()
}

#[test]
fn partial_to_shard_is_one_reduce_scatter_per_rank() {
    for (rank, (by_kind, on_tp, _)) in partial_to_shard_1d(&[4, 4]).into_iter().enumerate() {
        assert_eq!(by_kind, BTreeMap::from([(ReduceScatter, 1)]), "rank {rank}");
        assert_eq!(on_tp, 1, "rank {rank}");
    }
    for (rank, (got, planned)) in
        record_2x2(&[8, 6], &[Partial(ReduceOp::Sum), Shard(1)], &[Shard(0), Shard(1)]).iter().enumerate()
    {
        assert_eq!(kinds(got), vec![(ReduceScatter, "dp")], "rank {rank}");
        assert_eq!(kinds(got), kinds(planned), "rank {rank}");
        // Each rank sends 2 chunks of 4 rows of its own 3 tp columns.
        assert_eq!(got[0].2, 2 * 4 * 3 * 8, "rank {rank}");
    }
    // Uneven rows: whatever single collective the planner picks is what gets recorded.
    for (rank, (by_kind, _, planned)) in partial_to_shard_1d(&[5, 4]).into_iter().enumerate() {
        assert_eq!(by_kind.values().sum::<usize>(), 1, "rank {rank}: {by_kind:?}");
        assert_eq!(by_kind.keys().copied().collect::<Vec<_>>(), planned, "rank {rank}");
    }
}

#[test]
fn every_transition_records_what_its_plan_says() {
    // (from, to, the collectives expected on every rank; None: whatever the plan says)
    type Case = (Vec<Placement>, Vec<Placement>, Option<Vec<(CollectiveKind, &'static str)>>);
    let cases: Vec<Case> = vec![
        (vec![Shard(0), Replicate], vec![Replicate, Replicate], Some(vec![(AllGather, "dp")])),
        (vec![Shard(0), Shard(1)], vec![Shard(1), Shard(0)], None),
        (vec![Replicate, Replicate], vec![Shard(0), Shard(1)], Some(vec![])),
        (vec![Partial(ReduceOp::Sum), Shard(0)], vec![Replicate, Shard(0)], Some(vec![(AllReduce, "dp")])),
        (vec![Replicate, Partial(ReduceOp::Max)], vec![Replicate, Replicate], Some(vec![(AllReduce, "tp")])),
        // Two all-gathers; their order is the planner's (uneven shapes make one order cheaper).
        (vec![Shard(1), Shard(0)], vec![Replicate, Replicate], None),
        (vec![Shard(0), Shard(0)], vec![Shard(1), Replicate], None),
    ];
    for shape in [[7, 5], [8, 8]] {
        for (from, to, want) in &cases {
            for (rank, (got, planned)) in record_2x2(&shape, from, to).iter().enumerate() {
                assert_eq!(kinds(got), kinds(planned), "{shape:?} {from:?} -> {to:?} rank {rank}");
                if let Some(want) = want {
                    assert_eq!(&kinds(got), want, "{shape:?} {from:?} -> {to:?} rank {rank}");
                }
            }
        }
    }
}

#[test]
fn ops_scopes_attribute_and_summarise() {
    let g = global(&[4, 4], 1);
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let dt = distribute_tensor(&g, &mesh, &[Shard(0)], None)?;
        let mode = CommDebugMode::new();
        let _g = mode.enter();
        op_scope("mlp", || op_scope(format!("layer{}", 0), || dt.redistribute(&[Replicate])))?;
        let p = from_local(g.clone(), &mesh, &[Partial(ReduceOp::Sum)], FromLocal::default())?;
        p.redistribute(&[Replicate])?;
        Ok((mode.records(), mode.by_op(), mode.summary(), mode.tracing_table()))
    })
    .unwrap();
    for (records, by_op, summary, tree) in out {
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].op_path, vec!["mlp", "layer0", "redistribute"]);
        assert_eq!(records[1].op_path, vec!["redistribute"]);
        assert_eq!(by_op["redistribute"][&AllGather].count, 1);
        assert_eq!(by_op["redistribute"][&AllReduce].count, 1);
        // all-gather of a 2x4 f64 chunk, all-reduce of the full 4x4.
        assert_eq!(by_op["redistribute"][&AllGather].bytes, 64);
        assert_eq!(by_op["redistribute"][&AllReduce].bytes, 128);
        let lines: Vec<&str> = summary.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["collective", "mesh", "dim", "group", "op", "count", "bytes"]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["all_gather", "tp", "2", "mlp/layer0/redistribute", "1", "64", "B"]
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["all_reduce", "tp", "2", "redistribute", "1", "128", "B"]
        );
        assert_eq!(lines[3].split_whitespace().collect::<Vec<_>>(), ["total", "2", "192", "B"]);
        let want = "\
mlp
  layer0
    redistribute
      all_gather  tp  count 1  64 B
redistribute
  all_reduce  tp  count 1  128 B
";
        assert_eq!(tree, want);
    }
}

#[test]
fn distribute_from_a_source_rank_is_a_broadcast_and_a_scatter() {
    let g = global(&[6, 2], 4);
    let counts = run(3, |ctx| {
        let mesh = ctx.init_device_mesh(&[3], &["x"])?;
        let mode = CommDebugMode::new();
        mode.scope(|| distribute_tensor(&g, &mesh, &[Shard(0)], Some(0)))?;
        Ok(mode.get_comm_counts())
    })
    .unwrap();
    for c in counts {
        assert_eq!(c, BTreeMap::from([(Broadcast, 1), (Scatter, 1)]));
    }
}

/// A mesh dim of one rank has no collectives: what runs on its group of one is a local copy,
/// so nothing is recorded (and, fingerprint check on, nothing is agreed), while every value is
/// what the collective gives. The 2-rank dim still records each call.
#[test]
fn a_group_of_one_rank_records_no_collective() {
    use dtensor_runtime::mesh::Along;
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 1], &["dp", "tp"])?;
        mesh.set_collective_checks(true);
        let r = mesh.rank() as f32;
        let mode = CommDebugMode::new();
        let (one, two) = mode.scope(|| -> dtensor_runtime::Result<_> {
            let mut sum = vec![r + 1.0, 2.0 * r];
            mesh.all_reduce(Along::Dim(1), &mut sum, ReduceOp::Sum)?;
            let gathered = mesh.all_gather(Along::Dim(1), &[r, r + 0.5])?;
            let mut b = vec![r; 3];
            mesh.broadcast(Along::Dim(1), &mut b, 0)?;
            mesh.barrier(Along::Dim(1))?;
            let one = (sum, gathered, b);
            let mut both = vec![r + 1.0];
            mesh.all_reduce(Along::Dim(0), &mut both, ReduceOp::Sum)?;
            Ok((one, both))
        })?;
        let recs: Vec<(CollectiveKind, String)> =
            mode.records().iter().map(|x| (x.kind, x.mesh_dim_label().to_string())).collect();
        Ok((r, one, two, recs))
    })
    .unwrap();
    for (r, (sum, gathered, b), both, recs) in out {
        assert_eq!(sum, vec![r + 1.0, 2.0 * r], "rank {r}: a sum over one rank is the input");
        assert_eq!(gathered, vec![r, r + 0.5], "rank {r}");
        assert_eq!(b, vec![r; 3], "rank {r}");
        assert_eq!(both, vec![3.0], "rank {r}: 1 + 2 over dp");
        assert_eq!(recs, vec![(AllReduce, "dp".to_string())], "rank {r}: only the dp all-reduce is a collective");
    }
}
