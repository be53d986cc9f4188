//! Issue 33, finding 1, as a class: token, class and index ids never pass through a float.
//!
//! Ids used to be converted to the data's element type, so a bf16 table refused every odd id
//! above 256 (f16 above 2048, f32 above 2^24) and a bf16 `argmax` over more than 256 classes
//! returned a rounded index. Now every op reads ids as `i64` and `argmax`/`argmin` return
//! `i64`. This file tries the class systematically: for each table / data dtype (f32, f64,
//! bf16, f16) and each id dtype (i64, i32, f64, and the data's own float type, with the ids
//! that type holds exactly), ids at and past every float's exactness limit (255..257,
//! 2047..2049, 2^24 - 1..2^24 + 1, vocab - 1 of a large vocabulary) go through `embedding`
//! (forward and the table's gradient), `one_hot`, `cross_entropy` (loss and the logits'
//! gradient, batch-sharded and class-sharded loss-parallel), `index_select` and `gather`
//! (forward and gradient), and `argmax`/`argmin` over more than 256 classes, each on one rank
//! and on 2-rank meshes (vocab-parallel tables, sharded ids), against a plain ndarray
//! reference computed here. Then the errors: a float id that is not a whole number (or NaN,
//! infinite, past i64) is an `InvalidArgument` naming the op; a negative id or one past the
//! indexed dim is an `InvalidArgument` for every id dtype.

use dtensor_runtime::module::{parallelize_module, ColwiseParallel, Embedding, ParallelStyle, RowwiseParallel};
use dtensor_runtime::ndarray::{ArrayD, Axis, IxDyn};
use dtensor_runtime::{
    bf16, distribute_tensor, f16, run, DTensor, DType, DeviceMesh, Element, Error, IndexElement, Placement, Replicate,
    Result, Scalar, Shard,
};
use std::cell::Cell;

thread_local! {
    /// Cases checked by the test running on this thread (each test prints its own).
    static CASES: Cell<usize> = const { Cell::new(0) };
}

fn count(n: usize) {
    CASES.with(|c| c.set(c.get() + n));
}

/// Cases counted on this thread so far.
fn cases() -> usize {
    CASES.with(Cell::get)
}

/// A large vocabulary: past every 16-bit float's integers (f16's largest finite is 65504).
const VOCAB: usize = 70_000;

/// Ids at and past the exactness limits of bf16 (256), f16 (2048), and the last id of
/// [`VOCAB`], with repeats.
fn ids_large_vocab() -> Vec<i64> {
    vec![257, 0, 255, 256, 2049, 2047, 2048, 4097, 257, 65_505, 69_999, 1, 32_769, 2049]
}

/// Ids below 2100 (a class count past f16's 2048), at and past the 16-bit limits.
fn ids_small() -> Vec<i64> {
    vec![257, 2049, 255, 0, 2047, 256, 2048, 1025, 257, 2099, 511, 3]
}

/// A table / input value that every float type holds exactly; neighbouring rows differ, so a
/// rounded id reads a visibly wrong row.
fn val(r: usize, c: usize) -> f64 {
    ((r * 31 + c * 17) % 97) as f64 - 48.0
}

/// A weight on an output element (small integers: every sum below is exact in every type).
fn weight(k: usize, c: usize) -> f64 {
    ((k * 5 + c * 3) % 4) as f64 + 1.0
}

/// Whether the id type holds `v` exactly (the float types hold every integer only up to their
/// limit; a test with ids of such a type uses only the ids it holds).
fn holds<I: Scalar>(v: i64) -> bool {
    I::of_i64(v).as_i64() == v && I::of_i64(v).as_f64() == v as f64
}

/// The ids of `v` that `I` holds, as an array of `I`.
fn id_array<I: Scalar>(v: &[i64]) -> (Vec<i64>, ArrayD<I>) {
    let kept: Vec<i64> = v.iter().copied().filter(|&x| holds::<I>(x)).collect();
    let a = ArrayD::from_shape_vec(IxDyn(&[kept.len()]), kept.iter().map(|&x| I::of_i64(x)).collect()).unwrap();
    (kept, a)
}

/// The tolerance of computed (not moved) results of `T` relative to an f64 reference.
fn tol<T: Element>() -> f64 {
    match T::DTYPE {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 => 8e-3,
        _ => 4e-2,
    }
}

fn to_f64<T: Scalar>(a: &ArrayD<T>) -> ArrayD<f64> {
    a.mapv(|x| x.as_f64())
}

/// Runs `f` on a 1-D mesh of `world` ranks; every rank's result.
fn on_mesh<R: Send>(world: usize, f: impl Fn(&DeviceMesh) -> Result<R> + Sync) -> Vec<R> {
    run(world, |ctx| {
        let m = ctx.init_device_mesh(&[world], &["x"])?;
        f(&m)
    })
    .unwrap()
}

/// (world, placement of the table / data, placement of the ids) of the layouts tried.
type Layout = (usize, Placement, Placement);

// ------------------------------------------------------------------ embedding

/// `table[ids]` and the table's gradient of `sum(out * w)`, on one rank, vocab-parallel
/// (table `Shard(0)`), with sharded ids, and with a dim-sharded table, against the rows the
/// ids name.
fn embedding_case<T: Element, I: IndexElement>(vocab: usize, ids: &[i64]) {
    let (ids, ia) = id_array::<I>(ids);
    let table = ArrayD::from_shape_fn(IxDyn(&[vocab, 2]), |ix| T::of_f64(val(ix[0], ix[1])));
    let w = ArrayD::from_shape_fn(IxDyn(&[ids.len(), 2]), |ix| T::of_f64(weight(ix[0], ix[1])));
    let mut want = ArrayD::<f64>::zeros(IxDyn(&[ids.len(), 2]));
    let mut want_g = ArrayD::<f64>::zeros(IxDyn(&[vocab, 2]));
    for (k, &id) in ids.iter().enumerate() {
        for c in 0..2 {
            want[[k, c]] = val(id as usize, c);
            want_g[[id as usize, c]] += weight(k, c);
        }
    }
    let layouts: [Layout; 4] =
        [(1, Replicate, Replicate), (2, Shard(0), Replicate), (2, Replicate, Shard(0)), (2, Shard(1), Replicate)];
    for (world, tp, ip) in layouts {
        let outs = on_mesh(world, |m| {
            let t = distribute_tensor(&table, m, &[tp], None)?.requires_grad_(true);
            let i = distribute_tensor(&ia, m, &[ip], None)?;
            let y = t.embedding(&i)?;
            y.mul(&distribute_tensor(&w, m, &[Replicate], None)?)?.sum()?.backward()?;
            Ok((y.full_tensor()?, t.grad().unwrap().full_tensor()?))
        });
        for (y, g) in outs {
            let what = format!("embedding {} table {tp:?} ids {} {ip:?} on {world}", T::DTYPE, I::DTYPE);
            assert_eq!(to_f64(&y), want, "{what}: forward");
            assert_eq!(to_f64(&g), want_g, "{what}: table gradient");
        }
        count(2);
    }
}

/// Issue 33's own case: a bf16 table serves every odd id above 256 (which bf16 cannot hold),
/// forward and gradient, on one rank and vocab-parallel over 2 ranks, with i64 and i32 ids.
#[test]
fn issue_33_bf16_table_every_odd_id_above_256() {
    let ids: Vec<i64> = (257..VOCAB as i64).step_by(2).collect();
    embedding_case::<bf16, i64>(VOCAB, &ids);
    embedding_case::<bf16, i32>(VOCAB, &ids);
    // And as class targets of a bf16 loss over 3000 classes: every odd class above 256.
    let targets: Vec<i64> = (257..3000).step_by(2).collect();
    cross_entropy_case::<bf16, i64>(3000, &targets);
    println!("issue 33: {} odd ids above 256 through a bf16 embedding and loss", ids.len() + targets.len());
}

macro_rules! per_id_type {
    ($f:ident, $t:ty, $($arg:expr),*) => {{
        $f::<$t, i64>($($arg),*);
        $f::<$t, i32>($($arg),*);
        $f::<$t, f64>($($arg),*);
        $f::<$t, $t>($($arg),*);
    }};
}

macro_rules! per_table_and_id_type {
    ($f:ident, $($arg:expr),*) => {{
        per_id_type!($f, f32, $($arg),*);
        per_id_type!($f, f64, $($arg),*);
        per_id_type!($f, bf16, $($arg),*);
        per_id_type!($f, f16, $($arg),*);
    }};
}

#[test]
fn embedding_reads_every_id_of_a_large_vocabulary() {
    let before = cases();
    per_table_and_id_type!(embedding_case, VOCAB, &ids_large_vocab());
    println!("{} embedding cases (4 table x 4 id dtypes, 4 layouts, forward + gradient)", cases() - before);
}

/// The f32 limit: ids 2^24 - 1 ..= 2^24 + 1 of a vocabulary of 2^24 + 2 (a one-column table),
/// on one rank and vocab-parallel, forward and gradient, for every table and integer / f64 id
/// type (no f32, bf16 or f16 id holds 2^24 + 1).
#[test]
fn embedding_past_f32_integers() {
    let vocab = (1usize << 24) + 2;
    let ids: Vec<i64> = vec![(1 << 24) + 1, (1 << 24) - 1, 1 << 24, (1 << 24) + 1, 257, 2049];
    let n = huge_case::<f32>(vocab, &ids) + huge_case::<f64>(vocab, &ids) + huge_case::<bf16>(vocab, &ids);
    let n = n + huge_case::<f16>(vocab, &ids);
    println!("{n} embedding cases past 2^24 (4 table dtypes x i64/i32/f64 ids, 1 and 2 ranks)");
}

fn huge_case<T: Element>(vocab: usize, ids: &[i64]) -> usize {
    let table = ArrayD::from_shape_fn(IxDyn(&[vocab, 1]), |ix| T::of_f64(val(ix[0], 0)));
    huge_ids::<T, i64>(&table, ids) + huge_ids::<T, i32>(&table, ids) + huge_ids::<T, f64>(&table, ids)
}

fn huge_ids<T: Element, I: IndexElement>(table: &ArrayD<T>, ids: &[i64]) -> usize {
    let (ids, ia) = id_array::<I>(ids);
    assert!(ids.contains(&((1 << 24) + 1)), "{} holds 2^24 + 1", I::DTYPE);
    let mut cases = 0;
    for (world, tp) in [(1, Replicate), (2, Shard(0))] {
        let outs = on_mesh(world, |m| {
            let t = distribute_tensor(table, m, &[tp], None)?.requires_grad_(true);
            let i = distribute_tensor(&ia, m, &[Replicate], None)?;
            let y = t.embedding(&i)?;
            y.sum()?.backward()?;
            let g = t.grad().unwrap().full_tensor()?;
            // The gradient at the ids only: the whole table's gradient is 2^24 rows.
            let at: Vec<f64> = ids.iter().map(|&id| g[[id as usize, 0]].as_f64()).collect();
            Ok((y.full_tensor()?, at, g.iter().map(|x| x.as_f64()).sum::<f64>()))
        });
        for (y, at, total) in outs {
            let what = format!("embedding {} vocab {} ids {} on {world}", T::DTYPE, table.shape()[0], I::DTYPE);
            for (k, &id) in ids.iter().enumerate() {
                assert_eq!(y[[k, 0]].as_f64(), val(id as usize, 0), "{what}: id {id}");
                let n = ids.iter().filter(|&&j| j == id).count() as f64;
                assert_eq!(at[k], n, "{what}: gradient of row {id}");
            }
            assert_eq!(total, ids.len() as f64, "{what}: gradient elsewhere");
        }
        cases += 1;
    }
    count(cases);
    cases
}

/// The `Embedding` module takes integer ids for every table type (`forward_ids`; its `Forward`
/// impl reads ids held in the table's type): a bf16 module at ids past 256 and 2048, on one
/// rank and vocab-parallel (`RowwiseParallel`) or dim-parallel (`ColwiseParallel`) over 2 ranks,
/// against the rows of its weight.
#[test]
fn embedding_module_takes_integer_ids() {
    let (ids, ia) = id_array::<i64>(&ids_large_vocab());
    for world in [1, 2] {
        let outs = on_mesh(world, |m| {
            let (row, col) = (RowwiseParallel::new(), ColwiseParallel::new());
            let mut out = Vec::new();
            for style in [&row as &dyn ParallelStyle, &col] {
                let emb = Embedding::<bf16>::new(VOCAB, 2)?;
                let w = emb.weight.to_host()?;
                let emb = parallelize_module(emb, m, &[("", style)])?;
                let y = emb.forward_ids(&distribute_tensor(&ia, m, &[Replicate], None)?)?.full_tensor()?;
                out.push((w, y));
            }
            Ok(out)
        });
        for (w, y) in outs.into_iter().flatten() {
            let want = ArrayD::from_shape_fn(IxDyn(&[ids.len(), 2]), |ix| w[[ids[ix[0]] as usize, ix[1]]]);
            assert_eq!(y, want, "Embedding<bf16>::forward_ids on {world}");
            count(1);
        }
    }
    println!("{} Embedding module cases (bf16, i64 ids, row- and column-parallel)", cases());
}

// ------------------------------------------------------------------ one_hot

fn one_hot_case<T: Element, I: IndexElement>(classes: usize, ids: &[i64]) {
    let (ids, ia) = id_array::<I>(ids);
    let want = ArrayD::from_shape_fn(IxDyn(&[ids.len(), classes]), |ix| f64::from(ids[ix[0]] == ix[1] as i64));
    for (world, ip) in [(1, Replicate), (2, Replicate), (2, Shard(0))] {
        let outs = on_mesh(world, |m| distribute_tensor(&ia, m, &[ip], None)?.one_hot::<T>(classes)?.full_tensor());
        for y in outs {
            assert_eq!(to_f64(&y), want, "one_hot into {} of {} ids {ip:?} on {world}", T::DTYPE, I::DTYPE);
        }
        count(1);
    }
}

#[test]
fn one_hot_puts_every_id_in_its_own_class() {
    let before = cases();
    per_table_and_id_type!(one_hot_case, 2100, &ids_small());
    println!("{} one_hot cases (4 output x 4 id dtypes, 3 layouts)", cases() - before);
}

// ------------------------------------------------------------------ cross_entropy

/// A logit every float type holds exactly.
fn logit(k: usize, c: usize) -> f64 {
    ((k * 7 + c * 3) % 11) as f64 * 0.25
}

/// Mean cross-entropy against `targets` and the logits' gradient, in f64, from the logits.
fn cross_entropy_ref(x: &ArrayD<f64>, t: &[i64]) -> (f64, ArrayD<f64>) {
    let n = t.len() as f64;
    let mut loss = 0.0;
    let mut g = ArrayD::<f64>::zeros(x.raw_dim());
    for (k, row) in x.axis_iter(Axis(0)).enumerate() {
        let m = row.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        let z: f64 = row.iter().map(|v| (v - m).exp()).sum();
        loss += m + z.ln() - row[t[k] as usize];
        for (c, v) in row.iter().enumerate() {
            g[[k, c]] = ((v - m).exp() / z - f64::from(c as i64 == t[k])) / n;
        }
    }
    (loss / n, g)
}

/// Loss and logits' gradient on one rank, batch-sharded (logits and targets `Shard(0)`) and
/// class-sharded (loss-parallel: logits `Shard(1)`, targets replicated), against the
/// reference; the gradient's one negative entry per row is the target's class, exactly.
fn cross_entropy_case<T: Element, I: IndexElement>(classes: usize, targets: &[i64]) {
    let (t, ta) = id_array::<I>(targets);
    let x = ArrayD::from_shape_fn(IxDyn(&[t.len(), classes]), |ix| T::of_f64(logit(ix[0], ix[1])));
    let (want, want_g) = cross_entropy_ref(&to_f64(&x), &t);
    let layouts: [Layout; 3] = [(1, Replicate, Replicate), (2, Shard(0), Shard(0)), (2, Shard(1), Replicate)];
    for (world, xp, tp) in layouts {
        let outs = on_mesh(world, |m| {
            let logits = distribute_tensor(&x, m, &[xp], None)?.requires_grad_(true);
            let loss = logits.cross_entropy(&distribute_tensor(&ta, m, &[tp], None)?)?;
            loss.backward()?;
            Ok((loss.full_tensor()?, logits.grad().unwrap().full_tensor()?))
        });
        for (loss, g) in outs {
            let what = format!("cross_entropy {} logits {xp:?} targets {} {tp:?} on {world}", T::DTYPE, I::DTYPE);
            let l = loss.iter().next().unwrap().as_f64();
            assert!((l - want).abs() <= tol::<T>() * want.abs(), "{what}: loss {l} vs {want}");
            let n = t.len() as f64;
            for (k, row) in g.axis_iter(Axis(0)).enumerate() {
                let neg: Vec<usize> = (0..classes).filter(|&c| row[c].as_f64() < 0.0).collect();
                assert_eq!(neg, vec![t[k] as usize], "{what}: row {k}'s target class");
                for c in 0..classes {
                    let (got, w) = (row[c].as_f64(), want_g[[k, c]]);
                    assert!(
                        (got - w).abs() <= tol::<T>() * (w.abs() + 1e-3 / n),
                        "{what}: grad [{k}, {c}] {got} vs {w}"
                    );
                }
            }
        }
        count(2);
    }
}

#[test]
fn cross_entropy_scores_every_target_class() {
    let before = cases();
    per_table_and_id_type!(cross_entropy_case, 2100, &ids_small());
    println!(
        "{} cross_entropy cases (4 logit x 4 target dtypes, 1 rank, batch-sharded, loss-parallel; loss + gradient)",
        cases() - before
    );
}

// ------------------------------------------------------------------ index_select, gather

/// `x.index_select(0, ids)` of a `[n, 2]` input and its gradient, on one rank, with sharded
/// ids (the output sharded on the indexed dim) and with the input sharded on the other dim.
fn index_select_case<T: Element, I: IndexElement>(n: usize, ids: &[i64]) {
    let (ids, ia) = id_array::<I>(ids);
    let x = ArrayD::from_shape_fn(IxDyn(&[n, 2]), |ix| T::of_f64(val(ix[0], ix[1])));
    let w = ArrayD::from_shape_fn(IxDyn(&[ids.len(), 2]), |ix| T::of_f64(weight(ix[0], ix[1])));
    let want = ArrayD::from_shape_fn(IxDyn(&[ids.len(), 2]), |ix| val(ids[ix[0]] as usize, ix[1]));
    let mut want_g = ArrayD::<f64>::zeros(IxDyn(&[n, 2]));
    for (k, &id) in ids.iter().enumerate() {
        for c in 0..2 {
            want_g[[id as usize, c]] += weight(k, c);
        }
    }
    let layouts: [Layout; 3] = [(1, Replicate, Replicate), (2, Replicate, Shard(0)), (2, Shard(1), Replicate)];
    for (world, xp, ip) in layouts {
        let outs = on_mesh(world, |m| {
            let xt = distribute_tensor(&x, m, &[xp], None)?.requires_grad_(true);
            let y = xt.index_select(0, &distribute_tensor(&ia, m, &[ip], None)?)?;
            y.mul(&distribute_tensor(&w, m, &[Replicate], None)?)?.sum()?.backward()?;
            Ok((y.full_tensor()?, xt.grad().unwrap().full_tensor()?))
        });
        for (y, g) in outs {
            let what = format!("index_select {} x {xp:?} ids {} {ip:?} on {world}", T::DTYPE, I::DTYPE);
            assert_eq!(to_f64(&y), want, "{what}: forward");
            assert_eq!(to_f64(&g), want_g, "{what}: gradient");
        }
        count(2);
    }
}

/// `x.gather(1, idx)` of a `[2, n]` input at `[2, m]` ids and its gradient, on one rank, with
/// the ids sharded on the gathered dim, and with input and ids sharded alike on dim 0.
fn gather_case<T: Element, I: IndexElement>(n: usize, ids: &[i64]) {
    let (ids, _) = id_array::<I>(ids);
    let m = ids.len();
    // Row 1 reads the ids in reverse.
    let id_at = |i: usize, j: usize| if i == 0 { ids[j] } else { ids[m - 1 - j] };
    let ia = ArrayD::from_shape_fn(IxDyn(&[2, m]), |ix| I::of_i64(id_at(ix[0], ix[1])));
    let x = ArrayD::from_shape_fn(IxDyn(&[2, n]), |ix| T::of_f64(val(ix[1], ix[0])));
    let w = ArrayD::from_shape_fn(IxDyn(&[2, m]), |ix| T::of_f64(weight(ix[1], ix[0])));
    let want = ArrayD::from_shape_fn(IxDyn(&[2, m]), |ix| val(id_at(ix[0], ix[1]) as usize, ix[0]));
    let mut want_g = ArrayD::<f64>::zeros(IxDyn(&[2, n]));
    for i in 0..2 {
        for j in 0..m {
            want_g[[i, id_at(i, j) as usize]] += weight(j, i);
        }
    }
    let layouts: [Layout; 3] = [(1, Replicate, Replicate), (2, Replicate, Shard(1)), (2, Shard(0), Shard(0))];
    for (world, xp, ip) in layouts {
        let outs = on_mesh(world, |mesh| {
            let xt = distribute_tensor(&x, mesh, &[xp], None)?.requires_grad_(true);
            let y = xt.gather(1, &distribute_tensor(&ia, mesh, &[ip], None)?)?;
            y.mul(&distribute_tensor(&w, mesh, &[Replicate], None)?)?.sum()?.backward()?;
            Ok((y.full_tensor()?, xt.grad().unwrap().full_tensor()?))
        });
        for (y, g) in outs {
            let what = format!("gather {} x {xp:?} ids {} {ip:?} on {world}", T::DTYPE, I::DTYPE);
            assert_eq!(to_f64(&y), want, "{what}: forward");
            assert_eq!(to_f64(&g), want_g, "{what}: gradient");
        }
        count(2);
    }
}

#[test]
fn index_select_and_gather_read_every_id() {
    let before = cases();
    per_table_and_id_type!(index_select_case, VOCAB, &ids_large_vocab());
    per_table_and_id_type!(gather_case, 2100, &ids_small());
    println!(
        "{} index_select / gather cases (4 data x 4 id dtypes, 3 layouts each, forward + gradient)",
        cases() - before
    );
}

/// Integer data indexed past what a float holds: a `u8` and an `i32` tensor of 2100 rows at
/// ids past 256 and 2048 (they used to be converted to the data's type: 257 wrapped in u8).
#[test]
fn integer_data_is_indexed_at_every_id() {
    fn case<D: Scalar>() {
        let (ids, ia) = id_array::<i64>(&ids_small());
        let x = ArrayD::from_shape_fn(IxDyn(&[2100, 2]), |ix| D::of_i64(((ix[0] * 3 + ix[1]) % 251) as i64));
        let want = ArrayD::from_shape_fn(IxDyn(&[ids.len(), 2]), |ix| x[[ids[ix[0]] as usize, ix[1]]]);
        for (world, ip) in [(1, Replicate), (2, Shard(0))] {
            let outs = on_mesh(world, |m| {
                distribute_tensor(&x, m, &[Replicate], None)?
                    .index_select(0, &distribute_tensor(&ia, m, &[ip], None)?)?
                    .full_tensor()
            });
            for y in outs {
                assert_eq!(y, want, "index_select of {} data at ids {ip:?} on {world}", D::DTYPE);
            }
            count(1);
        }
    }
    case::<u8>();
    case::<i32>();
    case::<i64>();
}

// ------------------------------------------------------------------ argmax / argmin

/// `argmax`/`argmin` over `classes` (past 256) of `[3, classes]` data with one extreme per row
/// at an odd index past the 16-bit limits, on one rank, rows sharded (kept) and classes
/// sharded (replicated first): `i64` indices, the first occurrence, against an ndarray loop.
fn arg_case<T: Element>(classes: usize, at: [usize; 3]) {
    let mut x = ArrayD::from_shape_fn(IxDyn(&[3, classes]), |ix| T::of_f64(val(ix[0], ix[1])));
    for (r, &a) in at.iter().enumerate() {
        x[[r, a]] = T::of_f64(100.0);
        x[[r, classes - 1 - a]] = T::of_f64(-100.0);
    }
    let first = |max: bool| -> ArrayD<i64> {
        x.map_axis(Axis(1), |lane| {
            let mut best = 0;
            for (i, v) in lane.iter().enumerate() {
                if (max && *v > lane[best]) || (!max && *v < lane[best]) {
                    best = i;
                }
            }
            best as i64
        })
    };
    let (amax, amin) = (first(true), first(false));
    assert_eq!(
        amax.iter().copied().collect::<Vec<_>>(),
        at.iter().map(|&a| a as i64).collect::<Vec<_>>(),
        "the reference"
    );
    for (world, p) in [(1, Replicate), (2, Shard(0)), (2, Shard(1))] {
        let outs = on_mesh(world, |m| {
            let d: DTensor<T> = distribute_tensor(&x, m, &[p], None)?;
            let kept = d.argmax(1, true)?;
            assert_eq!(kept.shape(), &[3, 1]);
            Ok((d.argmax(1, false)?.full_tensor()?, d.argmin(-1, false)?.full_tensor()?, kept.full_tensor()?))
        });
        for (mx, mn, kept) in outs {
            let what = format!("argmax/argmin of {} over {classes} classes {p:?} on {world}", T::DTYPE);
            assert_eq!(mx, amax, "{what}");
            assert_eq!(mn, amin, "{what}");
            assert_eq!(kept.into_shape_with_order(IxDyn(&[3])).unwrap(), amax, "{what}: keepdim");
        }
        count(3);
    }
}

/// Issue 33's sibling: a bf16 `argmax` over 32000 classes used to return the index rounded to
/// bf16 (an odd index past 256 came back wrong); indices are `i64` now, for every dtype.
#[test]
fn argmax_argmin_return_exact_i64_indices() {
    let before = cases();
    arg_case::<bf16>(32_000, [257, 31_999 - 2, 2049]);
    arg_case::<bf16>(300, [257, 299, 259]);
    arg_case::<f16>(2100, [2049, 2051, 257]);
    arg_case::<f16>(VOCAB, [65_505, 69_997, 4097]);
    arg_case::<f32>(VOCAB, [65_505, 257, 2049]);
    arg_case::<f64>(2100, [2049, 257, 2099]);
    println!("{} argmax/argmin cases (bf16, f16, f32, f64; 1 rank, rows and classes sharded)", cases() - before);
}

// ------------------------------------------------------------------ errors

/// What each op does with one bad id: `Err` with the error, on every rank.
fn errors_of<T: Element, I: IndexElement>(bad: I, world: usize) -> Vec<Vec<(&'static str, Error)>> {
    let table = ArrayD::from_shape_fn(IxDyn(&[10, 2]), |ix| T::of_f64(val(ix[0], ix[1])));
    on_mesh(world, |m| {
        let ids = distribute_tensor(
            ArrayD::from_shape_vec(IxDyn(&[2]), vec![I::of_i64(1), bad]).unwrap(),
            m,
            &[Replicate],
            None,
        )?;
        let idx2 = ids.reshape(&[1, 2])?;
        // A vocab-parallel table on 2 ranks: every rank checks every id against the whole vocabulary.
        let t = distribute_tensor(&table, m, &[if world > 1 { Shard(0) } else { Replicate }], None)?;
        let x = distribute_tensor(&table, m, &[Replicate], None)?;
        let logits = distribute_tensor(ArrayD::from_elem(IxDyn(&[2, 10]), T::one()), m, &[Replicate], None)?;
        let results: Vec<(&'static str, Result<()>)> = vec![
            ("embedding", t.embedding(&ids).map(drop)),
            ("one_hot", ids.one_hot::<T>(10).map(drop)),
            ("cross_entropy", logits.cross_entropy(&ids).map(drop)),
            ("index_select", x.index_select(0, &ids).map(drop)),
            ("gather", x.transpose(0, 1)?.gather(1, &idx2).map(drop)),
        ];
        Ok(results.into_iter().map(|(op, r)| (op, r.expect_err(op))).collect())
    })
}

/// Float ids that are not whole numbers in i64's range: an `InvalidArgument` naming the op,
/// for every float id type (the ops check before converting, never rounding 1.5 to 1).
fn non_whole_float_ids<T: Element, I: IndexElement>() {
    // 2^63 and 1e30 are past i64 (f16 makes them infinite, bf16 rounds 1e30: still past).
    for v in [1.5, -0.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 2f64.powi(63), 1e30] {
        for world in [1, 2] {
            for rank in errors_of::<T, I>(I::of_f64(v), world) {
                for (op, e) in rank {
                    match e {
                        Error::InvalidArgument { context, reason } => {
                            assert_eq!(context, op, "{op}: {reason}");
                            assert!(reason.contains("whole number"), "{op}: {reason}");
                        }
                        e => panic!("{op} of {} id {v} into {}: {e:?}", I::DTYPE, T::DTYPE),
                    }
                    count(1);
                }
            }
        }
    }
}

/// Negative ids and ids past the indexed dim (10): an `InvalidArgument` for every id type.
fn out_of_range_ids<T: Element, I: IndexElement>() {
    for v in [-1i64, 10, 257, -2049] {
        if !holds::<I>(v) {
            continue;
        }
        for world in [1, 2] {
            for rank in errors_of::<T, I>(I::of_i64(v), world) {
                for (op, e) in rank {
                    assert!(
                        matches!(e, Error::InvalidArgument { .. }),
                        "{op} of {} id {v} into {}: {e:?}",
                        I::DTYPE,
                        T::DTYPE
                    );
                    count(1);
                }
            }
        }
    }
}

macro_rules! for_float_ids {
    ($f:ident) => {{
        for_float_ids!(@t $f, f32);
        for_float_ids!(@t $f, f64);
        for_float_ids!(@t $f, bf16);
        for_float_ids!(@t $f, f16);
    }};
    (@t $f:ident, $t:ty) => {{
        $f::<$t, f32>();
        $f::<$t, f64>();
        $f::<$t, bf16>();
        $f::<$t, f16>();
    }};
}

#[test]
fn bad_ids_are_typed_errors() {
    let before = cases();
    per_table_and_id_type!(out_of_range_ids,);
    for_float_ids!(non_whole_float_ids);
    println!("{} bad-id error cases (5 ops, 4 data x 4 id dtypes, 1 and 2 ranks)", cases() - before);
}
