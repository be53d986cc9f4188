//! `#[distribute]` on methods: in an inherent impl the method gets a typed signature; in a
//! trait impl (`impl Forward<f32> for Block`) the trait's signature stays, the tensor
//! arguments are checked on entry and the body is typed. Results are checked against the
//! single-rank computation.

use dtensor::ndarray::{ArrayD, Ix2, IxDyn};
use dtensor::prelude::*;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dt;
use dtensor::{distribute, Replicate, Shard};

#[distribute(mesh = "dp,tp")]
pub struct Block {
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f32>,
    #[placements = [Replicate, Shard(0)]]
    pub w2: DTensor<f32>,
}

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
impl Block {
    /// Column- then row-parallel: one all-reduce, written out.
    fn mlp(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> {
        let h: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = x.matmul(&self.w1)?.relu()?;
        h.matmul(&self.w2)?.redistribute()
    }

    /// Not a tensor method: left as written.
    fn width(&self) -> usize {
        self.w1.shape()[1]
    }
}

#[distribute]
impl Forward<f32> for Block {
    #[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
    fn forward(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> {
        // `x` is `&Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>` here (ARG_LINE is this fn's line).
        self.mlp(x)
    }
}

/// The line of `forward`'s signature: a wrong argument's error points at it.
const ARG_LINE: u32 = 37;

fn global(rows: usize, cols: usize, seed: usize) -> ArrayD<f32> {
    ArrayD::from_shape_fn(IxDyn(&[rows, cols]), |ix| ((ix[0] * 7 + ix[1] * 3 + seed) % 11) as f32 / 11.0 - 0.45)
}

fn expected() -> ArrayD<f32> {
    let m = |a: ArrayD<f32>| a.into_dimensionality::<Ix2>().unwrap();
    let h = m(global(4, 5, 0)).dot(&m(global(5, 6, 1))).mapv(|v| v.max(0.0));
    h.dot(&m(global(6, 5, 2))).into_dyn()
}

fn model(ctx: &dtensor::RankCtx) -> Result<(Block, DeviceMesh)> {
    let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
    let b = Block::distribute(BlockGlobal { w1: global(5, 6, 1), w2: global(6, 5, 2) }, &mesh)?;
    Ok((b, mesh))
}

#[test]
fn trait_method_checks_its_input_and_matches_one_rank() {
    let want = expected();
    let out = run(4, |ctx| {
        let (b, mesh) = model(&ctx)?;
        let x = distribute_tensor(global(4, 5, 0), &mesh, &[Placement::Shard(0), Placement::Replicate], Some(0))?;
        let via_trait = Forward::forward(&b, &x)?.full_tensor()?;
        let typed: Dt<f32, (dp, tp), (Shard<0>, Replicate), 2> = Dt::from_dtensor(x)?;
        let inherent = b.mlp(&typed)?.full_tensor()?;
        // A tensor of another layout is rejected on entry, before any op runs.
        let wrong = distribute_tensor(global(4, 5, 0), &mesh, &[Placement::Replicate, Placement::Replicate], Some(0))?;
        let err = Forward::forward(&b, &wrong).err();
        Ok((via_trait, inherent, err, b.width()))
    })
    .unwrap();
    for (via_trait, inherent, err, width) in out {
        for got in [&via_trait, &inherent] {
            assert_eq!(got.shape(), want.shape());
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{g} vs {w}");
            }
        }
        match err {
            Some(Error::TypedMismatch { what, expected, .. }) => {
                // The argument and the method by name, at the argument's line in this file.
                let line = format!("distribute_methods.rs:{ARG_LINE})");
                assert!(what.starts_with("argument `x` of `forward`: layout (at "), "{what}");
                assert!(what.contains(&line), "{what} (expected {line})");
                assert!(expected.contains("on mesh (dp, tp)"), "{expected}");
            }
            other => panic!("expected TypedMismatch, got {other:?}"),
        }
        assert_eq!(width, 6, "global width of w1");
    }
}
