//! The op dispatcher: the one path every op of the table below takes from its inputs to its
//! recorded output.
//!
//! An op describes itself with an [`OpDef`]: its name, its per-mesh-dim sharding rules
//! ([`DimRule`]s, with the [`Select`] knobs), the global shape of its output, a kernel over
//! the local [`Storage`] of its (redistributed) inputs, and optionally its backward (a name
//! and a factory that saves what the gradient needs). [`dispatch`] then
//!
//! 1. selects the strategy ([`propagate`]): the choice is cached per op name, rules, input
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
use super::strategy::{same_mesh, select, strategy, Decision, DimRule, Operand, Select};
use crate::autograd::record;
use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::Result;
use crate::placement::{Placement, ReduceOp};
use crate::storage::Storage;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

/// How many strategy choices a thread keeps.
const CACHE_CAP: usize = 1024;

/// A small multiplicative hasher (the key is already a handful of `u64`s; SipHash would cost
/// more than the strategy search it skips on small ops).
#[derive(Default)]
struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, w: usize) {
        self.write_u64(w as u64);
    }
}

struct Cache {
    /// Key words → (choice, last use).
    map: HashMap<Vec<u64>, (Rc<Decision>, u64), BuildHasherDefault<WordHasher>>,
    clock: u64,
    /// The key of the current lookup (reused: a hit allocates nothing).
    key: Vec<u64>,
}

thread_local! {
    static CACHE: RefCell<Cache> =
        RefCell::new(Cache { map: HashMap::default(), clock: 0, key: Vec::new() });
}

fn placement_word(p: Placement) -> u64 {
    match p {
        Placement::Replicate => 0,
        Placement::Shard(d) => (1 << 62) | (d as i64 as u64 & 0xffff_ffff),
        Placement::Partial(op) => {
            (2 << 62)
                | match op {
                    ReduceOp::Sum => 0,
                    ReduceOp::Avg => 1,
                    ReduceOp::Min => 2,
                    ReduceOp::Max => 3,
                    ReduceOp::Product => 4,
                }
        }
    }
}

/// Writes the cache key of a search into `key`: every input of [`strategy`] that its result
/// depends on, each list preceded by its length so that the words parse one way.
fn write_key(key: &mut Vec<u64>, op: &'static str, inputs: &[&dyn Operand], rules: &[DimRule], knobs: &Select<'_>) {
    key.clear();
    // The name by address and length: equal (address, length) is the same text; the same
    // text at two addresses only costs a miss.
    key.extend([op.as_ptr() as u64, op.len() as u64, inputs.len() as u64]);
    let mesh = inputs[0].mesh();
    key.push(mesh.ndim() as u64);
    key.extend(mesh.shape().iter().map(|&s| s as u64));
    key.extend(mesh.coordinate().iter().map(|&c| c as u64));
    for x in inputs {
        key.push(x.elem_size() as u64);
        key.push(x.shape().len() as u64);
        key.extend(x.shape().iter().map(|&s| s as u64));
        key.extend(x.placements().iter().map(|&p| placement_word(p)));
    }
    key.push(rules.len() as u64);
    for r in rules {
        key.extend(r.inputs.iter().map(|&p| placement_word(p)));
        key.push(placement_word(r.output));
    }
    for knob in [knobs.prefer_output, knobs.follow] {
        match knob {
            None => key.push(u64::MAX),
            Some(ps) => {
                key.push(ps.len() as u64);
                key.extend(ps.iter().map(|&p| placement_word(p)));
            }
        }
    }
}

/// The strategy for `inputs` under `rules` (see `strategy::strategy`), from this thread's
/// cache when the same op met the same layouts before. Choices made under an opaque
/// `knobs.valid` check are not cached (the key cannot see what it reads); errors are not
/// cached.
pub(crate) fn propagate(
    op: &'static str,
    inputs: &[&dyn Operand],
    rules: &[DimRule],
    knobs: &Select<'_>,
) -> Result<Rc<Decision>> {
    same_mesh(op, inputs)?;
    if knobs.valid.is_some() {
        return strategy(op, inputs, rules, knobs).map(Rc::new);
    }
    let hit = CACHE.with(|c| {
        let c = &mut *c.borrow_mut();
        write_key(&mut c.key, op, inputs, rules, knobs);
        c.clock += 1;
        let now = c.clock;
        c.map.get_mut(c.key.as_slice()).map(|(d, used)| {
            *used = now;
            d.clone()
        })
    });
    if let Some(d) = hit {
        return Ok(d);
    }
    let d = Rc::new(strategy(op, inputs, rules, knobs)?);
    CACHE.with(|c| {
        let c = &mut *c.borrow_mut();
        if c.map.len() >= CACHE_CAP {
            if let Some(oldest) = c.map.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone()) {
                c.map.remove(&oldest);
            }
        }
        // The key buffer still holds this search's key (nothing ran a lookup since).
        let key = c.key.clone();
        let now = c.clock;
        c.map.insert(key, (d.clone(), now));
    });
    Ok(d)
}

/// Number of strategy choices this thread's cache holds (for tests).
#[cfg(test)]
pub(crate) fn cached_choices() -> usize {
    CACHE.with(|c| c.borrow().map.len())
}

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

/// The `backward` of an op that records none (masks: no gradient).
pub(crate) fn no_backward<T: Scalar>() -> Option<(&'static str, fn(Saved<'_, T>) -> NoGrad<T>)> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Placement::{Partial, Replicate, Shard};
    use crate::{distribute_tensor, run};

    /// Issue 32, item 3: the second time an op meets the same layouts it takes the cached
    /// choice (no new entry), and a cached implicit redistribution is still executed, logged
    /// and counted each time.
    #[test]
    fn choice_is_cached_and_a_cached_move_still_runs_and_is_logged() {
        let out = run(2, |ctx| {
            let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
            let g = ndarray::ArrayD::from_shape_fn(vec![4, 6], |ix| (ix[0] * 6 + ix[1]) as f32);
            let a = distribute_tensor(g.clone(), &mesh, &[Shard(0)], None)?;
            let b = distribute_tensor(g.clone(), &mesh, &[Shard(1)], None)?;
            let before = cached_choices();
            let n0 = crate::ops::implicit_redistribution_count();
            let first = a.add(&b)?.full_tensor()?;
            let after_first = cached_choices();
            let second = a.add(&b)?.full_tensor()?;
            let n = crate::ops::implicit_redistribution_count() - n0;
            Ok((after_first - before, cached_choices() - after_first, n, first == second, first == &g + &g))
        })
        .unwrap();
        for (new_first, new_second, moves, same, right) in out {
            assert!(new_first >= 1, "the first add caches its choice");
            assert_eq!(new_second, 0, "the second add hits the cache");
            assert_eq!(moves, 2, "each add moves one input, cached or not");
            assert!(same && right);
        }
    }

    /// Keys differ when anything the search reads differs (here the input placements and the
    /// Partial reduce op), so a cached choice never answers another layout.
    #[test]
    fn keys_tell_layouts_apart() {
        let out = run(2, |ctx| {
            let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
            let x = distribute_tensor(ndarray::ArrayD::<f32>::ones(vec![4]), &mesh, &[Replicate], None)?;
            let p = x.redistribute(&[Partial(ReduceOp::Sum)])?;
            let q = x.redistribute(&[Partial(ReduceOp::Max)])?;
            let rules = [DimRule::new(&[Replicate], Replicate)];
            let mut keys = Vec::new();
            for t in [&x, &p, &q] {
                let mut k = Vec::new();
                write_key(&mut k, "op", &[t as &dyn Operand], &rules, &Select::default());
                keys.push(k);
            }
            Ok(keys[0] != keys[1] && keys[1] != keys[2] && keys[0] != keys[2])
        })
        .unwrap();
        assert!(out.iter().all(|&d| d));
    }
}
