//! Issue 33, the comm part of finding 7 (as a class): hostile configuration is a typed error
//! or works, never a panic, an abort or a silently ignored setting.
//!
//! * timeouts: any positive timeout is valid, `Duration::MAX` included (no limit) — it
//!   panicked in every collective (`Instant + Duration` overflow);
//! * world sizes: a world too large to start (`run(usize::MAX, ..)`, `1 << 40`) is an
//!   `InvalidArgument` before anything is allocated or spawned (it aborted allocating
//!   per-rank state); mesh shapes whose product overflows or does not match are typed errors;
//! * environment variables: a value the runtime cannot parse (`DTENSOR_DEBUG=details`,
//!   `DTENSOR_TIMEOUT_MS` that is not UTF-8, ...) is an `InvalidArgument` naming the variable
//!   and the value (they were silently ignored). These run in a child process of this test
//!   binary, with the variable set there only.

use dtensor_runtime::launch::MAX_WORLD_SIZE;
use dtensor_runtime::{launch, run, Along, Communicator, DeviceMesh, Error, Launch, LocalWorld, ReduceOp, ThreadWorld};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every collective of a mesh once (with the fingerprint check on and off): what a timeout
/// must not break.
fn every_collective(mesh: &DeviceMesh) -> dtensor_runtime::Result<()> {
    let n = mesh.size(0);
    for checks in [false, true] {
        mesh.set_collective_checks(checks);
        let x = Along::Dim(0);
        let mut b = [1.0f32; 4];
        mesh.all_reduce(x, &mut b, ReduceOp::Sum)?;
        assert_eq!(b, [n as f32; 4]);
        mesh.all_reduce_into(x, &b, ReduceOp::Max)?;
        mesh.all_reduce_start(x, vec![1.0f64; 3], ReduceOp::Sum)?.wait()?;
        mesh.all_gather(x, &b)?;
        mesh.reduce_scatter(x, &vec![1.0f32; 2 * n], ReduceOp::Sum)?;
        mesh.all_to_all(x, &vec![1.0f32; n])?;
        mesh.all_to_all_strided(x, &vec![1.0f32; 2 * n], 2, 1)?;
        let counts: Vec<usize> = (0..n).collect();
        mesh.all_gather_v(x, &vec![1.0f32; mesh.coordinate()[0]], &counts)?;
        mesh.reduce_scatter_v(x, &vec![1.0f32; counts.iter().sum()], &counts, ReduceOp::Sum)?;
        mesh.all_to_all_v(x, &vec![1.0f32; n], 1, &vec![1; n], &vec![1; n])?;
        mesh.broadcast(x, &mut b, 0)?;
        mesh.scatter(x, &vec![1.0f32; n], 1, 0)?;
        mesh.barrier(x)?;
    }
    Ok(())
}

/// Finding 7 (timeouts): `Duration::MAX` and other huge timeouts panicked in every
/// collective; they mean "no limit".
#[test]
fn huge_timeouts_work_in_every_collective() {
    for timeout in [Duration::MAX, Duration::from_secs(u64::MAX / 2), Duration::from_millis(u64::MAX)] {
        LocalWorld::new(3)
            .timeout(timeout)
            .run(|ctx| every_collective(&ctx.init_device_mesh(&[3], &["x"])?))
            .unwrap_or_else(|e| panic!("timeout {timeout:?}: {e}"));
    }
    // A world with no limit still fails at once when a peer fails (it does not wait forever).
    let start = Instant::now();
    let err = LocalWorld::new(2)
        .timeout(Duration::MAX)
        .run(|ctx| {
            if ctx.rank() == 1 {
                return Err(Error::Autograd("injected".into()));
            }
            ctx.comm().barrier(&[0, 1])
        })
        .unwrap_err();
    assert!(matches!(err, Error::Autograd(_)), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
    // A zero timeout is still refused.
    assert!(matches!(LocalWorld::new(2).timeout(Duration::ZERO).run(|_| Ok(())), Err(Error::InvalidArgument { .. })));
}

/// Finding 7 (world sizes): worlds too large to start are typed errors, returned at once,
/// through every thread launch; the largest allowed and smaller ones run.
#[test]
fn huge_world_sizes_are_typed_errors_before_anything_is_allocated() {
    for size in [usize::MAX, 1 << 40, MAX_WORLD_SIZE + 1] {
        let start = Instant::now();
        let must_not_run = |_: dtensor_runtime::RankCtx| -> dtensor_runtime::Result<()> { panic!("a rank ran") };
        for r in [
            run(size, must_not_run),
            LocalWorld::new(size).run(must_not_run),
            launch(Launch::Threads, size, must_not_run),
        ] {
            match r {
                Err(Error::InvalidArgument { ref reason, .. }) => {
                    assert!(reason.contains(&size.to_string()), "{reason}")
                }
                other => panic!("world of {size}: {other:?}"),
            }
        }
        assert!(start.elapsed() < Duration::from_secs(1), "world of {size}: {:?}", start.elapsed());
    }
    assert!(matches!(run(0, |_| Ok(())), Err(Error::InvalidArgument { .. })));
    // A world object of any size costs nothing per rank; its communicators check the rank.
    let w = ThreadWorld::new(usize::MAX, Duration::MAX);
    assert_eq!(w.communicator(usize::MAX - 1).unwrap().world_size(), usize::MAX);
    assert!(matches!(w.communicator(usize::MAX), Err(Error::RankOutOfRange { .. })));
}

/// Finding 7 (mesh shapes): a shape whose product overflows, or that does not cover the
/// world, is a typed error on every rank (never an overflow panic or a huge allocation).
#[test]
fn mesh_shapes_that_overflow_or_do_not_match_are_typed_errors() {
    let out = run(2, |ctx| {
        let cases: [&[usize]; 5] = [&[1 << 40, 1 << 40], &[usize::MAX, 2], &[usize::MAX], &[1 << 40], &[2, 0]];
        Ok(cases.iter().map(|s| (s.to_vec(), ctx.init_device_mesh(s, &[]).map(|_| ()))).collect::<Vec<_>>())
    })
    .unwrap();
    for (shape, r) in out.into_iter().flatten() {
        match r {
            Err(Error::ShapeOverflow { .. } | Error::MeshSizeMismatch { .. } | Error::InvalidMesh { .. }) => {}
            other => panic!("mesh {shape:?}: {other:?}"),
        }
    }
    // `from_spec` parses sizes past usize as an error too.
    run(1, |ctx| {
        let e = DeviceMesh::from_spec(Arc::clone(ctx.comm()), "a=99999999999999999999999").unwrap_err();
        assert!(matches!(e, Error::InvalidMesh { .. }), "{e:?}");
        Ok(())
    })
    .unwrap();
}

// ---------------------------------------------------------------- environment variables

/// Set in the child process: which case it runs.
const CHILD: &str = "DTENSOR_HOSTILE_CONFIG_CHILD";

/// Runs the test `child_checks_its_environment` of this binary in a child process with `var`
/// set to `value` and `CHILD` to `case`; fails when the child's checks fail.
fn in_child(case: &str, var: &str, value: &OsStr) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["child_checks_its_environment", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .env("DTENSOR_HOSTILE_CONFIG_VAR", var)
        .env(var, value)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{case} with {var}={value:?}: child failed\n{stdout}\n{stderr}"
    );
}

/// The child's side: `reject` expects every launch and mesh to fail with an
/// `InvalidArgument` naming the variable; `accept` expects every collective to work.
#[test]
fn child_checks_its_environment() {
    let Ok(case) = std::env::var(CHILD) else { return };
    let var = std::env::var("DTENSOR_HOSTILE_CONFIG_VAR").unwrap();
    match case.as_str() {
        "reject" => {
            let named = |e: &Error| matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains(&var);
            let e = run(2, |_| Ok(())).unwrap_err();
            assert!(named(&e), "run: {e:?}");
            let e = launch(Launch::Threads, 1, |_| Ok(())).unwrap_err();
            assert!(named(&e), "launch: {e:?}");
            if var == "DTENSOR_DEBUG" {
                // A mesh made over a world built by hand checks it too.
                let w = ThreadWorld::new(1, Duration::from_secs(10));
                let e = DeviceMesh::new(Arc::new(w.communicator(0).unwrap()), &[1], &["x"]).unwrap_err();
                assert!(named(&e), "DeviceMesh::new: {e:?}");
            }
        }
        "accept" => run(2, |ctx| every_collective(&ctx.init_device_mesh(&[2], &["x"])?)).map(|_| ()).unwrap(),
        "detail" => run(2, |ctx| {
            assert!(ctx.init_device_mesh(&[2], &["x"])?.collective_checks());
            Ok(())
        })
        .map(|_| ())
        .unwrap(),
        other => panic!("unknown case {other}"),
    }
}

/// Finding 7 (environment variables): values the runtime cannot parse, not UTF-8 included,
/// are typed errors naming the variable; they were silently ignored.
#[test]
fn unparsable_environment_variables_are_typed_errors() {
    let not_utf8 = OsStr::from_bytes(b"12\xff");
    let cases: [(&str, &OsStr); 8] = [
        ("DTENSOR_DEBUG", OsStr::new("details")),
        ("DTENSOR_DEBUG", OsStr::new("1")),
        ("DTENSOR_DEBUG", not_utf8),
        ("DTENSOR_TIMEOUT_MS", not_utf8),
        ("DTENSOR_TIMEOUT_MS", OsStr::new("10s")),
        ("DTENSOR_HUGE_PAGES", OsStr::new("maybe")),
        ("DTENSOR_HUGE_PAGES", not_utf8),
        ("DTENSOR_CUDA_THREADS_STAGE", OsStr::new("gpu")),
    ];
    for (var, value) in cases {
        in_child("reject", var, value);
    }
}

/// The values the variables accept still work: the largest timeout (no limit), `off`/`info`,
/// and `detail` (which switches the check on).
#[test]
fn accepted_environment_values_work() {
    let max = u64::MAX.to_string();
    in_child("accept", "DTENSOR_TIMEOUT_MS", OsStr::new(&max));
    in_child("accept", "DTENSOR_DEBUG", OsStr::new("off"));
    in_child("accept", "DTENSOR_DEBUG", OsStr::new("INFO"));
    in_child("accept", "DTENSOR_HUGE_PAGES", OsStr::new("0"));
    in_child("accept", "DTENSOR_CUDA_THREADS_STAGE", OsStr::new("host"));
    in_child("detail", "DTENSOR_DEBUG", OsStr::new("detail"));
}
