//! `#[distribute]` structs that hold other `#[distribute]` structs (directly, in `Vec`,
//! `Option`, `Box`, `[_; N]`) and containers of tensors: every weight is a parameter under its
//! dotted name, and one SGD step changes every one of them (a weight left out of
//! `named_parameters` would keep its value).

use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::optim::Sgd;
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

#[distribute(mesh = "dp,tp")]
pub struct Model {
    pub blocks: Vec<Block>,
    pub pair: [Block; 2],
    pub extra: Option<Box<Block>>,
    pub absent: Option<Block>,
    #[placements = [Replicate, Replicate]]
    pub scales: Vec<DTensor<f32>>,
    #[placements = [Replicate, Shard(0)]]
    pub bias: Option<DTensor<f32>>,
    #[distribute(skip)]
    pub note: Vec<String>,
    pub steps: usize,
}

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
fn block_forward(x: &DTensor<f32>, b: &Block) -> Result<DTensor<f32>> {
    let h: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = x.matmul(&b.w1)?.gelu()?;
    h.matmul(&b.w2)?.redistribute()
}

fn weight(rows: usize, cols: usize, seed: usize) -> ArrayD<f32> {
    ArrayD::from_shape_fn(IxDyn(&[rows, cols]), |ix| ((ix[0] * 7 + ix[1] * 3 + seed) % 11) as f32 / 11.0 - 0.45)
}

fn block(seed: usize) -> BlockGlobal {
    BlockGlobal { w1: weight(4, 6, seed), w2: weight(6, 4, seed + 1) }
}

impl Model {
    fn forward(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> {
        let mut h: Dt<f32, (dp, tp), (Shard<0>, Replicate), 2> = Dt::from_dtensor(x.clone())?;
        let extra = self.extra.as_deref();
        for b in self.blocks.iter().chain(&self.pair).chain(extra) {
            h = block_forward(&h, b)?;
        }
        let mut y = h.into_dtensor();
        for s in &self.scales {
            y = y.matmul(s.as_dtensor())?;
        }
        if let Some(b) = &self.bias {
            y = y.add(b.as_dtensor())?;
        }
        Ok(y)
    }
}

#[test]
fn every_nested_weight_is_a_parameter_and_changes_after_one_step() {
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let global = ModelGlobal {
            blocks: vec![block(0), block(2), block(4)],
            pair: [block(6), block(8)],
            extra: Some(Box::new(block(10))),
            absent: None,
            scales: vec![weight(4, 4, 12)],
            bias: Some(weight(1, 4, 13)),
            note: vec!["kept".into()],
            steps: 3,
        };
        let mut m = Model::distribute(global, &mesh)?;
        assert_eq!(m.note, vec!["kept".to_string()]);
        assert_eq!(m.steps, 3);
        let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
        let want = [
            "blocks.0.w1",
            "blocks.0.w2",
            "blocks.1.w1",
            "blocks.1.w2",
            "blocks.2.w1",
            "blocks.2.w2",
            "pair.0.w1",
            "pair.0.w2",
            "pair.1.w1",
            "pair.1.w2",
            "extra.w1",
            "extra.w2",
            "scales.0",
            "bias",
        ];
        assert_eq!(names, want);
        let placements = m.parameter_placements();
        assert_eq!(placements.len(), want.len());
        assert_eq!(placements[0], ("blocks.0.w1".to_string(), vec![Replicate, Shard(1)]));
        assert_eq!(placements[13], ("bias".to_string(), vec![Replicate, Shard(0)]));
        // The partition_fn matches container indices by pattern.
        let p = &m.blocks[1].w2;
        assert_eq!(Model::partition("blocks.7.w2", p.as_dtensor(), &mesh)?, Some(vec![Replicate, Shard(0)]));
        assert_eq!(Model::partition("absent.w1", p.as_dtensor(), &mesh)?, Some(vec![Replicate, Shard(1)]));
        assert_eq!(Model::partition("nope", p.as_dtensor(), &mesh)?, None);

        let before: Vec<ArrayD<f32>> =
            m.named_parameters().into_iter().map(|(_, p)| p.full_tensor()).collect::<Result<_>>()?;
        let x = distribute_tensor(weight(8, 4, 20), &mesh, &[Shard(0), Replicate], Some(0))?;
        let target = distribute_tensor(weight(8, 4, 21), &mesh, &[Shard(0), Replicate], Some(0))?;
        m.zero_grad();
        m.forward(&x)?.mse_loss(&target)?.backward()?;
        Sgd::new(0.5).step(&mut m)?;
        let mut unchanged = Vec::new();
        for ((name, p), old) in m.named_parameters().into_iter().zip(&before) {
            if p.full_tensor()? == *old {
                unchanged.push(name);
            }
        }
        Ok(unchanged)
    })
    .unwrap();
    for unchanged in out {
        assert!(unchanged.is_empty(), "weights without an update: {unchanged:?}");
    }
}

#[test]
fn distribute_checks_the_mesh_dims() {
    let out = dtensor::run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        Ok(Block::distribute(block(0), &mesh).is_err())
    })
    .unwrap();
    assert_eq!(out, vec![true, true]);
}

/// Issue 31 ("declared struct layouts can be bypassed"): a parameter replaced through
/// `named_parameters_mut` with another layout is refused by the next optimizer step, with an
/// error naming the parameter and both layouts, before any weight changes; put back, the step
/// runs.
#[test]
fn a_parameter_written_around_its_declared_layout_is_refused_by_name() {
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let mut b = Block::distribute(block(0), &mesh)?;
        let x = distribute_tensor(weight(8, 4, 20), &mesh, &[Shard(0), Replicate], Some(0))?;
        block_forward(&Dt::from_dtensor(x)?, &b)?.into_dtensor().sum()?.backward()?;
        let declared = b.w2.as_dtensor().clone();
        let before = b.w1.full_tensor()?;
        for (name, p) in b.named_parameters_mut() {
            if name == "w2" {
                *p = p.redistribute(&[Replicate, Replicate])?.requires_grad_(true);
            }
        }
        let err = Sgd::new(0.5).step(&mut b).unwrap_err();
        assert_eq!(b.w1.full_tensor()?, before, "nothing may change before the refusal");
        *b.w2.as_dtensor_mut() = declared;
        Sgd::new(0.5).step(&mut b)?;
        Ok(err)
    })
    .unwrap();
    for err in out {
        match &err {
            Error::DeclaredLayout { parameter, declared, actual, .. } => {
                assert_eq!(parameter, "w2");
                assert_eq!(declared, "(R, S(0))");
                assert_eq!(actual, "(R, R)");
            }
            other => panic!("expected DeclaredLayout, got {other:?}"),
        }
        assert!(err.to_string().contains("optimizer step"), "{err}");
    }
}
