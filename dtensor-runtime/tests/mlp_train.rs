//! A 2-layer tensor-parallel MLP trained on a 2×2 (dp × tp) mesh matches the 1-rank run, and
//! the Megatron block does exactly one all-reduce over `tp` in forward.

use dtensor_runtime::module::{
    parallelize_module, prefixed, prefixed_mut, ColwiseParallel, Forward, Linear, Module, ParallelStyle,
    RowwiseParallel,
};
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::optim::{AdamW, Sgd};
use dtensor_runtime::{
    distribute_tensor, manual_seed, run, CollectiveKind, CommDebugMode, DTensor, Replicate as R, Result, Shard as S,
};

struct Mlp {
    w1: Linear<f32>,
    w2: Linear<f32>,
}

impl Module<f32> for Mlp {
    fn named_parameters(&self) -> Vec<(String, &DTensor<f32>)> {
        let mut v = prefixed("w1", self.w1.named_parameters());
        v.extend(prefixed("w2", self.w2.named_parameters()));
        v
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<f32>)> {
        let mut v = prefixed_mut("w1", self.w1.named_parameters_mut());
        v.extend(prefixed_mut("w2", self.w2.named_parameters_mut()));
        v
    }
    fn layer_hooks_mut(&mut self, path: &str) -> Option<&mut dtensor_runtime::module::LayerHooks> {
        match path {
            "w1" => self.w1.layer_hooks_mut(""),
            "w2" => self.w2.layer_hooks_mut(""),
            _ => None,
        }
    }
}

impl Forward<f32> for Mlp {
    fn forward(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> {
        self.w2.forward(&self.w1.forward(x)?.gelu()?)
    }
}

const BATCH: usize = 7; // uneven over dp = 2
const IN: usize = 5;
const HIDDEN: usize = 7; // uneven over tp = 2
const OUT: usize = 3;

fn data() -> (ArrayD<f32>, ArrayD<f32>) {
    let x = ArrayD::from_shape_fn(IxDyn(&[BATCH, IN]), |ix| ((ix[0] * 7 + ix[1] * 3) % 11) as f32 / 5.0 - 1.0);
    let y = ArrayD::from_shape_fn(IxDyn(&[BATCH]), |ix| (ix[0] % OUT) as f32);
    (x, y)
}

#[derive(Clone, Copy)]
enum Opt {
    Sgd,
    AdamW,
}

type Trained = (Vec<f32>, Vec<(String, ArrayD<f32>)>);

fn train(mesh_shape: [usize; 2], opt: Opt) -> Trained {
    let (xg, yg) = data();
    let out = run(mesh_shape[0] * mesh_shape[1], |ctx| {
        let mesh = ctx.init_device_mesh(&mesh_shape, &["dp", "tp"])?;
        manual_seed(1234);
        let m = Mlp { w1: Linear::new(IN, HIDDEN, true)?, w2: Linear::new(HIDDEN, OUT, true)? };
        let (col, row) = (ColwiseParallel::new(), RowwiseParallel::new());
        let plan: Vec<(&str, &dyn ParallelStyle)> = vec![("w1", &col), ("w2", &row)];
        let mut m = parallelize_module(m, &mesh, &plan)?;
        let x = distribute_tensor(&xg, &mesh, &[S(0), R], None)?;
        let y = distribute_tensor(&yg, &mesh, &[S(0), R], None)?;
        let mut sgd = Sgd::<f32>::new(0.2).momentum(0.9);
        let mut adamw = AdamW::<f32>::new(0.01);
        let mut losses = Vec::new();
        for _ in 0..20 {
            m.zero_grad();
            let loss = m.forward(&x)?.cross_entropy(&y)?;
            loss.backward()?;
            match opt {
                Opt::Sgd => sgd.step(&mut m)?,
                Opt::AdamW => adamw.step(&mut m)?,
            }
            losses.push(loss.full_tensor()?.sum());
        }
        let mut weights = Vec::new();
        for (n, p) in m.named_parameters() {
            weights.push((n, p.full_tensor()?));
        }
        Ok((losses, weights))
    })
    .unwrap();
    // Every rank agrees.
    for o in &out[1..] {
        assert_eq!(o.0, out[0].0);
    }
    out.into_iter().next().unwrap()
}

fn rel(a: &ArrayD<f32>, b: &ArrayD<f32>) -> f32 {
    let num = a.iter().zip(b.iter()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    let den = b.iter().map(|y| y.abs()).fold(0.0, f32::max).max(1e-6);
    num / den
}

fn compare(opt: Opt) {
    let (l1, w1) = train([1, 1], opt);
    let (l4, w4) = train([2, 2], opt);
    assert!(l1[19] < l1[0], "the model learns: {l1:?}");
    let max_loss_rel = l4.iter().zip(&l1).map(|(a, b)| (a - b).abs() / b.abs()).fold(0.0, f32::max);
    let max_w_rel = w4.iter().zip(&w1).map(|((_, a), (_, b))| rel(a, b)).fold(0.0, f32::max);
    println!("losses (1 rank): {l1:?}\nmax relative difference 2x2 vs 1 rank: losses {max_loss_rel:e}, weights {max_w_rel:e}");
    for (a, b) in l4.iter().zip(&l1) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "losses 2x2 {l4:?} vs 1 rank {l1:?}");
    }
    for ((na, a), (nb, b)) in w4.iter().zip(&w1) {
        assert_eq!(na, nb);
        assert!(rel(a, b) <= 1e-5, "{na}: relative difference {}", rel(a, b));
    }
}

#[test]
fn mlp_sgd_2x2_matches_one_rank() {
    compare(Opt::Sgd);
}

#[test]
fn mlp_adamw_2x2_matches_one_rank() {
    compare(Opt::AdamW);
}

/// The Megatron MLP (column- then row-parallel) with raw ops: x (S0,R), w1 (R,S1), gelu,
/// w2 (R,S0) → (S0,P) → one all-reduce over tp. Backward: one all-reduce over tp for the
/// input gradient, dp all-reduces for the weight gradients, nothing else.
#[test]
fn megatron_block_does_one_tp_all_reduce_per_block() {
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let g = |shape: &[usize], k: usize| {
            ArrayD::from_shape_fn(IxDyn(shape), |ix| ((ix[0] * 5 + ix[1] * 3 + k) % 7) as f32 / 7.0 - 0.5)
        };
        let x = distribute_tensor(g(&[8, 6], 0), &mesh, &[S(0), R], None)?.requires_grad_(true);
        let w1 = distribute_tensor(g(&[6, 10], 1), &mesh, &[R, S(1)], None)?.requires_grad_(true);
        let w2 = distribute_tensor(g(&[10, 6], 2), &mesh, &[R, S(0)], None)?.requires_grad_(true);
        let fwd = CommDebugMode::new();
        let (h1, y) = fwd.scope(|| -> Result<_> {
            let h = x.matmul(&w1)?;
            let p = h.gelu()?.matmul(&w2)?;
            let block1 = p.redistribute(&[S(0), R])?;
            let h1 = block1.placements().to_vec();
            // second block on the output of the first
            let y = block1.matmul(&w1)?.gelu()?.matmul(&w2)?.redistribute(&[S(0), R])?;
            Ok((h1, y))
        })?;
        let bwd = CommDebugMode::new();
        bwd.scope(|| y.sum()?.backward())?;
        Ok((
            h1,
            fwd.count_on(CollectiveKind::AllReduce, "tp"),
            fwd.total(),
            bwd.count_on(CollectiveKind::AllReduce, "tp"),
            bwd.count_on(CollectiveKind::AllReduce, "dp"),
            bwd.total(),
            w1.grad().map(|g| g.placements().to_vec()),
        ))
    })
    .unwrap();
    for (pl, fwd_tp, fwd_total, bwd_tp, bwd_dp, bwd_total, g1) in out {
        assert_eq!(pl, vec![S(0), R]);
        assert_eq!((fwd_tp, fwd_total), (2, 2), "one tp all-reduce per block, nothing else");
        // each block: one tp all-reduce for its input gradient; w1, w2: one dp all-reduce each
        assert_eq!(bwd_tp, 2);
        assert_eq!(bwd_dp, 2);
        assert_eq!(bwd_total, 4);
        assert_eq!(g1, Some(vec![R, S(1)]));
    }
}

/// The same with the module API: Colwise + Rowwise Linear layers.
#[test]
fn megatron_module_forward_does_one_tp_all_reduce() {
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        manual_seed(3);
        let m = Mlp { w1: Linear::new(6, 8, true)?, w2: Linear::new(8, 6, true)? };
        let (col, row) = (ColwiseParallel::new(), RowwiseParallel::new());
        let plan: Vec<(&str, &dyn ParallelStyle)> = vec![("w1", &col), ("w2", &row)];
        let m = parallelize_module(m, &mesh, &plan)?;
        let x = distribute_tensor(ArrayD::<f32>::ones(vec![8, 6]), &mesh, &[S(0), R], None)?;
        let mode = CommDebugMode::new();
        let y = mode.scope(|| m.forward(&x))?;
        Ok((y.placements().to_vec(), mode.count_on(CollectiveKind::AllReduce, "tp"), mode.total()))
    })
    .unwrap();
    for (pl, tp, total) in out {
        assert_eq!(pl, vec![S(0), R]);
        assert_eq!((tp, total), (1, 1));
    }
}
