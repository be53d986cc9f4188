//! Fully sharded data parallel (PyTorch FSDP2, `torch.distributed.fsdp.fully_shard`).
//!
//! [`fully_shard`] shards a module's parameters over one mesh dim: each data-parallel rank
//! keeps `1/dp` of every parameter, of its gradient and (through an optimizer stepping the
//! shards) of its optimizer state. A forward all-gathers the parameters it needs; the backward
//! reduce-scatters the gradients into the shards. On a 2-D mesh the other dim keeps what the
//! parameters have: replicated there, it is HSDP (gradients reduce-scattered over the FSDP
//! dim and all-reduced over the other); sharded there by a tensor-parallel plan, it is
//! FSDP × TP (the FSDP dim shards another tensor dim, so its all-gather yields the
//! tensor-parallel layout).
//!
//! Wrap each block for a window of one block's gathered parameters at a time:
//!
//! ```
//! use dtensor_runtime::fsdp::{fully_shard, FullyShardOptions};
//! use dtensor_runtime::module::{Forward, Linear, Module, Sequential};
//! use dtensor_runtime::optim::AdamW;
//! use dtensor_runtime::{distribute_tensor, run, CollectiveKind, CommDebugMode, Shard};
//! use dtensor_runtime::ndarray::ArrayD;
//! run(4, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[4], &["dp"])?;
//!     dtensor_runtime::manual_seed(0);
//!     let mut model = Sequential(
//!         (0..2)
//!             .map(|i| fully_shard(Linear::<f64>::new(8, 8, false)?, &mesh,
//!                                  &FullyShardOptions::on("dp").named(&format!("blocks.{i}"))))
//!             .collect::<dtensor_runtime::Result<Vec<_>>>()?,
//!     );
//!     let x = ArrayD::from_shape_vec(vec![4, 8], (0..32).map(f64::from).collect()).unwrap();
//!     let x = distribute_tensor(&x, &mesh, &[Shard(0)], None)?;
//!     let comm = CommDebugMode::new();
//!     comm.scope(|| model.forward(&x)?.sum()?.backward())?;
//!     // one all-gather per block in the forward, one reduce-scatter per block in the backward
//!     assert_eq!(comm.count(CollectiveKind::AllGather), 2);
//!     assert_eq!(comm.count(CollectiveKind::ReduceScatter), 2);
//!     AdamW::new(1e-3).step(&mut model)?; // steps the [2, 8] shards; its moments are [2, 8] too
//!     Ok(())
//! }).unwrap();
//! ```

mod fully_shard;
mod layout;
mod memory;
mod mixed;
mod options;
mod post_forward;
mod prefetch;
mod reshard;
mod reshard_group;
mod sink;
mod unit;

pub use fully_shard::{fully_shard, FullyShard};
pub use layout::resting_layout;
pub use memory::{memory_plan, MemoryPlan, OptimizerMemory, ParamSpec};
pub use mixed::{fully_shard_mixed, FullyShardMixed};
pub use options::FullyShardOptions;
