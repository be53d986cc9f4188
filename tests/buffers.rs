//! `#[distribute(buffer)]`: tensors a module holds that are state, not parameters (running
//! statistics, fixed tables). Placed by their declared layouts, listed by `named_buffers`
//! (nested modules' too) and never by `named_parameters`, so no optimizer changes them; they
//! never require grad; a training-state checkpoint saves and restores them (onto another
//! mesh too); `load_hf` reads them from a checkpoint.

use dtensor::checkpoint::hf::{self, HfCheckpoint};
use dtensor::checkpoint::{Checkpointer, Restore, TrainState};
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::optim::AdamW;
use dtensor::prelude::*;
use dtensor::{distribute, Replicate};

#[distribute(mesh = "dp,tp")]
pub struct Layer {
    #[placements = [Replicate, Shard(0)]]
    pub weight: DTensor<f32>,
    /// Running statistic, sharded like the weight's rows.
    #[distribute(buffer)]
    #[placements = [Replicate, Shard(0)]]
    pub running: DTensor<f32, 1>,
}

#[distribute(mesh = "dp,tp")]
pub struct Net {
    pub layers: Vec<Layer>,
    /// A fixed table, replicated.
    #[distribute(buffer)]
    #[placements = [Replicate, Replicate]]
    pub table: DTensor<f32>,
}

fn values(shape: &[usize], seed: usize) -> ArrayD<f32> {
    let mut i = 0;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        i += 1;
        ((i * 13 + seed * 7) % 17) as f32 / 17.0 - 0.4
    })
}

fn global() -> NetGlobal {
    NetGlobal {
        layers: (0..2).map(|l| LayerGlobal { weight: values(&[5, 3], l), running: values(&[5], 10 + l) }).collect(),
        table: values(&[2, 3], 20),
    }
}

fn forward_loss(net: &Net, x: &DTensor<f32>) -> Result<DTensor<f32>> {
    let mut h = x.clone();
    for l in &net.layers {
        // [b, 3] · [5, 3]ᵀ → [b, 5] → scaled by the running statistic → back to 3 columns.
        let y = h.linear(l.weight.as_dtensor(), None)?.mul(l.running.as_dtensor())?;
        h = y.matmul(l.weight.as_dtensor())?.redistribute(&[Replicate, Replicate])?;
    }
    h.matmul(&net.table.as_dtensor().transpose(0, 1)?)?.mul(&h.matmul(&net.table.as_dtensor().transpose(0, 1)?)?)?.sum()
}

#[test]
fn buffers_are_placed_listed_apart_and_never_trained() {
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let mut net = Net::distribute(global(), &mesh)?;
        let params: Vec<String> = net.named_parameters().into_iter().map(|(n, _)| n).collect();
        let buffers: Vec<(String, Vec<Placement>, bool)> =
            net.named_buffers().into_iter().map(|(n, b)| (n, b.placements().to_vec(), b.requires_grad())).collect();
        let before: Vec<ArrayD<f32>> =
            net.named_buffers().iter().map(|(_, b)| b.full_tensor()).collect::<Result<_>>()?;
        let x = distribute_tensor(values(&[4, 3], 30), &mesh, &[Replicate, Replicate], None)?;
        let mut opt = AdamW::new(0.1);
        for _ in 0..2 {
            net.zero_grad();
            forward_loss(&net, &x)?.backward()?;
            opt.step(&mut net)?;
        }
        let after: Vec<ArrayD<f32>> =
            net.named_buffers().iter().map(|(_, b)| b.full_tensor()).collect::<Result<_>>()?;
        let w_changed = net.layers[0].weight.full_tensor()? != global().layers[0].weight;
        Ok((params, buffers, before == after, w_changed))
    })
    .unwrap();
    for (params, buffers, unchanged, w_changed) in out {
        assert_eq!(params, ["layers.0.weight", "layers.1.weight"]);
        let names: Vec<&str> = buffers.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, ["layers.0.running", "layers.1.running", "table"]);
        assert_eq!(buffers[0].1, [Replicate, Shard(0)]);
        assert!(buffers.iter().all(|(_, _, g)| !g), "buffers never require grad");
        assert!(unchanged, "the optimizer left the buffers alone");
        assert!(w_changed, "and trained the parameters");
    }
}

#[test]
fn buffers_are_checkpointed_and_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let hf_dir = tempfile::tempdir().unwrap();
    // Save on 2×2 with a changed buffer; restore on 1×4 into a fresh model.
    dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let mut net = Net::distribute(global(), &mesh)?;
        let changed = distribute_tensor(values(&[5], 99), &mesh, &[Replicate, Shard(0)], None)?;
        *net.named_buffers_mut().remove(0).1 = changed;
        Checkpointer::new(dir.path()).save(TrainState::new(&net, 1))?;
        let all: Vec<(String, DTensor<f32>)> =
            net.named_parameters().into_iter().chain(net.named_buffers()).map(|(n, t)| (n, t.clone())).collect();
        hf::save(hf_dir.path(), &all)
    })
    .unwrap();
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[1, 4], &["dp", "tp"])?;
        let mut net = Net::distribute(global(), &mesh)?;
        Checkpointer::new(dir.path()).load(Restore::new(&mut net))?.expect("a checkpoint");
        let restored = net.layers[0].running.full_tensor()?;
        let loaded = Net::load_hf(&mut HfCheckpoint::open(hf_dir.path())?, "", &mesh)?;
        let from_hf = loaded.layers[0].running.full_tensor()?;
        Ok((restored, from_hf, loaded.named_buffers().iter().all(|(_, b)| !b.requires_grad())))
    })
    .unwrap();
    for (restored, from_hf, no_grad) in out {
        assert_eq!(restored, values(&[5], 99));
        assert_eq!(from_hf, values(&[5], 99));
        assert!(no_grad);
    }
}
