//! visualize_sharding: the drawn blocks are exactly the shards the ranks hold.

mod common;

use common::global;
use dtensor_runtime::ndarray::{ArrayD, Axis, Slice};
use dtensor_runtime::visualize::{
    sharding_layout, visualize_sharding_plain, visualize_sharding_with, BoxStyle, ShardingLayout, VisualizeOptions,
};
use dtensor_runtime::{distribute_tensor, run, Error, Partial, Placement, ReduceOp, Replicate, Shard};

fn slice(g: &ArrayD<f64>, ranges: &[std::ops::Range<usize>]) -> ArrayD<f64> {
    let mut v = g.view();
    for (d, r) in ranges.iter().enumerate() {
        v.slice_axis_inplace(Axis(d), Slice::from(r.clone()));
    }
    v.to_owned()
}

/// Distributes a global tensor and checks on every rank that the layout it computes alone
/// matches what each rank really holds.
fn check_case(mesh_shape: &[usize], placements: &[Placement], shape: &[usize]) {
    let g = global(shape, 3);
    let world: usize = mesh_shape.iter().product();
    let names: Vec<&str> = ["a", "b", "c"][..mesh_shape.len()].to_vec();
    let per_rank: Vec<(ShardingLayout, ArrayD<f64>)> = run(world, |ctx| {
        let mesh = ctx.init_device_mesh(mesh_shape, &names)?;
        let dt = distribute_tensor(&g, &mesh, placements, None)?;
        Ok((sharding_layout(&dt)?, dt.to_host()?))
    })
    .unwrap();
    let case = format!("mesh {mesh_shape:?} {placements:?} shape {shape:?}");
    let layout = &per_rank[0].0;
    // Every rank draws the same picture without communicating.
    assert!(per_rank.iter().all(|(l, _)| l == layout), "{case}");
    // The blocks tile the tensor.
    let vol = |b: &dtensor_runtime::visualize::ShardBlock| b.ranges.iter().map(|r| r.len()).product::<usize>();
    assert_eq!(layout.blocks.iter().map(vol).sum::<usize>(), g.len(), "{case}");
    assert!(layout.blocks.iter().all(|b| !b.ranks.is_empty()), "{case}");
    for (rank, (_, local)) in per_rank.iter().enumerate() {
        let holding: Vec<_> = layout.blocks.iter().filter(|b| b.ranks.contains(&rank)).collect();
        if local.is_empty() {
            assert!(layout.empty_ranks.contains(&rank) && holding.is_empty(), "{case}: rank {rank}");
        } else {
            assert_eq!(holding.len(), 1, "{case}: rank {rank} should hold exactly one block");
            assert_eq!(&slice(&g, &holding[0].ranges), local, "{case}: rank {rank}");
            assert!(!layout.empty_ranks.contains(&rank), "{case}");
        }
    }
}

#[test]
fn blocks_match_the_shards_ranks_hold() {
    check_case(&[2, 2], &[Shard(0), Shard(1)], &[5, 7]);
    check_case(&[2, 2], &[Shard(1), Shard(0)], &[4, 4]);
    check_case(&[2, 2], &[Shard(0), Shard(0)], &[10, 3]); // nested
    check_case(&[2, 2], &[Shard(0), Shard(0)], &[3, 2]); // nested with an empty shard
    check_case(&[2, 2], &[Replicate, Shard(1)], &[4, 5]);
    check_case(&[2, 2], &[Replicate, Replicate], &[2, 2]);
    check_case(&[4], &[Shard(0)], &[3]); // 1-D, rank 3 empty
    check_case(&[4], &[Shard(0)], &[5, 2]);
    check_case(&[2, 3], &[Shard(1), Shard(0)], &[7, 5]);
    check_case(&[3], &[Replicate], &[6]);
}

fn picture(mesh_shape: &[usize], placements: &[Placement], shape: &[usize], opts: VisualizeOptions) -> String {
    let g = global(shape, 1);
    let world: usize = mesh_shape.iter().product();
    let names: Vec<&str> = ["dp", "tp"][..mesh_shape.len()].to_vec();
    let all = run(world, |ctx| {
        let mesh = ctx.init_device_mesh(mesh_shape, &names)?;
        let dt = distribute_tensor(&g, &mesh, &[Replicate; 2][..mesh_shape.len()], None)?;
        let dt = dt.redistribute(placements)?;
        visualize_sharding_with(&dt, &opts)
    })
    .unwrap();
    all[0].clone()
}

#[test]
fn plain_picture_of_uneven_2x2() {
    // torch.chunk: 5 rows over 2 -> [0:3], [3:5]; 7 columns over 2 -> [0:4], [4:7].
    let want = "\
DTensor [5, 7] f64 on DeviceMesh(dp=2, tp=2), placements (S(0), S(1))
+------------+------------+
| [0:3, 0:4] | [0:3, 4:7] |
|   rank 0   |   rank 1   |
+------------+------------+
| [3:5, 0:4] | [3:5, 4:7] |
|   rank 2   |   rank 3   |
+------------+------------+
";
    let got = picture(&[2, 2], &[Shard(0), Shard(1)], &[5, 7], VisualizeOptions::plain());
    println!("{got}");
    assert_eq!(got, want);
}

#[test]
fn replicated_partial_and_empty_blocks_list_their_ranks() {
    let no_header = VisualizeOptions { header: false, ..VisualizeOptions::plain() };
    // 3 over 4: [0:1] [1:2] [2:3] and rank 3 empty.
    let got = picture(&[4], &[Shard(0)], &[3], no_header.clone());
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(lines[1], "| [0:1]  | [1:2]  | [2:3]  |");
    assert_eq!(lines[2], "| rank 0 | rank 1 | rank 2 |");
    assert_eq!(lines[4], "empty shards: rank 3");
    // Replicated over dp: each column block is held by the two dp replicas.
    let got = picture(&[2, 2], &[Replicate, Shard(1)], &[4, 4], no_header);
    assert!(got.contains("| [0:4, 0:2] | [0:4, 2:4] |"), "{got}");
    assert!(got.contains("| ranks 0,2  | ranks 1,3  |"), "{got}");
    // Partial over dp: same blocks, and the header says the values are partial.
    let got = picture(&[2, 2], &[Partial(ReduceOp::Sum), Shard(0)], &[4, 4], VisualizeOptions::plain());
    assert!(got.contains("placements (P(sum), S(0))"), "{got}");
    assert!(got.contains("partial: P(sum) on mesh dim dp"), "{got}");
    assert!(got.contains("ranks 0,2") && got.contains("ranks 1,3"), "{got}");
}

#[test]
fn terminal_picture_uses_box_drawing_and_colour() {
    let opts = VisualizeOptions { style: BoxStyle::Unicode, color: true, header: false };
    let got = picture(&[2, 2], &[Shard(0), Shard(1)], &[5, 7], opts);
    assert!(got.starts_with('┌') && got.contains('┼') && got.contains("\x1b[0m"), "{got}");
    // Without the escapes every line has the same width.
    let strip = |l: &str| {
        let mut out = String::new();
        let mut esc = false;
        for c in l.chars() {
            match (esc, c) {
                (_, '\x1b') => esc = true,
                (true, 'm') => esc = false,
                (true, _) => {}
                (false, c) => out.push(c),
            }
        }
        out.chars().count()
    };
    let widths: Vec<usize> = got.lines().map(strip).collect();
    assert!(widths.iter().all(|&w| w == widths[0]), "{widths:?}");
    // Four different rank sets, four different colours.
    let colours: std::collections::BTreeSet<&str> = got.split("48;5;").skip(1).map(|s| &s[..3]).collect();
    assert_eq!(colours.len(), 4, "{got}");
}

#[test]
fn only_1d_and_2d_tensors_are_drawn() {
    let g3 = global(&[2, 2, 2], 1);
    let g0 = ArrayD::<f64>::zeros(vec![]);
    let r = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let a = visualize_sharding_plain(&distribute_tensor(&g3, &mesh, &[Shard(2)], None)?);
        let b = visualize_sharding_plain(&distribute_tensor(&g0, &mesh, &[Replicate], None)?);
        Ok((a, b))
    })
    .unwrap();
    for (a, b) in r {
        assert!(matches!(a, Err(Error::Unsupported { ref op, .. }) if op == "visualize_sharding"), "{a:?}");
        assert!(matches!(b, Err(Error::Unsupported { .. })), "{b:?}");
    }
}
