//! Sharding strategies: how an op picks its input and output placements.
//!
//! An op lists, for one mesh dimension, the `DimRule`s it supports (input placements →
//! output placement). A full strategy picks one rule per mesh dim. When the inputs already
//! match a strategy the op runs as is (no communication); otherwise every strategy is costed
//! by the bytes its input redistributions put on the wire (`plan_redistribute(..)
//! .wire_bytes()`, the planner's rank-independent ring model, so every rank picks the same
//! one), then by the number of collectives and steps; the cheapest wins, the inputs are
//! redistributed (recorded in [`implicit_redistributions`]) and the op runs.
//!
//! The search runs once per (op, rules, input placements, shapes, dtypes, mesh): its choice,
//! with the plans of the chosen input moves, is cached (`propagate`), and a chosen
//! move is planned once, in the search, then logged and executed from that plan.

use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::placement::{fmt_placements, Placement, ReduceOp};
use crate::redistribute::{plan_redistribute, RedistributePlan};
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

/// One way an op can run along one mesh dimension (PyTorch's single-dim strategy): when each
/// input has `inputs[i]` on a mesh dim, the op's local kernel gives an output laid out `output`
/// on that dim. An op lists the rules it supports; a strategy picks one per mesh dim, and the
/// cheapest legal one is chosen (see the module docs). Every op, the library's own and a user's
/// [`CustomOp`](crate::ops::custom::CustomOp), is described by these.
///
/// ```
/// use dtensor_runtime::{DimRule, Shard};
/// // a row-wise op: shard the rows of its one input, the output is sharded the same way
/// let rule = DimRule::new(&[Shard(0)], Shard(0));
/// assert_eq!(rule.inputs, vec![Shard(0)]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DimRule {
    /// Placement each input must have on this mesh dim.
    pub inputs: Vec<Placement>,
    /// Placement of the output on this mesh dim.
    pub output: Placement,
}

impl DimRule {
    /// The rule `inputs → output` on one mesh dim.
    pub fn new(inputs: &[Placement], output: Placement) -> Self {
        DimRule { inputs: inputs.to_vec(), output }
    }
}

/// An input redistribution an op did because its inputs matched none of its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImplicitRedistribute {
    /// The op.
    pub op: &'static str,
    /// Which input of the op.
    pub input: usize,
    /// Placements before.
    pub from: Vec<Placement>,
    /// Placements the chosen strategy needed.
    pub to: Vec<Placement>,
    /// Wire bytes of the redistribution under the planner's ring model (the cost the op
    /// minimised; the same on every rank).
    pub bytes: usize,
}

/// How many implicit redistributions the log keeps (the count keeps going).
const LOG_CAP: usize = 4096;

thread_local! {
    static LOG: RefCell<(usize, Vec<ImplicitRedistribute>)> = const { RefCell::new((0, Vec::new())) };
}

/// Number of implicit input redistributions ops did on this rank so far.
pub fn implicit_redistribution_count() -> usize {
    LOG.with(|l| l.borrow().0)
}

/// The implicit redistributions recorded on this rank since the last call (clears the log;
/// the count keeps going). At most the latest 4096 are kept.
pub fn implicit_redistributions() -> Vec<ImplicitRedistribute> {
    LOG.with(|l| std::mem::take(&mut l.borrow_mut().1))
}

fn log(r: ImplicitRedistribute) {
    LOG.with(|l| {
        let mut l = l.borrow_mut();
        l.0 += 1;
        if l.1.len() >= LOG_CAP {
            l.1.remove(0);
        }
        l.1.push(r);
    })
}

/// A check of a whole strategy: (input placements per input, output placements).
pub(crate) type ValidFn<'a> = &'a dyn Fn(&[Vec<Placement>], &[Placement]) -> bool;

/// A candidate: (cost, input placements per input, output placements, plans of the moves).
type Candidate = ((usize, usize, usize, usize), Vec<Vec<Placement>>, Vec<Placement>, Vec<Option<RedistributePlan>>);

/// Extra knobs of [`select`].
#[derive(Default)]
pub(crate) struct Select<'a> {
    /// Rejects combined strategies the per-dim rules cannot express (e.g. reshape divisibility).
    pub valid: Option<ValidFn<'a>>,
    /// Among equally cheap strategies, prefer the one whose output is closest to this.
    pub prefer_output: Option<&'a [Placement]>,
    /// Only strategies that move input 0 to exactly these placements (a one-input op that
    /// keeps its input's layout, Partials it does not commute with reduced): a `valid` check
    /// written as data, so that the choice can be cached (an opaque `valid` is not cached).
    pub follow: Option<&'a [Placement]>,
}

/// The strategy chosen for an op's inputs: where each input goes, the plan of each move
/// (`None`: the input stays), and the output placements. Shared by the strategy cache.
#[derive(Debug)]
pub(crate) struct Decision {
    pub inputs: Vec<Vec<Placement>>,
    pub plans: Vec<Option<RedistributePlan>>,
    pub output: Vec<Placement>,
}

/// The inputs, redistributed to the chosen strategy, and the output placements.
pub(crate) struct Chosen<'a, T: Scalar> {
    /// Borrowed when an input needed no redistribution.
    pub inputs: Vec<Cow<'a, DTensor<T>>>,
    pub output: Vec<Placement>,
}

/// An input of a strategy search, seen without its element type: an op may read tensors of
/// several dtypes (a float table and `i64` ids), and a move's cost depends on the dtype's size.
pub(crate) trait Operand {
    /// The mesh the input lives on.
    fn mesh(&self) -> &DeviceMesh;
    /// Its placements.
    fn placements(&self) -> &[Placement];
    /// Its global shape.
    fn shape(&self) -> &[usize];
    /// Bytes of one element (a move's cost depends on it).
    fn elem_size(&self) -> usize;
    /// The plan moving it from its placements to `to`, for this rank. Its cost (wire bytes,
    /// collectives, steps) is the same on every rank: only its per-rank byte counts and
    /// logical shapes depend on the coordinate, so it is both costed and executed.
    fn plan(&self, to: &[Placement]) -> Result<RedistributePlan>;
}

impl<T: Scalar> Operand for DTensor<T> {
    fn mesh(&self) -> &DeviceMesh {
        &self.mesh
    }
    fn placements(&self) -> &[Placement] {
        &self.placements
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn elem_size(&self) -> usize {
        std::mem::size_of::<T>()
    }
    fn plan(&self, to: &[Placement]) -> Result<RedistributePlan> {
        plan_redistribute::<T>(&self.shape, &self.mesh, &self.placements, to)
    }
}

/// Placements of several tensors, for error messages.
pub(crate) fn fmt_inputs(inputs: &[&dyn Operand]) -> String {
    inputs.iter().map(|x| fmt_placements(x.placements())).collect::<Vec<_>>().join(" and ")
}

/// Checks that every input lives on the mesh (and device) of the first.
pub(crate) fn same_mesh(op: &str, inputs: &[&dyn Operand]) -> Result<()> {
    let first = inputs[0].mesh();
    for x in &inputs[1..] {
        first.check_compatible(x.mesh(), op)?;
    }
    Ok(())
}

/// Reduce ops of the Partial placements found on the inputs, restricted to `allowed`.
pub(crate) fn partial_ops<T: Scalar>(inputs: &[&DTensor<T>], allowed: &[ReduceOp]) -> Vec<ReduceOp> {
    let mut out = Vec::new();
    for x in inputs {
        for p in &x.placements {
            if let Placement::Partial(op) = p {
                if allowed.contains(op) && !out.contains(op) {
                    out.push(*op);
                }
            }
        }
    }
    out
}

/// The layout a single-input op that is not linear in its input runs on: the input's own
/// placements with every Partial whose op is not in `kept` reduced to Replicate (as PyTorch:
/// `relu(P)` all-reduces, it does not pick another layout).
pub(crate) fn reduce_partials(placements: &[Placement], kept: &[ReduceOp]) -> Vec<Placement> {
    placements
        .iter()
        .map(|p| match p {
            Placement::Partial(op) if !kept.contains(op) => Placement::Replicate,
            p => *p,
        })
        .collect()
}

/// Output placements of the strategy the inputs already match on every mesh dim (the one
/// closest to `knobs.prefer_output` when several match), if any.
fn exact_strategy(inputs: &[&dyn Operand], rules: &[DimRule], knobs: &Select<'_>) -> Option<Vec<Placement>> {
    let m = inputs[0].mesh().ndim();
    // Per mesh dim, the rules whose inputs are exactly the current placements.
    let fits: Vec<Vec<usize>> = (0..m)
        .map(|d| {
            (0..rules.len())
                .filter(|&r| inputs.iter().zip(&rules[r].inputs).all(|(x, p)| x.placements()[d] == *p))
                .collect()
        })
        .collect();
    if fits.iter().any(|f| f.is_empty()) {
        return None;
    }
    let mut best: Option<(usize, Vec<Placement>)> = None;
    let mut idx = vec![0usize; m];
    loop {
        let out: Vec<Placement> = (0..m).map(|d| rules[fits[d][idx[d]]].output).collect();
        let mut pops = out.iter().filter_map(|p| if let Placement::Partial(o) = p { Some(*o) } else { None });
        let mut ok = pops.next().is_none_or(|first| pops.all(|o| o == first));
        if let Some(f) = knobs.follow {
            ok &= inputs[0].placements() == f;
        }
        if ok {
            if let Some(v) = knobs.valid {
                let ins: Vec<Vec<Placement>> = inputs.iter().map(|x| x.placements().to_vec()).collect();
                ok = v(&ins, &out);
            }
        }
        if ok {
            let mismatch = knobs.prefer_output.map_or(0, |p| out.iter().zip(p).filter(|(a, b)| a != b).count());
            if best.as_ref().is_none_or(|(c, _)| mismatch < *c) {
                best = Some((mismatch, out));
            }
        }
        let mut d = m;
        loop {
            if d == 0 {
                return best.map(|(_, out)| out);
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < fits[d].len() {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// The cheapest strategy for `inputs` (of any element types) from `rules` (the same rules on
/// every mesh dim): the placements each input must be moved to (its own where it already
/// fits), the plans of those moves, and the output's. Uncached: see [`propagate`].
pub(super) fn strategy(
    op: &'static str,
    inputs: &[&dyn Operand],
    rules: &[DimRule],
    knobs: &Select<'_>,
) -> Result<Decision> {
    let m = inputs[0].mesh().ndim();
    let no_rule =
        |hint: &str| Error::NoShardingRule { op: op.into(), placements: fmt_inputs(inputs), hint: hint.to_string() };
    if rules.is_empty() {
        return Err(no_rule("the op has no strategy for these shapes"));
    }
    // Fast path: a strategy the inputs already satisfy moves nothing and has no steps, so it
    // beats every candidate the search below would cost (each of those has >= 1 step); take
    // it without planning anything.
    if let Some(output) = exact_strategy(inputs, rules, knobs) {
        let ins = inputs.iter().map(|x| x.placements().to_vec()).collect();
        return Ok(Decision { inputs: ins, plans: vec![None; inputs.len()], output });
    }
    // Cost of a candidate: (wire bytes, collectives then steps, steps that would communicate
    // on a larger group, output mismatches vs preference). The third term only breaks ties,
    // which arise on mesh dims of one rank, where every move is free: the choice stays the
    // one a larger mesh (and the typed rule: `Partial<Sum> + Replicate` → `Partial<Sum>`,
    // `Shard<0>` logits → a `Partial<Sum>` loss) makes.
    let mut best: Option<Candidate> = None;
    let mut idx = vec![0usize; m];
    'combos: loop {
        let ins: Vec<Vec<Placement>> =
            (0..inputs.len()).map(|j| idx.iter().map(|&r| rules[r].inputs[j]).collect()).collect();
        let out: Vec<Placement> = idx.iter().map(|&r| rules[r].output).collect();
        let mut ok = true;
        // One reduce op per output: mixed Partials have no well-defined value.
        let mut pops = out.iter().filter_map(|p| if let Placement::Partial(o) = p { Some(*o) } else { None });
        if let Some(first) = pops.next() {
            ok &= pops.all(|o| o == first);
        }
        if let Some(f) = knobs.follow {
            ok &= ins[0] == f;
        }
        if ok {
            if let Some(v) = knobs.valid {
                ok = v(&ins, &out);
            }
        }
        if ok {
            let mut cost = (0usize, 0usize, 0usize, 0usize);
            let mut plans = vec![None; inputs.len()];
            for (j, (x, want)) in inputs.iter().zip(&ins).enumerate() {
                if x.placements() == want.as_slice() {
                    continue;
                }
                match x.plan(want) {
                    Ok(plan) => {
                        cost.0 += plan.wire_bytes();
                        cost.1 += plan.num_collectives() * 1000 + plan.steps.len().max(1);
                        cost.2 += plan.steps.iter().filter(|s| s.communicates_on_a_larger_group()).count();
                        plans[j] = Some(plan);
                    }
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            if let Some(pref) = knobs.prefer_output {
                cost.3 = out.iter().zip(pref).filter(|(a, b)| a != b).count();
            }
            if ok && best.as_ref().is_none_or(|(c, ..)| cost < *c) {
                best = Some((cost, ins, out, plans));
            }
        }
        // Next combination (odometer over mesh dims).
        for d in (0..m).rev() {
            idx[d] += 1;
            if idx[d] < rules.len() {
                continue 'combos;
            }
            idx[d] = 0;
        }
        break;
    }
    let Some((_, ins, output, plans)) = best else {
        return Err(no_rule("no strategy is reachable from these placements (Shard→Partial is not allowed)"));
    };
    Ok(Decision { inputs: ins, plans, output })
}

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
    /// One round per 8 bytes: `Hash for [u64]` hands the whole key over as bytes, and a round
    /// per byte made the lookup cost more than the search it saves (issue 32's dispatch bench).
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.write_u64(u64::from_le_bytes(w.try_into().expect("chunks_exact(8)")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 59));
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

/// The strategy for `inputs` under `rules` (see [`strategy`]), from this thread's
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

/// Input `j` of `op` moved to `want` by `plan` (made once, in the strategy search; recorded
/// on the autograd tape for floats, and in the implicit-redistribution log), or borrowed when
/// it stays. The one path of an implicit input move: the ops that move an input by hand
/// (dropout reducing a `Partial`, ops unsharding a dim) call it with `plan: None`.
pub(crate) fn moved<'a, T: Scalar>(
    op: &'static str,
    j: usize,
    x: &'a DTensor<T>,
    want: &[Placement],
    plan: Option<&RedistributePlan>,
) -> Result<Cow<'a, DTensor<T>>> {
    if x.placements == want {
        return Ok(Cow::Borrowed(x));
    }
    let planned;
    let plan = match plan {
        Some(p) => p,
        None => {
            planned = Operand::plan(x, want)?;
            &planned
        }
    };
    super::implicit::check(op, j, &x.mesh, &x.placements, want, plan)?;
    log(ImplicitRedistribute { op, input: j, from: x.placements.clone(), to: want.to_vec(), bytes: plan.wire_bytes() });
    let out = x.redistribute_planned(plan, op)?;
    Ok(Cow::Owned(crate::autograd::recorded_redistribution(x, out)))
}

/// Picks the cheapest strategy for `inputs` from `rules` (the same rules on every mesh dim;
/// cached, see [`propagate`]) and redistributes the inputs to it. Collectives are
/// attributed to `op`.
pub(crate) fn select<'a, T: Scalar>(
    op: &'static str,
    inputs: &[&'a DTensor<T>],
    rules: &[DimRule],
    knobs: Select<'_>,
) -> Result<Chosen<'a, T>> {
    let dyns: Vec<&dyn Operand> = inputs.iter().map(|&x| x as &dyn Operand).collect();
    let d = propagate(op, &dyns, rules, &knobs)?;
    let inputs = inputs
        .iter()
        .enumerate()
        .map(|(j, x)| moved(op, j, x, &d.inputs[j], d.plans[j].as_ref()))
        .collect::<Result<_>>()?;
    Ok(Chosen { inputs, output: d.output.clone() })
}

/// The two inputs of [`select_pair`], each moved in its own type, and the output placements.
pub(crate) type ChosenPair<'a, T, U> = (Cow<'a, DTensor<T>>, Cow<'a, DTensor<U>>, Vec<Placement>);

/// [`select`] for an op of a tensor `x` (input 0) and a tensor of another element type
/// (input 1: the `i64` ids of an indexing op), each moved in its own type.
pub(crate) fn select_pair<'a, T: Scalar, U: Scalar>(
    op: &'static str,
    x: &'a DTensor<T>,
    y: &'a DTensor<U>,
    rules: &[DimRule],
    knobs: Select<'_>,
) -> Result<ChosenPair<'a, T, U>> {
    let d: Rc<Decision> = propagate(op, &[x, y], rules, &knobs)?;
    if d.inputs.len() != 2 {
        return Err(Error::NoShardingRule {
            op: op.into(),
            placements: fmt_inputs(&[x, y]),
            hint: "the strategy search lost an input".into(),
        });
    }
    let wx = moved(op, 0, x, &d.inputs[0], d.plans[0].as_ref())?;
    let wy = moved(op, 1, y, &d.inputs[1], d.plans[1].as_ref())?;
    Ok((wx, wy, d.output.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{distribute_tensor, run};

    #[test]
    fn unreachable_strategy_is_a_no_sharding_rule_error() {
        let out = run(2, |ctx| {
            let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
            let x = distribute_tensor(ndarray::ArrayD::<f32>::ones(vec![4]), &mesh, &[Placement::Shard(0)], None)?;
            // A rule set that only accepts Partial(avg): Shard → Partial(avg) is not a
            // redistribution (only Shard → Partial(sum) is, as in PyTorch 2.15).
            let avg = Placement::Partial(crate::placement::ReduceOp::Avg);
            let rules = [DimRule::new(&[avg], avg)];
            Ok(select("only_partial", &[&x], &rules, Select::default()).err())
        })
        .unwrap();
        match &out[0] {
            Some(Error::NoShardingRule { op, placements, .. }) => {
                assert_eq!(op, "only_partial");
                assert_eq!(placements, "(S(0))");
            }
            other => panic!("{other:?}"),
        }
    }

    /// The cache key is hashed a word at a time: hashing a `[u64]` (which `Hash` hands over
    /// as bytes) equals its length and then each word through `write_u64`; a tail shorter than
    /// a word still changes the hash.
    #[test]
    fn word_hasher_takes_a_key_a_word_at_a_time() {
        use std::hash::Hash;
        let key: Vec<u64> = vec![7, u64::MAX, 1 << 62, 0, 42];
        let mut sliced = WordHasher::default();
        key.as_slice().hash(&mut sliced);
        let mut by_word = WordHasher::default();
        by_word.write_usize(key.len());
        for &w in &key {
            by_word.write_u64(w);
        }
        assert_eq!(sliced.finish(), by_word.finish());
        let (mut a, mut b) = (WordHasher::default(), WordHasher::default());
        a.write(&[1, 2, 3]);
        b.write(&[1, 2, 4]);
        assert_ne!(a.finish(), b.finish());
        let (mut a, mut b) = (WordHasher::default(), WordHasher::default());
        a.write(&[1, 2, 3]);
        b.write(&[1, 2, 3, 0]);
        assert_ne!(a.finish(), b.finish(), "a zero byte more is another key");
    }

    use crate::placement::Placement::{Partial, Replicate, Shard};

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
