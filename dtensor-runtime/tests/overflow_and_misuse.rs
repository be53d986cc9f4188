//! Huge shapes, bad arguments to public helpers and thread-spawn failure: typed errors in
//! debug and release builds alike (never a panic, a wrapped value or an abort), or a
//! documented panic for the `Index`-like accessors.

use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::visualize::layout_of;
use dtensor_runtime::{
    from_local, plan_redistribute, run, Along, DeviceMesh, Error, FromLocal, LocalWorld, Partial, ReduceOp, Replicate,
    Shard,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------ overflow

#[test]
fn mesh_shapes_whose_size_overflows() {
    run(1, |ctx| {
        // 2^32 x 2^32 wraps to 0 in release with a plain product.
        let e = DeviceMesh::new(Arc::clone(ctx.comm()), &[1 << 32, 1 << 32], &["a", "b"]).unwrap_err();
        assert!(matches!(e, Error::ShapeOverflow { .. }), "{e}");
        let e = DeviceMesh::from_spec(Arc::clone(ctx.comm()), "a=4294967296,b=4294967296").unwrap_err();
        assert!(matches!(e, Error::ShapeOverflow { .. }), "{e}");
        Ok(())
    })
    .unwrap();
}

#[test]
fn from_local_global_shapes_that_overflow() {
    let errs = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["x"])?;
        let local = ArrayD::<f32>::zeros(vec![0, 2]);
        let mut errs = Vec::new();
        // Implied global shape: local x 4 on the sharded dim.
        let huge = ArrayD::<f32>::zeros(vec![0, 1 << 62]);
        errs.push(from_local(huge, &mesh, &[Shard(1)], FromLocal::default()).unwrap_err());
        // Given global shapes: too many elements, or no elements but strides that overflow.
        errs.push(from_local(local, &mesh, &[Replicate], FromLocal::with_shape(&[1 << 32, 1 << 32])).unwrap_err());
        let zero_sized = ArrayD::<f32>::zeros(vec![0, 0, 0]);
        let opts = FromLocal::with_shape(&[0, 1 << 40, 1 << 40]);
        errs.push(from_local(zero_sized, &mesh, &[Replicate], opts).unwrap_err());
        Ok(errs)
    })
    .unwrap();
    for e in errs.concat() {
        assert!(matches!(e, Error::ShapeOverflow { .. }), "{e}");
    }
}

#[test]
fn plan_costs_that_overflow_are_errors() {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let e = plan_redistribute::<f32>(&[1 << 32, 1 << 32], &mesh, &[Shard(0)], &[Replicate]).unwrap_err();
        assert!(matches!(e, Error::ShapeOverflow { .. }), "{e}");
        // The element count fits; the bytes an all-reduce moves (2^62 x 8) do not.
        let e = plan_redistribute::<f64>(&[1 << 62], &mesh, &[Partial(ReduceOp::Sum)], &[Replicate]).unwrap_err();
        assert!(matches!(e, Error::ShapeOverflow { .. }), "{e}");
        // Within range, a huge plan is still planned.
        let plan = plan_redistribute::<f64>(&[1 << 40], &mesh, &[Shard(0)], &[Replicate])?;
        assert_eq!(plan.steps[0].bytes, 1 << 42);
        Ok(())
    })
    .unwrap();
}

// ------------------------------------------------------------------ public helpers

#[test]
fn collectives_along_a_missing_mesh_dim_are_errors() {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let bad = Along::Dim(1);
        let mut buf = [1.0f32; 4];
        let errs = [
            mesh.all_reduce(bad, &mut buf, ReduceOp::Sum).unwrap_err(),
            mesh.broadcast(bad, &mut buf, 0).unwrap_err(),
            mesh.all_gather(bad, &buf).map(|_| ()).unwrap_err(),
            mesh.barrier(bad).unwrap_err(),
        ];
        for e in errs {
            assert!(matches!(e, Error::MeshDimOutOfRange { dim: 1, ndim: 1, .. }), "{e}");
        }
        // The mesh still works afterwards.
        mesh.all_reduce(Along::Dim(0), &mut buf, ReduceOp::Sum)?;
        assert_eq!(buf, [2.0; 4]);
        Ok(())
    })
    .unwrap();
}

/// `size`, `group` and `all_groups` index the mesh dims like a slice: out of range panics with
/// a message naming the mesh (documented).
#[test]
fn mesh_accessors_panic_like_indexing() {
    for accessor in 0..3 {
        let e = run(1, |ctx| {
            let mesh = ctx.init_device_mesh(&[1], &["x"])?;
            match accessor {
                0 => drop(mesh.size(3)),
                1 => drop(mesh.group(3)),
                _ => drop(mesh.all_groups(3)),
            }
            Ok(())
        })
        .unwrap_err();
        match e {
            Error::RankPanicked { message, .. } => {
                assert!(message.contains("mesh dimension 3 is out of range for DeviceMesh(x=1)"), "{message}")
            }
            other => panic!("expected a panic, got {other}"),
        }
    }
}

#[test]
fn visualize_layout_normalises_placements() {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        // Shard(-1) of a 2-d tensor is Shard(1), not Replicate.
        assert_eq!(layout_of(&[4, 6], &mesh, &[Shard(-1)])?, layout_of(&[4, 6], &mesh, &[Shard(1)])?);
        assert_ne!(layout_of(&[4, 6], &mesh, &[Shard(-1)])?, layout_of(&[4, 6], &mesh, &[Replicate])?);
        let e = layout_of(&[4, 6], &mesh, &[Shard(0), Shard(1)]).unwrap_err();
        assert!(matches!(e, Error::PlacementCountMismatch { given: 2, mesh_ndim: 1 }), "{e}");
        let e = layout_of(&[4, 6], &mesh, &[Shard(-3)]).unwrap_err();
        assert!(matches!(e, Error::ShardDimOutOfRange { dim: -3, ndim: 2 }), "{e}");
        // A shape whose product overflows is drawn without forming the product.
        assert!(layout_of(&[1 << 40, 1 << 40], &mesh, &[Shard(0)]).is_ok());
        Ok(())
    })
    .unwrap();
}

// ------------------------------------------------------------------ thread spawn failure

#[test]
fn rank_thread_that_cannot_start_is_an_error() {
    // A 256 TiB stack is past any address space: the OS refuses the first thread.
    let e = LocalWorld::new(3).stack_size(1 << 48).run(|_| Ok(())).unwrap_err();
    assert!(matches!(e, Error::ThreadSpawn { rank: 0, world_size: 3, .. }), "{e}");
}

const CHILD: &str = "DTENSOR_TEST_SPAWN_CHILD";

/// Run by `spawn_failure_mid_world_releases_started_ranks` in a child process whose address
/// space is capped: the first ranks start and wait in a collective for ranks that never
/// start; they must be released at once and `run` must return `ThreadSpawn`.
#[test]
fn spawn_failure_child() {
    if std::env::var_os(CHILD).is_none() {
        return; // only meaningful in the capped child
    }
    let t = Instant::now();
    let r = LocalWorld::new(256).timeout(Duration::from_secs(60)).stack_size(64 << 20).run(|ctx| {
        let mesh = ctx.init_device_mesh(&[ctx.world_size()], &["x"])?;
        mesh.barrier(Along::All)
    });
    match r {
        Err(Error::ThreadSpawn { rank, .. }) => {
            println!("CHILD-RESULT spawn failed at rank {rank} after {:.2} s", t.elapsed().as_secs_f64())
        }
        other => println!("CHILD-RESULT unexpected {other:?}"),
    }
}

#[cfg(unix)]
#[test]
fn spawn_failure_mid_world_releases_started_ranks() {
    let exe = std::env::current_exe().unwrap();
    // 2 GiB of address space: the test binary plus a few 64 MiB rank stacks, not 256.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -v 2097152 && exec "$0" --exact spawn_failure_child --nocapture --test-threads 1"#)
        .arg(exe)
        .env(CHILD, "1")
        .env("MALLOC_ARENA_MAX", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find_map(|l| l.find("CHILD-RESULT").map(|i| &l[i..])).unwrap_or_else(|| {
        panic!("child printed no result: status {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr))
    });
    eprintln!("{line}");
    let rank: usize = line
        .strip_prefix("CHILD-RESULT spawn failed at rank ")
        .and_then(|r| r.split(' ').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let secs: f64 = line.split(" after ").nth(1).and_then(|s| s.strip_suffix(" s")).unwrap().parse().unwrap();
    assert!(rank > 0, "no rank started: the cap is too low to test a mid-world failure");
    assert!(secs < 10.0, "the started ranks waited {secs} s (timeout 60 s)");
}
