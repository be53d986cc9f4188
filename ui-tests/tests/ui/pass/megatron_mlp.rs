//! Megatron MLP forward on a dp × tp mesh: x (S0, R) @ w1 (R, S1) → gelu → @ w2 (R, S0)
//! → (S0, Partial<Sum>) → redistribute to (S0, R), every layout checked by the type system,
//! the result checked against the single-device computation.
use dtensor::ndarray::{ArrayD, Ix2, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::{distribute, DTensor, Dt, Partial, Replicate, Shard, Sum};

#[distribute(mesh = "dp,tp")]
pub struct Mlp {
    /// Column parallel: each tp rank holds a slice of the hidden units.
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f32>,
    /// Row parallel.
    #[placements = [Replicate, Shard(0)]]
    pub w2: DTensor<f32>,
}

impl Mlp {
    /// The input and the output are batch-sharded over dp and replicated over tp.
    #[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
    pub fn forward(&self, x: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
        let h: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2> = x.matmul(&self.w1)?.gelu()?;
        let y: Dt<f32, (dp, tp), (Shard<0>, Partial<Sum>), 2> = h.matmul(&self.w2)?;
        y.redistribute() // one all-reduce over tp; the target layout comes from the return type
    }
}

/// The same parameters as a plain (dynamic) module.
struct LocalMlp {
    w1: dtensor::DTensor<f32>,
    w2: dtensor::DTensor<f32>,
}

impl dtensor::Module<f32> for LocalMlp {
    fn named_parameters(&self) -> Vec<(String, &dtensor::DTensor<f32>)> {
        vec![("w1".into(), &self.w1), ("w2".into(), &self.w2)]
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut dtensor::DTensor<f32>)> {
        vec![("w1".into(), &mut self.w1), ("w2".into(), &mut self.w2)]
    }
}

fn array(rows: usize, cols: usize, seed: usize) -> ArrayD<f32> {
    ArrayD::from_shape_fn(IxDyn(&[rows, cols]), |ix| (((ix[0] * cols + ix[1]) * 7 + seed) % 11) as f32 / 8.0 - 0.6)
}

fn gelu(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())) as f32
}

fn main() {
    let (x, w1, w2) = (array(6, 4, 1), array(4, 10, 2), array(10, 4, 3));
    let expect = {
        let d2 = |a: &ArrayD<f32>| a.view().into_dimensionality::<Ix2>().unwrap().to_owned();
        d2(&x).dot(&d2(&w1)).mapv(gelu).dot(&d2(&w2)).into_dyn()
    };
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let mlp = Mlp::distribute(MlpGlobal { w1: w1.clone(), w2: w2.clone() }, &mesh)?;
        // The generated `Module` impl: what optimizers and checkpoints use.
        fn names<M: dtensor::Module<f32>>(m: &M) -> Vec<String> {
            m.named_parameters().into_iter().map(|(n, _)| n).collect()
        }
        assert_eq!(names(&mlp), ["w1", "w2"]);
        assert!(mlp.w1.as_dtensor().requires_grad());
        // The declared placements also drive `distribute_module` on a dynamic module.
        let local = LocalMlp { w1: dtensor::DTensor::local_tensor(w1.clone()), w2: dtensor::DTensor::local_tensor(w2.clone()) };
        let dynamic = dtensor::distribute_module(local, &mesh, Some(&Mlp::partition), None, None)?;
        let typed = mlp.named_parameters();
        for ((n, p), (tn, tp)) in dtensor::Module::named_parameters(&dynamic).into_iter().zip(typed) {
            assert_eq!((n.as_str(), p.placements(), p.local()), (tn.as_str(), tp.placements(), tp.local()));
        }
        assert_eq!(mlp.w1.local().shape(), &[4, 5]);
        let xd: Dt<f32, (dp, tp), (Shard<0>, Replicate), 2> = Dt::distribute(&x, &mesh)?;
        let comm = dtensor::CommDebugMode::new();
        let y = comm.scope(|| mlp.forward(&xd))?;
        // The layouts the types computed need exactly one collective: the all-reduce over tp.
        assert_eq!(comm.total(), 1, "{}", comm.summary());
        assert_eq!(comm.count_on(dtensor::CollectiveKind::AllReduce, "tp"), 1);
        assert_eq!(y.placements(), &[dtensor::Shard(0), dtensor::Replicate]);
        y.full_tensor()
    })
    .unwrap();
    for full in out {
        let err = (&full - &expect).iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(err < 1e-4, "max error {err}");
    }
}
