//! distribute_module / parallelize_module semantics, layers against their local forward,
//! and optimizers (local updates, no communication).

use dtensor_runtime::module::{
    distribute_module, parallelize_module, ColwiseParallel, Embedding, Forward, LayerNorm, Linear, Module,
    ParallelStyle, RmsNorm, RowwiseParallel, SequenceParallel,
};
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::optim::{AdamW, Sgd};
use dtensor_runtime::{
    distribute_tensor, from_local, manual_seed, run, CommDebugMode, DTensor, DeviceMesh, Error, FromLocal, Placement,
    Replicate as R, Result, Shard as S,
};

fn input(shape: &[usize]) -> ArrayD<f64> {
    let mut i = 0;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        i += 1;
        ((i * 37) % 23) as f64 / 11.0 - 1.0
    })
}

fn close(a: &ArrayD<f64>, b: &ArrayD<f64>) -> bool {
    a.shape() == b.shape() && a.iter().zip(b.iter()).all(|(x, y)| (x - y).abs() < 1e-10)
}

/// Output of the local (undistributed) module on the full input.
fn local_forward<M: Forward<f64>>(m: &M, x: &ArrayD<f64>) -> Result<ArrayD<f64>> {
    m.forward(&DTensor::local_tensor(x.clone()))?.full_tensor()
}

#[test]
fn distribute_module_replicates_without_partition_fn_and_refuses_twice() {
    let x = input(&[5, 4]);
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        manual_seed(5);
        let lin = Linear::<f64>::new(4, 3, true)?;
        let want = local_forward(&lin, &x)?;
        // input_fn: each rank's batch rows become a batch-sharded DTensor; output_fn: replicate
        let input_fn: dtensor_runtime::module::InputFn<f64> =
            Box::new(|x: &DTensor<f64>, mesh: &DeviceMesh| distribute_tensor(x.local(), mesh, &[S(0), R], None));
        let output_fn: dtensor_runtime::module::OutputFn<f64> =
            Box::new(|y: &DTensor<f64>, _: &DeviceMesh| y.redistribute(&[R, R]));
        let d = distribute_module(lin, &mesh, None, Some(input_fn), Some(output_fn))?;
        let placements: Vec<Vec<Placement>> =
            d.named_parameters().iter().map(|(_, p)| p.placements().to_vec()).collect();
        let y = d.forward(&DTensor::local_tensor(x.clone()))?;
        let twice = distribute_module(d, &mesh, None, None, None).err();
        Ok((placements, y.placements().to_vec(), close(&y.to_host()?, &want), twice))
    })
    .unwrap();
    for (pl, ypl, same, twice) in out {
        assert_eq!(pl, vec![vec![R, R], vec![R, R]]);
        assert_eq!(ypl, vec![R, R]);
        assert!(same);
        assert!(matches!(twice, Some(Error::Module(_))), "{twice:?}");
    }
}

#[test]
fn distribute_module_with_partition_fn() {
    let x = input(&[3, 6]);
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        manual_seed(9);
        let lin = Linear::<f64>::new(6, 5, false)?;
        let want = local_forward(&lin, &x)?;
        let f =
            |name: &str, _: &DTensor<f64>, _: &DeviceMesh| Ok(if name == "weight" { Some(vec![S(1)]) } else { None });
        let d = distribute_module(lin, &mesh, Some(&f), None, None)?;
        let xd = distribute_tensor(&x, &mesh, &[R], None)?;
        let y = d.forward(&xd)?;
        Ok((d.module.weight.placements().to_vec(), close(&y.full_tensor()?, &want)))
    })
    .unwrap();
    for (pl, same) in out {
        assert_eq!(pl, vec![S(1)]);
        assert!(same);
    }
}

#[test]
fn parallelize_styles_shard_parameters_and_keep_the_forward() {
    let x = input(&[5, 6]);
    let ids: ArrayD<f64> = ArrayD::from_shape_fn(IxDyn(&[2, 3]), |ix| ((ix[0] * 3 + ix[1]) % 7) as f64);
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        manual_seed(11);
        let (col, row, seq) = (ColwiseParallel::new(), RowwiseParallel::new(), SequenceParallel::new().sequence_dim(0));
        let mut results = Vec::new();
        for style in [&col as &dyn ParallelStyle, &row] {
            let lin = Linear::<f64>::new(6, 5, true)?;
            let want = local_forward(&lin, &x)?;
            let lin = parallelize_module(lin, &mesh, &[("", style)])?;
            let y = lin.forward(&distribute_tensor(&x, &mesh, &[S(0), R], None)?)?;
            let pl: Vec<Vec<Placement>> = lin.named_parameters().iter().map(|(_, p)| p.placements().to_vec()).collect();
            results.push((pl, close(&y.full_tensor()?, &want)));
            let emb = Embedding::<f64>::new(7, 4)?;
            let want = emb.forward(&DTensor::local_tensor(ids.clone()))?.full_tensor()?;
            let emb = parallelize_module(emb, &mesh, &[("", style)])?;
            let y = emb.forward(&distribute_tensor(&ids, &mesh, &[R, R], None)?)?;
            results.push((vec![emb.weight.placements().to_vec()], close(&y.full_tensor()?, &want)));
        }
        for norm in [0, 1] {
            let (m, want): (Box<dyn NormLike>, ArrayD<f64>) = if norm == 0 {
                let n = LayerNorm::<f64>::new(6)?;
                let w = local_forward(&n, &x)?;
                (Box::new(parallelize_module(n, &mesh, &[("", &seq as &dyn ParallelStyle)])?), w)
            } else {
                let n = RmsNorm::<f64>::new(6)?;
                let w = local_forward(&n, &x)?;
                (Box::new(parallelize_module(n, &mesh, &[("", &seq as &dyn ParallelStyle)])?), w)
            };
            let mode = CommDebugMode::new();
            let y = mode.scope(|| m.run(&distribute_tensor(&x, &mesh, &[R, S(0)], None)?))?;
            results.push((
                vec![y.placements().to_vec(), vec![Placement::Shard(mode.total() as isize)]],
                close(&y.full_tensor()?, &want),
            ));
        }
        Ok(results)
    })
    .unwrap();
    for r in out {
        assert_eq!(r[0].0, vec![vec![R, S(0)], vec![R, S(0)]], "colwise linear");
        assert_eq!(r[1].0, vec![vec![R, S(1)]], "colwise embedding");
        assert_eq!(r[2].0, vec![vec![R, S(1)], vec![R, R]], "rowwise linear");
        assert_eq!(r[3].0, vec![vec![R, S(0)]], "rowwise embedding");
        // sequence-parallel norms run locally on the sequence shards (0 collectives)
        assert_eq!(r[4].0, vec![vec![R, S(0)], vec![S(0)]]);
        assert_eq!(r[5].0, vec![vec![R, S(0)], vec![S(0)]]);
        assert!(r.iter().all(|(_, same)| *same));
    }
}

trait NormLike {
    fn run(&self, x: &DTensor<f64>) -> Result<DTensor<f64>>;
}
impl<M: Forward<f64>> NormLike for M {
    fn run(&self, x: &DTensor<f64>) -> Result<DTensor<f64>> {
        self.forward(x)
    }
}

#[test]
fn parallelize_errors() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let col = ColwiseParallel::new();
        let unknown =
            parallelize_module(Linear::<f32>::new(2, 2, true)?, &mesh, &[("nope", &col as &dyn ParallelStyle)]).err();
        let wrong_kind =
            parallelize_module(LayerNorm::<f32>::new(2)?, &mesh, &[("", &col as &dyn ParallelStyle)]).err();
        let bad_dim = parallelize_module(
            Linear::<f32>::new(2, 2, true)?,
            &mesh,
            &[("", &ColwiseParallel::new().mesh_dim("dp") as &dyn ParallelStyle)],
        )
        .err();
        let lin = parallelize_module(Linear::<f32>::new(2, 2, true)?, &mesh, &[])?;
        let twice = parallelize_module(lin, &mesh, &[]).err();
        Ok((unknown, wrong_kind, bad_dim, twice))
    })
    .unwrap();
    let (unknown, wrong_kind, bad_dim, twice) = &out[0];
    assert!(matches!(unknown, Some(Error::Module(m)) if m.contains("nope")), "{unknown:?}");
    assert!(matches!(wrong_kind, Some(Error::Module(_))), "{wrong_kind:?}");
    assert!(matches!(bad_dim, Some(Error::UnknownMeshDim { .. })), "{bad_dim:?}");
    assert!(matches!(twice, Some(Error::Module(_))), "{twice:?}");
}

#[test]
fn optimizers_update_shards_locally_without_communication() {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        manual_seed(2);
        let lin = Linear::<f64>::new(3, 5, true)?;
        let w0 = lin.weight.full_tensor()?;
        let col = ColwiseParallel::new();
        let mut lin = parallelize_module(lin, &mesh, &[("", &col as &dyn ParallelStyle)])?;
        let x = from_local(input(&[4, 3]), &mesh, &[R], FromLocal::default())?;
        lin.forward(&x)?.sum()?.backward()?;
        let g = lin.weight.grad().expect("grad").full_tensor()?;
        let mode = CommDebugMode::new();
        let mut sgd = Sgd::new(0.5);
        mode.scope(|| sgd.step(&mut lin))?;
        let after_sgd = lin.weight.full_tensor()?;
        let mut adam = AdamW::new(0.1);
        mode.scope(|| adam.step(&mut lin))?;
        let after_adam = lin.weight.full_tensor()?;
        Ok((mode.total(), w0, g, after_sgd, after_adam))
    })
    .unwrap();
    let (comms, w0, g, sgd, adam) = out[0].clone();
    assert_eq!(comms, 0);
    for i in 0..w0.len() {
        let (w, g, s, a) = (
            w0.as_slice().unwrap()[i],
            g.as_slice().unwrap()[i],
            sgd.as_slice().unwrap()[i],
            adam.as_slice().unwrap()[i],
        );
        assert!((s - (w - 0.5 * g)).abs() < 1e-12);
        // first AdamW step: decay, then -lr * g / (|g| + eps)
        let decayed = s - 0.1 * 0.01 * s;
        assert!((a - (decayed - 0.1 * g / (g.abs() + 1e-8))).abs() < 1e-9, "{a} vs {decayed} g={g}");
    }
}
