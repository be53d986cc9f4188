#!/usr/bin/env python3
"""Writes two throw-away examples for measuring the typed layer's compile time: a 96-block
Megatron MLP forward, unrolled, once with `#[distribute]` typed ops (examples/ct_typed96.rs)
and once with the same dynamic ops (examples/ct_dyn96.rs).

    python3 scripts/compile_time_96.py
    cargo build --example ct_dyn96 --example ct_typed96        # dependencies, once
    for e in ct_dyn96 ct_typed96; do touch examples/$e.rs; time cargo build --example $e; done
    rm examples/ct_typed96.rs examples/ct_dyn96.rs
"""
import os

N = 96
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")

TYPED_HEAD = '''//! Compile-time probe: a 96-block Megatron MLP forward, unrolled, in the typed layer.
use dtensor::distribute;
use dtensor::prelude::*;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dt;

#[distribute(mesh = "dp,tp")]
pub struct Block {
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f32>,
    #[placements = [Replicate, Shard(0)]]
    pub w2: DTensor<f32>,
}

#[distribute(mesh = "dp,tp")]
pub struct Model {
    pub blocks: Vec<Block>,
}

type Act = Dt<f32, (dp, tp), (dtensor::Shard<0>, dtensor::Replicate), 2>;

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
pub fn forward(x: &DTensor<f32>, m: &Model) -> Result<DTensor<f32>> {
    let mut x: Act = x.clone();
'''
TYPED_BLOCK = '''    let b = &m.blocks[{i}];
    let h = x.matmul(&b.w1)?.gelu()?;
    let y: Act = h.matmul(&b.w2)?.redistribute()?;
    x = x.add(&y)?;
'''
DYN_HEAD = '''//! Compile-time probe: the same 96-block forward with dynamic ops.
use dtensor::prelude::*;

pub struct Block {
    pub w1: DTensor<f32>,
    pub w2: DTensor<f32>,
}

pub struct Model {
    pub blocks: Vec<Block>,
}

pub fn forward(x: &DTensor<f32>, m: &Model) -> Result<DTensor<f32>> {
    let mut x = x.clone();
'''
DYN_BLOCK = '''    let b = &m.blocks[{i}];
    let h = x.matmul(&b.w1)?.gelu()?;
    let y = h.matmul(&b.w2)?.redistribute(&[Shard(0), Replicate])?;
    x = x.add(&y)?;
'''
TAIL = '''    Ok(x)
}

fn main() {}
'''

for name, head, block in [("ct_typed96.rs", TYPED_HEAD, TYPED_BLOCK), ("ct_dyn96.rs", DYN_HEAD, DYN_BLOCK)]:
    with open(os.path.join(ROOT, name), "w") as f:
        f.write(head + "".join(block.format(i=i) for i in range(N)) + TAIL)
