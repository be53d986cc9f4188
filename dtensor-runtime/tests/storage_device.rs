//! Local storage and devices: shards live on the mesh's device (the host for the thread
//! backend), the accessors of `DTensor` and `Dt`, the pure `redistribute_local`, and the typed
//! error of a device the communicator cannot provide.

mod common;
mod one_rank_comm;

use common::{expected_shard, global};
use dtensor_runtime::typed::dims::tp;
use dtensor_runtime::{
    distribute_tensor, from_local, ones, redistribute_local, run, Device, DeviceMesh, Dt, Error, FromLocal, Replicate,
    Shard, Storage, TensorOptions,
};
use one_rank_comm::OneRankComm;
use std::sync::Arc;

#[test]
fn thread_meshes_place_every_shard_on_the_host() {
    let g = global(&[5, 3], 1);
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        assert_eq!(mesh.device(), Device::Cpu);
        let coord = [ctx.rank()];
        let dt = distribute_tensor(&g, &mesh, &[Shard(0)], Some(0))?;
        let want = expected_shard(&g, &[2], &coord, &[Shard(0)]);
        assert_eq!(dt.device(), Device::Cpu);
        assert_eq!(dt.local_cpu()?, &want);
        assert_eq!(dt.to_host()?, want);
        // `to_local` stays where the data is (here: the host) and compares with host arrays.
        let local: Storage<f64> = dt.to_local();
        assert!(matches!(local, Storage::Cpu(_)));
        assert_eq!(local, want);
        assert_eq!(dt.full_tensor()?, g);
        // A Storage is a distribute source and a from_local input, like an array.
        let again = distribute_tensor(Storage::Cpu(g.clone()), &mesh, &[Shard(0)], None)?;
        assert_eq!(again.local(), dt.local());
        let wrapped = from_local(dt.to_local(), &mesh, &[Shard(0)], FromLocal::with_shape(&[5, 3]))?;
        assert_eq!(wrapped.full_tensor()?, g);
        let f = ones::<f32>(&[4], &TensorOptions::new().mesh(&mesh).placements(&[Shard(0)]))?;
        assert_eq!(f.local().device(), Device::Cpu);
        // The typed tensor exposes the same accessors.
        let typed: Dt<f64, (tp,), (dtensor_runtime::typed::Shard<0>,), 2> = Dt::distribute(&g, &mesh)?;
        assert_eq!(typed.local_cpu()?, &want);
        assert_eq!(typed.to_host()?, want);
        Ok(dt.into_local())
    })
    .unwrap();
    assert_eq!(out[1], expected_shard(&g, &[2], &[1], &[Shard(0)]));
}

#[test]
fn redistribute_local_is_the_local_part_of_redistribute() {
    let g = global(&[7, 6], 2);
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let dt = distribute_tensor(&g, &mesh, &[Shard(0), Shard(1)], None)?;
        let to = [Shard(1), Replicate];
        let plan = dt.plan_redistribute(&to)?;
        let pure = redistribute_local(dt.local(), &mesh, &plan)?;
        let full = dt.redistribute(&to)?;
        Ok((pure == *full.local(), pure.to_host()?))
    })
    .unwrap();
    for (rank, (same, local)) in out.into_iter().enumerate() {
        assert!(same, "rank {rank}");
        let coord = [rank / 2, rank % 2];
        assert_eq!(local, expected_shard(&g, &[2, 2], &coord, &[Shard(1), Replicate]), "rank {rank}");
    }
}

#[test]
fn a_device_without_a_handle_is_a_typed_error() {
    let comm = Arc::new(OneRankComm { device: Device::Cuda(0), handle: None });
    match DeviceMesh::new(comm, &[1], &["x"]) {
        Err(Error::Unavailable { what, reason }) => {
            assert!(what.contains("one-rank"), "{what}");
            assert!(reason.contains("cuda:0"), "{reason}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // The same communicator on the host is fine.
    let mesh = DeviceMesh::new(Arc::new(OneRankComm { device: Device::Cpu, handle: None }), &[1], &["x"]).unwrap();
    assert_eq!(mesh.device(), Device::Cpu);
    assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
}
