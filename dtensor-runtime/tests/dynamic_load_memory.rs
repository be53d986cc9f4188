//! Dynamic modules without a full-size model first: layers built with `Linear::zeros` hold the
//! allocator's zeroed pages, which take no memory until written, and `load_into` replaces each
//! weight by this rank's shard. Measured as the process's resident memory (VmRSS, not the heap
//! counter: untouched pages are allocated but not resident): 4 ranks of a 256 MB model sharded
//! over tp grow it by about the model once (each rank its quarter), where weights drawn at
//! construction would have made every rank hold the whole model (1 GB) first. Its own test
//! binary, one test, so no other test's memory moves the reading.

use dtensor_runtime::checkpoint::hf::{self, HfCheckpoint, LoadPlan};
use dtensor_runtime::module::{Linear, Module};
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::{distribute_tensor, run, DTensor, Placement, Replicate, Shard};

struct Stack {
    layers: Vec<Linear<f32>>,
}

impl Module<f32> for Stack {
    fn named_parameters(&self) -> Vec<(String, &DTensor<f32>)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| l.named_parameters().into_iter().map(move |(n, p)| (format!("layers.{i}.{n}"), p)))
            .collect()
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<f32>)> {
        self.layers
            .iter_mut()
            .enumerate()
            .flat_map(|(i, l)| l.named_parameters_mut().into_iter().map(move |(n, p)| (format!("layers.{i}.{n}"), p)))
            .collect()
    }
}

/// This process's resident memory in bytes, now (`VmRSS`) or at its peak (`VmHWM`), from
/// Linux's `/proc/self/status`.
fn status(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

fn resident() -> Option<u64> {
    status("VmRSS:")
}

/// Resets the peak to the current resident memory (Linux ≥ 4.0); false where refused.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[test]
fn zeros_layers_loaded_shard_by_shard_grow_memory_by_the_shards() {
    let Some(_) = resident() else {
        println!("SKIP: no /proc/self/status on this system");
        return;
    };
    let (layers, dim) = (4usize, 4096usize);
    let dir = tempfile::tempdir().unwrap();
    // The checkpoint, written from one layer's worth of memory at a time.
    run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["tp"])?;
        let mut state = Vec::new();
        for l in 0..layers {
            let w = ArrayD::from_shape_fn(IxDyn(&[dim, dim]), |i| ((i[0] * 7 + i[1] + l) % 13) as f32);
            state.push((format!("layers.{l}.weight"), distribute_tensor(w, &mesh, &[Replicate], None)?));
        }
        hf::save(dir.path(), &state)
    })
    .unwrap();
    let model_bytes = (layers * dim * dim * 4) as u64;
    let before = resident().unwrap();
    let peak_known = reset_peak();
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["tp"])?;
        let mut m = Stack { layers: (0..layers).map(|_| Linear::zeros(dim, dim, false)).collect::<Result<_, _>>()? };
        let plan = LoadPlan::new().placements("layers.*.weight", &[Shard(0)]);
        HfCheckpoint::open(dir.path())?.load_into(&mut m, "", &mesh, &plan)?;
        mesh.barrier(dtensor_runtime::Along::All)?;
        let grown = resident().unwrap().saturating_sub(before);
        let w = &m.layers[2].weight;
        let ok = w.placements() == [Placement::Shard(0)] && w.requires_grad();
        let row = w.to_host()?.index_axis(dtensor_runtime::ndarray::Axis(0), 0).to_owned();
        let first = mesh.coordinate()[0] * dim / 4;
        let want = ArrayD::from_shape_fn(IxDyn(&[dim]), |i| ((first * 7 + i[0] + 2) % 13) as f32);
        mesh.barrier(dtensor_runtime::Along::All)?;
        Ok((grown, ok, row == want))
    })
    .unwrap();
    let grown = out.iter().map(|r| r.0).max().unwrap();
    let peak = status("VmHWM:").filter(|_| peak_known).map(|p| p.saturating_sub(before));
    println!(
        "resident growth {:.0} MB, peak growth {} for a {:.0} MB model on 4 ranks",
        grown as f64 / 1e6,
        peak.map_or("unknown (clear_refs refused)".to_string(), |p| format!("{:.0} MB", p as f64 / 1e6)),
        model_bytes as f64 / 1e6,
    );
    if let Some(p) = peak {
        assert!(p < model_bytes * 3 / 2, "peak grew {p} bytes for a {model_bytes}-byte model on 4 ranks");
    }
    for (_, ok, values) in &out {
        assert!(*ok && *values, "loaded shards have their placements, grad flag and values");
    }
    assert!(grown < model_bytes * 3 / 2, "grew {grown} bytes for a {model_bytes}-byte model on 4 ranks");
}
