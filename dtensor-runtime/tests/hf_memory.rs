//! Memory of a sharded load: each rank's heap grows by its own shards (as the element type
//! asked for) plus a bounded conversion buffer, never by a whole file or tensor. Measured with
//! a counting allocator per thread (each in-process rank is a thread).

mod common;
mod hf_util;

use common::global;
use dtensor_runtime::checkpoint::hf::{HfCheckpoint, LoadPlan, SINGLE_FILE};
use dtensor_runtime::{run, Replicate, Shard};
use hf_util::write_st;
use safetensors::Dtype;

#[path = "../../examples/hf_load/heap.rs"]
mod heap;

#[global_allocator]
static ALLOC: heap::Counting = heap::Counting;

/// Conversion scratch (1 MiB) plus bookkeeping (names, headers, DTensor metadata).
const OVERHEAD: isize = (1 << 20) + (64 << 10);

#[test]
fn each_rank_holds_only_its_shards() {
    let dir = tempfile::tempdir().unwrap();
    // bf16 on disk, f32 in memory: 2 + 2 MiB of bf16, 8 MiB as f32.
    let (w, v) = (global(&[1024, 1024], 1), global(&[1024, 1024], 2));
    write_st(&dir.path().join(SINGLE_FILE), &[("w", Dtype::BF16, &w), ("v", Dtype::BF16, &v)]);
    let plan = LoadPlan::new().placements("w", &[Replicate, Shard(0)]).placements("v", &[Shard(0), Shard(1)]);
    for mesh_shape in [[1, 1], [2, 2]] {
        let got = run(mesh_shape[0] * mesh_shape[1], |ctx| {
            let mesh = ctx.init_device_mesh(&mesh_shape, &["dp", "tp"])?;
            let (loaded, peak) = heap::peak_growth(|| {
                let mut ck = HfCheckpoint::open(dir.path())?;
                let sd = ck.load::<f32>(&mesh, &plan)?;
                Ok::<_, dtensor_runtime::Error>((ck, sd))
            });
            let (ck, sd) = loaded?;
            let local: usize = sd.iter().map(|(_, t)| t.to_local().shape().iter().product::<usize>()).sum();
            Ok((peak, local, ck.payload_bytes_read()))
        })
        .unwrap();
        for (rank, &(peak, local, read)) in got.iter().enumerate() {
            println!("mesh {mesh_shape:?} rank {rank}: {read} bytes read, peak heap growth {peak} bytes");
            assert_eq!(read, 2 * local as u64, "bf16 bytes of the rank's shards");
            let shards = 4 * local as isize;
            assert!(shards <= peak && peak <= shards + OVERHEAD, "rank {rank}: peak {peak}, shards {shards}");
        }
    }
}
