//! The autograd graph's lifetime: `backward` frees the tensors the graph saved (PyTorch's
//! default), `backward_retaining_graph` keeps them, and a DTensor's clone shares its shard
//! copy-on-write, so that an optimizer step after `backward` updates the weights in place.

use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::optim::Sgd;
use dtensor_runtime::{distribute_tensor, run, DTensor, Error, Module, Placement, Replicate, Shard};

/// One weight, as a module the optimizer can step.
struct W(DTensor<f64>);

impl Module<f64> for W {
    fn named_parameters(&self) -> Vec<(String, &DTensor<f64>)> {
        vec![("w".into(), &self.0)]
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<f64>)> {
        vec![("w".into(), &mut self.0)]
    }
}

fn host(shape: &[usize], scale: f64) -> ArrayD<f64> {
    ArrayD::from_shape_fn(IxDyn(shape), |ix| (ix[0] * 7 + ix[1] * 3) as f64 * scale - 1.0)
}

/// (ranks, global shape, weight placement): uneven shards and an empty shard included.
fn layouts() -> Vec<(usize, Vec<usize>, Placement)> {
    vec![
        (1, vec![5, 3], Replicate),
        (2, vec![5, 3], Shard(0)),
        (3, vec![5, 3], Shard(1)),
        (2, vec![1, 3], Shard(0)),
        (2, vec![4, 2], Replicate),
    ]
}

/// `loss = sum(x * w)`, so `dloss/dw = x`.
fn loss(w: &DTensor<f64>, x: &DTensor<f64>) -> dtensor_runtime::Result<DTensor<f64>> {
    w.mul(x)?.sum()
}

#[test]
fn backward_frees_the_graph_and_a_second_pass_is_a_typed_error() {
    for (n, shape, pl) in layouts() {
        let (wh, xh) = (host(&shape, 0.25), host(&shape, 0.5));
        let out = run(n, |ctx| {
            let mesh = ctx.init_device_mesh(&[n], &["x"])?;
            let w = distribute_tensor(&wh, &mesh, &[pl], None)?.requires_grad_(true);
            let x = distribute_tensor(&xh, &mesh, &[pl], None)?;
            let l = loss(&w, &x)?;
            l.backward()?;
            let once = w.grad().expect("a gradient").full_tensor()?;
            let again = l.backward().unwrap_err();
            // Retained, the graph takes a second pass, which accumulates: 2 x on top of x.
            let l = loss(&w, &x)?;
            l.backward_retaining_graph()?;
            l.backward()?;
            let thrice = w.grad().expect("a gradient").full_tensor()?;
            Ok((once, again, thrice))
        })
        .unwrap();
        for (once, again, thrice) in out {
            assert_eq!(once, xh, "{n} ranks {shape:?} {pl:?}");
            assert_eq!(thrice, xh.mapv(|v| 3.0 * v), "{n} ranks {shape:?} {pl:?}");
            assert!(
                matches!(&again, Error::Autograd(m) if m.contains("second time") && m.contains("backward_retaining_graph")),
                "{again}"
            );
        }
    }
}

#[test]
fn an_optimizer_step_after_backward_updates_in_place_and_clones_keep_their_values() {
    for (n, shape, pl) in layouts() {
        let (wh, xh) = (host(&shape, 0.25), host(&shape, 0.5));
        let out = run(n, |ctx| {
            let mesh = ctx.init_device_mesh(&[n], &["x"])?;
            let mut m = W(distribute_tensor(&wh, &mesh, &[pl], None)?.requires_grad_(true));
            let x = distribute_tensor(&xh, &mesh, &[pl], None)?;
            let before = m.0.clone();
            loss(&m.0, &x)?.backward()?;
            let shared = std::ptr::eq(before.local_cpu()?.as_ptr(), m.0.local_cpu()?.as_ptr());
            drop(before);
            let at = m.0.local_cpu()?.as_ptr();
            let kept = m.0.clone();
            let detached = m.0.detach();
            drop(kept);
            drop(detached);
            Sgd::new(0.5).step(&mut m)?;
            let in_place = std::ptr::eq(at, m.0.local_cpu()?.as_ptr());
            // A clone alive across the step is copied on write: it keeps the old values.
            let old = m.0.clone();
            loss(&m.0, &x)?.backward()?;
            Sgd::new(0.5).step(&mut m)?;
            Ok((shared, in_place, old.full_tensor()?, m.0.full_tensor()?))
        })
        .unwrap();
        let one = &wh - &xh.mapv(|v| 0.5 * v);
        // The second step adds the first step's gradient (never cleared) to a fresh one: 2 x.
        let two = &one - &xh.mapv(|v| 0.5 * 2.0 * v);
        for (shared, in_place, old, new) in out {
            assert!(shared, "a clone shares the shard ({n} ranks {shape:?} {pl:?})");
            assert!(in_place, "the step copied the weight ({n} ranks {shape:?} {pl:?})");
            assert_eq!(old, one, "{n} ranks {shape:?} {pl:?}");
            assert_eq!(new, two, "{n} ranks {shape:?} {pl:?}");
        }
    }
}
