//! Factories allocate only the local shard: a 1-d mesh of 8 ranks creating
//! `zeros([8192, 8192])` sharded on dim 0 allocates ~1/8 of the global bytes per rank.
//! Measured with a counting global allocator (bytes allocated by each rank's thread).

use dtensor_runtime::{run, zeros, Replicate, Shard, TensorOptions};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + layout.size()));
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + layout.size()));
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocated() -> usize {
    ALLOCATED.with(|a| a.get())
}

#[test]
fn sharded_zeros_allocates_one_eighth_per_rank() {
    const N: usize = 8192;
    let global_bytes = N * N * std::mem::size_of::<f32>();
    let per_rank = run(8, |ctx| {
        let mesh = ctx.init_device_mesh(&[8], &["x"])?;
        let before = allocated();
        let t = zeros::<f32>(&[N, N], &TensorOptions::new().mesh(&mesh).placements(&[Shard(0)]))?;
        let bytes = allocated() - before;
        assert_eq!(t.local().shape(), &[N / 8, N]);
        Ok(bytes)
    })
    .unwrap();
    for (rank, bytes) in per_rank.iter().enumerate() {
        let ratio = *bytes as f64 / global_bytes as f64;
        println!("rank {rank}: allocated {bytes} B = {ratio:.4} of the global {global_bytes} B");
        assert!(*bytes >= global_bytes / 8, "rank {rank} allocated less than its shard: {bytes}");
        assert!(ratio < 0.126, "rank {rank} allocated {ratio:.4} of the global tensor (> 1/8)");
    }
}

#[test]
fn replicated_zeros_allocates_the_full_tensor_per_rank() {
    // The control: the same counter sees the whole tensor when it is replicated.
    let per_rank = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let before = allocated();
        let _t = zeros::<f32>(&[1024, 1024], &TensorOptions::new().mesh(&mesh).placements(&[Replicate]))?;
        Ok(allocated() - before)
    })
    .unwrap();
    for bytes in per_rank {
        assert!(bytes >= 1024 * 1024 * 4);
    }
}
