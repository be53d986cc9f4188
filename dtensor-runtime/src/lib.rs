//! # dtensor-runtime
//!
//! Distributed tensors (PyTorch DTensor semantics) over a [`DeviceMesh`]: placements,
//! redistribution as collectives, factories that build only the local shard, and
//! pluggable communication backends behind one [`Communicator`] trait.
//!
//! Start with [`run`] (in-process ranks), [`RankCtx::init_device_mesh`],
//! [`distribute_tensor`], [`DTensor::redistribute`] and [`DTensor::full_tensor`].
//! Models run on DTensors through [`ops`] (each op a sharding rule plus a local kernel),
//! [`autograd`] (`requires_grad_`, `backward`, `grad`), [`module`] (`Module`,
//! `distribute_module`, `parallelize_module`, tensor-parallel styles) and [`optim`].
#![warn(missing_docs)]

pub mod alloc;
pub mod autograd;
pub mod checkpoint;
pub mod comm;
pub mod cuda;
pub mod device;
pub mod dtensor;
pub mod element;
pub mod env;
pub mod error;
pub mod factory;
pub mod fsdp;
pub mod launch;
pub mod layout;
pub mod mesh;
pub mod module;
#[doc(hidden)]
pub mod names;
pub mod op;
pub mod ops;
pub mod optim;
pub mod placement;
pub mod redistribute;
pub mod rng;
pub mod shape;
pub mod storage;
pub mod typed;
pub mod visualize;

pub use ndarray;

pub use autograd::{from_local_grad, local_mesh, no_grad, BackwardOptions};
pub use comm::debug::{op_scope, CollectiveKind, CollectiveRecord, CommDebugGuard, CommDebugMode, CommStats};
pub use comm::threads::{ThreadComm, ThreadWorld};
pub use comm::{Communicator, HostCollectives, RecvBuf};
pub use device::{Device, Target};
pub use dtensor::{distribute_tensor, from_local, DTensor, DistributeSource, FromLocal};
pub use element::{bf16, f16, DType, Element, IndexElement, Scalar};
pub use error::{Error, Result};
pub use factory::{arange, causal_mask, empty, full, linspace, logspace, ones, rand, randn, zeros, TensorOptions};
#[allow(deprecated)]
pub use launch::Backend;
pub use launch::{current_mesh, launch, run, set_current_mesh, Launch, LocalWorld, RankCtx};
pub use mesh::Along;
pub use mesh::DeviceMesh;
pub use module::{distribute_module, parallelize_module, Forward, Module};
pub use ops::{
    apply_op, cat, implicit_redistribution_count, implicit_redistributions, local_map, rotary_tables,
    scaled_dot_product_attention, stack, CrossEntropyOptions, CustomOp, DimRule, LocalMap, LossReduction, RotaryStyle,
};
pub use placement::{Partial, Placement, ReduceOp, Replicate, Shard};
pub use redistribute::{
    plan_redistribute, plan_redistribute_at, redistribute_local, RedistributePlan, RedistributeStep,
};
pub use rng::manual_seed;
pub use storage::Storage;
// The typed markers share their names with the placement constructors above: those live in
// the value namespace, these in the type namespace, so `Shard(0)` and `Shard<0>` coexist.
pub use typed::{Avg, Dt, Max, Min, Partial, Product, Replicate, Shard, Sum};
pub use visualize::{print_sharding, visualize_sharding, visualize_sharding_plain};

/// Everything a typical program needs.
pub mod prelude {
    pub use crate::{
        distribute_tensor, from_local, no_grad, run, DTensor, DeviceMesh, Element, Error, Forward, FromLocal, Module,
        Partial, Placement, ReduceOp, Replicate, Result, Shard, TensorOptions,
    };
}
