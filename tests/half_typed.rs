//! The typed layer and `#[distribute]` with 16-bit elements: `Dt<bf16, ..>` layouts checked at
//! compile time, and an `elem = bf16` container struct of generic blocks.

use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dt;
use dtensor::{bf16, distribute, DTensor, Element, Replicate, Result, Shard};

#[distribute(mesh = "dp,tp", placements = [Replicate, Shard(1)])]
pub struct Block<T: Element> {
    pub w: DTensor<T>,
}

#[distribute(mesh = "dp,tp", elem = bf16)]
pub struct Stack {
    pub blocks: Vec<Block<bf16>>,
}

/// `x @ w` column-parallel, then gathered over tp.
#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn project(x: &DTensor<bf16>, b: &Block<bf16>) -> Result<DTensor<bf16>> {
    let h: Dt<bf16, (dp, tp), (Shard<0>, Shard<1>), 2> = x.matmul(&b.w)?;
    let r: Dt<bf16, (dp, tp), (Shard<0>, Replicate), 2> = h.redistribute()?;
    Ok(r)
}

#[test]
fn bf16_runs_through_the_typed_layer_and_the_macro() {
    let x = ArrayD::from_shape_fn(IxDyn(&[4, 3]), |i| bf16::from_f32((i[0] * 3 + i[1]) as f32 * 0.25));
    let w = ArrayD::from_shape_fn(IxDyn(&[3, 6]), |i| bf16::from_f32(i[0] as f32 - i[1] as f32 * 0.5));
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let stack = Stack::distribute(StackGlobal { blocks: vec![BlockGlobal { w: w.clone() }] }, &mesh)?;
        let names: Vec<String> = stack.named_parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["blocks.0.w"]);
        let xd: Dt<bf16, (dp, tp), (Shard<0>, Replicate), 2> = Dt::distribute(&x, &mesh)?;
        project(&xd, &stack.blocks[0])?.full_tensor()
    })
    .unwrap();
    // Products of quarters and halves: exact in bf16 and its f32 accumulation.
    let want = x
        .clone()
        .into_dimensionality::<dtensor::ndarray::Ix2>()
        .unwrap()
        .mapv(|v| v.to_f32())
        .dot(&w.clone().into_dimensionality::<dtensor::ndarray::Ix2>().unwrap().mapv(|v| v.to_f32()));
    for got in out {
        assert_eq!(got, want.mapv(bf16::from_f32).into_dyn());
    }
}
