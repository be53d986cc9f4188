//! The op dispatcher: the one path every op of the table below takes from its inputs to its
//! recorded output.
//!
//! An op describes itself with an [`OpDef`]: its name, its per-mesh-dim sharding rules
//! ([`DimRule`]s, with the [`Select`] knobs), the global shape of its output, a kernel over
//! the local [`Storage`] of its (redistributed) inputs, and optionally its backward (a name
//! and a factory that saves what the gradient needs). [`dispatch`] then
//!
//! 1. selects the strategy (`strategy::propagate`): the choice is cached per op name, rules, input
//!    placements, shapes and dtypes, and mesh shape and coordinate, like PyTorch's
//!    `ShardingPropagator` cache (bounded, least recently used evicted, per thread: one rank
//!    of the thread backend, or an MPI process), and the plan of every chosen input move is
//!    made once, in the search, then logged and executed from the cache;
//! 2. redistributes the inputs that need it (`strategy::select`: implicit-redistribution
//!    scopes, the implicit-redistribution log, collectives attributed to the op);
//! 3. runs the kernel on the local shards;
//! 4. wraps the output `DTensor` and records it on the autograd tape.
//!
//! Ported: the element-wise ops (`pointwise::binary`/`unary`, so every op of `pointwise` and
//! `math`), the reductions, softmax, matmul and the norms. The other ops call
//! `strategy::select` (cached and planned once too) and build their output by hand: see
//! docs/ARCHITECTURE.md.

use super::new_output;
use super::strategy::{select, DimRule, Select};
use crate::autograd::record;
use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::Result;
use crate::storage::Storage;

/// What an op's backward gets: its inputs as the kernel saw them (redistributed) and its
/// output, both with history; it returns the gradient function the tape stores.
pub(crate) type Saved<'a, T> = (&'a [&'a DTensor<T>], &'a DTensor<T>);

/// An op, described for [`dispatch`].
pub(crate) struct OpDef<'a, K, B> {
    /// The op's name (errors, the implicit-redistribution log, `CommDebugMode`).
    pub name: &'static str,
    /// Its rules on one mesh dim.
    pub rules: Vec<DimRule>,
    /// Extra knobs of the strategy search.
    pub knobs: Select<'a>,
    /// Global shape of the output.
    pub out_shape: Vec<usize>,
    /// The kernel: the local shards of the redistributed inputs → the local output.
    pub kernel: K,
    /// The backward: its tape name and the factory of its gradient function (called only
    /// when the op is recorded).
    pub backward: Option<(&'static str, B)>,
}

/// A gradient function: the output's gradient → one gradient per input.
pub(crate) trait GradFn<T: Scalar>:
    Fn(&DTensor<T>) -> Result<Vec<Option<DTensor<T>>>> + Send + Sync + 'static
{
}
impl<T: Scalar, F: Fn(&DTensor<T>) -> Result<Vec<Option<DTensor<T>>>> + Send + Sync + 'static> GradFn<T> for F {}

/// The gradient function type of an op without a backward.
pub(crate) type NoGrad<T> = fn(&DTensor<T>) -> Result<Vec<Option<DTensor<T>>>>;

/// The backward factory of an op without a backward (never called).
pub(crate) type NoBackward<T> = fn(Saved<'_, T>) -> NoGrad<T>;

/// The `backward` of an op that records none (masks: no gradient).
pub(crate) fn no_backward<T: Scalar>() -> Option<(&'static str, NoBackward<T>)> {
    None
}

/// Runs `def` on `inputs`: strategy (cached), input redistribution (planned once), kernel,
/// output, autograd record.
pub(crate) fn dispatch<T, K, B, G>(def: OpDef<'_, K, B>, inputs: &[&DTensor<T>]) -> Result<DTensor<T>>
where
    T: Scalar,
    K: FnOnce(&[&Storage<T>]) -> Result<Storage<T>>,
    B: FnOnce(Saved<'_, T>) -> G,
    G: GradFn<T>,
{
    let c = select(def.name, inputs, &def.rules, def.knobs)?;
    let ins: Vec<&DTensor<T>> = c.inputs.iter().map(|x| &**x).collect();
    let locals: Vec<&Storage<T>> = ins.iter().map(|x| &*x.local).collect();
    let local = (def.kernel)(&locals)?;
    let out = new_output(local, &ins[0].mesh, c.output, def.out_shape);
    match def.backward {
        Some((name, factory)) if crate::autograd::recording(&ins) => {
            let grad = factory((&ins, &out));
            Ok(record(name, out, &ins, grad))
        }
        _ => Ok(out),
    }
}
