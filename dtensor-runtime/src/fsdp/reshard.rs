//! Resharding after the forward: the forward runs without a tape, so its gathered parameters
//! (and its activations) are freed as soon as it returns, and records one node whose backward
//! gathers the parameters again, recomputes the forward from the saved input and runs its
//! backward. PyTorch frees the gathered parameters' storage in place and keeps the
//! activations; a `DTensor`'s storage is shared and immutable, so here the forward is
//! recomputed instead (activation checkpointing of the unit): one more forward per step, for
//! a window of one unit's parameters and activations.

use super::prefetch;
use super::sink::{sink, take, Sink};
use super::unit::Unit;
use crate::autograd::{enable_grad_guard, no_grad, record, recording};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::Result;
use crate::module::{Forward, Module};
use crate::rng::{rng_state, set_rng_state};

/// `module.forward(x)` with the unit's parameters gathered (from `base`, the module's
/// parameters at rest, or prefetched: `gathered`), recorded to be recomputed by the backward;
/// `prefetch`: its backward prefetches the unit before it ([`prefetch::previous`]).
pub(super) fn forward_recomputed<T, M>(
    unit: &Unit<T>,
    module: &M,
    x: &DTensor<T>,
    base: Vec<DTensor<T>>,
    gathered: Option<Vec<DTensor<T>>>,
    prefetch: bool,
) -> Result<DTensor<T>>
where
    T: Element,
    M: Module<T> + Forward<T> + Clone + Send + Sync + 'static,
{
    // The generator as the forward finds it: the recomputation draws the same numbers (dropout).
    let rng = rng_state();
    let inputs: Vec<&DTensor<T>> = std::iter::once(x).chain(&base).collect();
    let recorded = recording(&inputs);
    // A unit resharding to a smaller group keeps a slice of what it gathers: gathered here,
    // so that the slices can be cut after the forward.
    let gathered = match gathered {
        None if recorded && unit.post.is_some() => {
            unit.check_at_rest(&base, "fully_shard")?; // before any data moves, as `run_on` does
            let all = base.iter().zip(unit.params.iter()).map(|(p, info)| unit.gather_data(p, info));
            Some(all.collect::<Result<Vec<_>>>()?)
        }
        g => g,
    };
    let y = no_grad(|| unit.run_on(module, &base, gathered.as_deref(), |m| m.forward(x)))?;
    if !recorded {
        return Ok(y);
    }
    let kept = match &gathered {
        Some(g) => unit.keep(g)?,
        None => None,
    };
    drop(gathered); // the window closes with the forward
    let needs: Vec<bool> = inputs.iter().map(|t| t.requires_grad()).collect();
    // What the backward needs: the input and the shards (storage shared, no history), a
    // shallow copy of the module, the unit.
    let saved: Vec<DTensor<T>> = inputs.iter().map(|t| t.detach()).collect();
    let (unit, module) = (unit.clone(), module.clone());
    // Backward prefetch: this unit's backward starts the gathers of the unit whose output is
    // its input (its backward comes next), and chains itself for the unit after it.
    let (previous, start_me) = match (prefetch, &kept) {
        (true, Some(kept)) => (prefetch::previous(x), Some(kept.starter())),
        (true, None) => (prefetch::previous(x), Some(prefetch::starter(&unit, saved[1..].to_vec(), |p| Ok(p.clone())))),
        (false, _) => (None, None),
    };
    let out = record("fsdp_recompute_backward", y, &inputs, move |g| {
        let _recording = enable_grad_guard();
        prefetch::unchain(); // the forward pass is over: nothing links to what ran before it
                             // this unit's gathers, if the unit after it started them; then the unit before's
        let cached = match &kept {
            Some(kept) => Some(kept.gather()?),
            None => prefetch::prefetched::<T, T>(unit.id, &unit, &saved[1..])?,
        };
        if let Some(start) = &previous {
            start()?;
        }
        // The input and every parameter enter the recomputation through a sink that keeps the
        // gradient as it arrives and passes nothing on: the outer backward then reduces each
        // at its own leaf, with its options (reduce dtype, overlap), as the plain path does.
        let (sunk, sinks): (Vec<DTensor<T>>, Vec<Sink<T>>) =
            saved.iter().zip(&needs).map(|(t, &n)| if n { sink(t) } else { (t.clone(), None) }).unzip();
        let after = rng_state();
        set_rng_state(rng);
        let y = unit.run_on(&module, &sunk[1..], cached.as_deref(), |m| m.forward(&sunk[0]));
        drop(cached);
        set_rng_state(after);
        y?.backward_with(g)?;
        Ok(sinks.iter().map(take).collect())
    });
    if let Some(start) = start_me {
        prefetch::chain(&out, start);
    }
    Ok(out)
}
