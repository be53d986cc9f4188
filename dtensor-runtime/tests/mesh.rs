//! DeviceMesh: coordinates, groups, sub-meshes and errors.

use dtensor_runtime::mesh::parse_mesh_spec;
use dtensor_runtime::{run, DeviceMesh, Error};
use std::sync::Arc;

#[test]
fn coordinates_and_groups_of_a_2x3_mesh() {
    let out = run(6, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 3], &["dp", "tp"])?;
        let tp = mesh.submesh("tp")?;
        let dp = mesh.submesh("dp")?;
        let swapped = mesh.submesh_dims(&["tp", "dp"])?;
        Ok((
            mesh.coordinate().to_vec(),
            mesh.group(0).to_vec(),
            mesh.group(1).to_vec(),
            tp.ranks().to_vec(),
            dp.ranks().to_vec(),
            swapped.ranks().to_vec(),
            mesh.dim_index("tp")?,
            mesh.rank_at(&[1, 2])?,
            mesh.to_string(),
        ))
    })
    .unwrap();
    for (rank, (coord, g0, g1, tp, dp, swapped, tp_idx, at, name)) in out.into_iter().enumerate() {
        assert_eq!(coord, vec![rank / 3, rank % 3]);
        assert_eq!(g0, vec![rank % 3, 3 + rank % 3]);
        assert_eq!(g1, (3 * (rank / 3)..3 * (rank / 3) + 3).collect::<Vec<_>>());
        assert_eq!(tp, g1);
        assert_eq!(dp, g0);
        assert_eq!(swapped, vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(tp_idx, 1);
        assert_eq!(at, 5);
        assert_eq!(name, "DeviceMesh(dp=2, tp=3)");
    }
}

#[test]
fn all_groups_partition_the_mesh() {
    run(8, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2, 2], &[])?;
        for d in 0..3 {
            let groups = mesh.all_groups(d);
            assert_eq!(groups.len(), 4);
            let mut all: Vec<usize> = groups.concat();
            all.sort();
            assert_eq!(all, (0..8).collect::<Vec<_>>());
            assert!(groups.contains(&mesh.group(d).to_vec()));
        }
        assert_eq!(mesh.dim_names(), &["dim0", "dim1", "dim2"]);
        Ok(())
    })
    .unwrap();
}

#[test]
fn mesh_errors_name_the_problem() {
    let errs = run(4, |ctx| {
        let comm = Arc::clone(ctx.comm());
        let e = |r: dtensor_runtime::Result<DeviceMesh>| r.unwrap_err();
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        Ok(vec![
            e(DeviceMesh::new(Arc::clone(&comm), &[3], &["x"])),
            e(DeviceMesh::new(Arc::clone(&comm), &[2, 2], &["a", "a"])),
            e(DeviceMesh::new(Arc::clone(&comm), &[4], &["a", "b"])),
            e(DeviceMesh::new(Arc::clone(&comm), &[], &[])),
            e(DeviceMesh::new(Arc::clone(&comm), &[4, 0], &[])),
            e(DeviceMesh::from_spec(Arc::clone(&comm), "dp:2")),
            e(DeviceMesh::from_spec(Arc::clone(&comm), "")),
            e(DeviceMesh::from_spec(Arc::clone(&comm), "dp=x")),
            mesh.submesh("pp").unwrap_err(),
            mesh.submesh_dims(&["dp", "dp"]).unwrap_err(),
            mesh.rank_at(&[2, 0]).unwrap_err(),
            mesh.coordinate_of(9).unwrap_err(),
        ])
    })
    .unwrap();
    let e = &errs[0];
    assert!(matches!(&e[0], Error::MeshSizeMismatch { mesh_size: 3, world_size: 4, .. }), "{}", e[0]);
    assert!(matches!(&e[1], Error::DuplicateMeshDim { name } if name == "a"), "{}", e[1]);
    assert!(matches!(&e[2], Error::InvalidMesh { .. }), "{}", e[2]);
    assert!(matches!(&e[3], Error::InvalidMesh { .. }), "{}", e[3]);
    assert!(matches!(&e[4], Error::InvalidMesh { .. }), "{}", e[4]);
    assert!(matches!(&e[5], Error::InvalidMesh { .. }), "{}", e[5]);
    assert!(matches!(&e[6], Error::InvalidMesh { .. }), "{}", e[6]);
    assert!(matches!(&e[7], Error::InvalidMesh { .. }), "{}", e[7]);
    assert!(matches!(&e[8], Error::UnknownMeshDim { name, .. } if name == "pp"), "{}", e[8]);
    assert!(e[8].to_string().contains("[\"dp\", \"tp\"]"));
    assert!(matches!(&e[9], Error::DuplicateMeshDim { .. }), "{}", e[9]);
    assert!(matches!(&e[10], Error::InvalidArgument { .. }), "{}", e[10]);
    assert!(matches!(&e[11], Error::RankOutOfRange { rank: 9, .. }), "{}", e[11]);
}

#[test]
fn spec_strings_parse() {
    assert_eq!(parse_mesh_spec("dp=2, tp=4").unwrap(), (vec!["dp".to_string(), "tp".to_string()], vec![2, 4]));
    let out = run(4, |ctx| Ok(DeviceMesh::from_spec(Arc::clone(ctx.comm()), "dp=2,tp=2")?.shape().to_vec())).unwrap();
    assert_eq!(out[3], vec![2, 2]);
}

/// What `DeviceMesh::new` asks a backend with sub-communicators (NCCL, MPI) to create must
/// cover every group a collective can run on: each dim's group, the whole mesh, and the
/// `Along::All` group of every sub-mesh over dims in mesh order (≥ 3-d meshes).
#[test]
fn prepared_partitions_cover_every_group_a_3d_mesh_uses() {
    let names = ["pp", "dp", "tp"];
    let out = run(12, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 3, 2], &names)?;
        let parts = mesh.prepared_partitions();
        let mut used: Vec<Vec<usize>> = (0..3).map(|d| mesh.group(d).to_vec()).collect();
        used.push(mesh.ranks().to_vec());
        for set in [&["pp", "dp"][..], &["pp", "tp"], &["dp", "tp"], &["tp"]] {
            used.push(mesh.submesh_dims(set)?.ranks().to_vec());
        }
        Ok((ctx.rank(), parts, used))
    })
    .unwrap();
    for (rank, parts, used) in out {
        assert_eq!(parts.len(), 3 + 3 + 1, "3 dims, 3 pairs of dims, the whole mesh");
        for p in &parts {
            let mut all: Vec<usize> = p.concat();
            all.sort_unstable();
            assert_eq!(all, (0..12).collect::<Vec<_>>(), "{p:?} is not a partition of the world");
        }
        for g in used {
            assert!(g.contains(&rank), "rank {rank} not in its own group {g:?}");
            assert!(parts.iter().any(|p| p.contains(&g)), "rank {rank}: group {g:?} is not prepared");
        }
    }
}

/// `unflatten` splits one dim in place, keeping the ranks' row-major order: on a `dp=4 × tp=2`
/// mesh, `dp` → `node=2 × local=2` groups `local` by consecutive `dp` coordinates; bad splits
/// are typed errors.
#[test]
fn unflatten_splits_one_dim_in_place() {
    let out = run(8, |ctx| {
        let mesh = ctx.init_device_mesh(&[4, 2], &["dp", "tp"])?;
        let split = mesh.unflatten("dp", &[2, 2], &["node", "local"])?;
        for bad in [(&[3usize, 2][..], &["a", "b"][..]), (&[2, 2], &["a"]), (&[], &[])] {
            match mesh.unflatten("dp", bad.0, bad.1) {
                Err(Error::InvalidMesh { reason }) => assert!(reason.contains("`dp` of size 4"), "{reason}"),
                other => panic!("{bad:?}: {:?}", other.map(|m| m.to_string())),
            }
        }
        assert!(matches!(mesh.unflatten("dp", &[2, 2], &["tp", "x"]), Err(Error::DuplicateMeshDim { .. })));
        assert!(matches!(mesh.unflatten("pp", &[1], &["x"]), Err(Error::UnknownMeshDim { .. })));
        Ok((split.shape().to_vec(), split.dim_names().to_vec(), split.coordinate().to_vec(), split.group(1).to_vec()))
    })
    .unwrap();
    assert_eq!(out[0].0, vec![2, 2, 2]);
    assert_eq!(out[0].1, vec!["node", "local", "tp"]);
    // rank 5 is dp 2, tp 1: node 1, local 0; its local group is dp 2 and 3 at tp 1
    assert_eq!(out[5].2, vec![1, 0, 1]);
    assert_eq!(out[5].3, vec![5, 7]);
}
