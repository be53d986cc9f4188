//! Comparisons, `where_`/`masked_fill` and shape ops on integer tensors (`i64`, `i32`, `u8`):
//! every op on 1-D meshes of 1–4 ranks and a 2×2 mesh, uneven shapes and empty shards, equals
//! the 1-rank result, which equals the same op on `f64` (exact for these values) cast back;
//! where the layout allows it, the op issues no collective. Integer tensors never record a
//! gradient.

use dtensor_runtime::ndarray::{self, ArrayD, Axis, IxDyn};
use dtensor_runtime::op::BinaryOp;
use dtensor_runtime::{
    cat, distribute_tensor, run, stack, CommDebugMode, DTensor, DType, Error, Partial, Placement, ReduceOp, Replicate,
    Scalar, Shard,
};

const R: Placement = Replicate;
fn s(d: isize) -> Placement {
    Shard(d)
}

/// Whole numbers spanning each type's range (negative for the signed types, beyond 2³² for
/// i64, up to 255 for u8), all exact in f64; `k` spaced so that equal values are rare.
fn value<T: Scalar>(k: usize) -> T {
    let v = match T::DTYPE {
        DType::U8 => (k * 37 % 256) as f64,
        DType::I32 => (k as f64 - 7.0) * 100_003.0,
        _ => (k as f64 - 7.0) * 4_294_967_311.0,
    };
    T::of_f64(v)
}

fn global<T: Scalar>(shape: &[usize], seed: usize) -> ArrayD<T> {
    let mut k = seed;
    ArrayD::from_shape_simple_fn(IxDyn(shape), || {
        k += 1;
        value::<T>(k)
    })
}

/// The inputs of one op: data tensors of the element type, optional `i64` ids, an optional
/// `u8` mask.
struct Inputs<T: Scalar> {
    xs: Vec<ArrayD<T>>,
    ids: Option<ArrayD<i64>>,
    mask: Option<ArrayD<u8>>,
}

/// One layout: the mesh, the placements of every input (data, then ids, then mask), and
/// whether the op must run without any collective.
struct Layout {
    mesh: Vec<usize>,
    placements: Vec<Vec<Placement>>,
    free: bool,
}

fn lay(mesh: &[usize], placements: &[&[Placement]], free: bool) -> Layout {
    Layout { mesh: mesh.to_vec(), placements: placements.iter().map(|p| p.to_vec()).collect(), free }
}

/// The distributed inputs an op is applied to.
struct Args<T: Scalar> {
    xs: Vec<DTensor<T>>,
    ids: Option<DTensor<i64>>,
    mask: Option<DTensor<u8>>,
}

/// Applies the op called `name` (one generic body for every element type).
fn apply<T: Scalar>(name: &str, a: &Args<T>) -> dtensor_runtime::Result<DTensor<T>> {
    let x = &a.xs[0];
    let y = || &a.xs[1];
    let ids = || a.ids.as_ref().unwrap();
    let mask = || a.mask.as_ref().unwrap();
    match name {
        "eq" => x.eq_mask(y()),
        "ne" => x.ne_mask(y()),
        "lt" => x.lt_mask(y()),
        "le" => x.le_mask(y()),
        "gt" => x.gt_mask(y()),
        "ge" => x.ge_mask(y()),
        "compare_mask(lt)" => x.compare_mask(BinaryOp::Lt, y())?.cast::<T>(),
        "compare_mask(eq)" => x.compare_mask(BinaryOp::Eq, y())?.cast::<T>(),
        "where_" => x.where_(mask(), y()),
        "masked_fill" => x.masked_fill(mask(), T::of_f64(42.0)),
        "reshape" => x.reshape(&[-1]),
        "view" => x.view(&[3, -1]),
        "flatten" => x.flatten(0, -1),
        "unflatten" => x.unflatten(1, &[2, -1]),
        "squeeze" => x.squeeze(None),
        "unsqueeze" => x.unsqueeze(1),
        "permute" => x.permute(&[2, 0, 1]),
        "transpose" => x.transpose(0, -1),
        "contiguous" => x.contiguous(),
        "expand" => x.expand(&[3, 4, 5]),
        "cat" => cat(&[x, y()], 0),
        "stack" => stack(&[x, y()], 1),
        "narrow" => x.narrow(0, 1, 2),
        "slice" => x.slice(1, 1, 100),
        "split" => Ok(x.split(2, 0)?.remove(1)),
        "chunk" => Ok(x.chunk(2, 1)?.remove(0)),
        "index_select" => x.index_select(1, ids()),
        "gather" => x.gather(1, ids()),
        "repeat" => x.repeat(&[2, 1, 2]),
        "repeat_interleave" => x.repeat_interleave(2, 1),
        other => panic!("unknown op {other}"),
    }
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("d{i}")).collect()
}

/// Runs `name` on `inputs` laid out as `l`: the full result on every rank.
fn run_on<T: Scalar>(name: &str, inputs: &Inputs<T>, l: &Layout) -> Vec<ArrayD<T>> {
    let world: usize = l.mesh.iter().product();
    run(world, |ctx| {
        let n = names(l.mesh.len());
        let refs: Vec<&str> = n.iter().map(String::as_str).collect();
        let m = ctx.init_device_mesh(&l.mesh, &refs)?;
        let mut ps = l.placements.iter();
        let xs = inputs
            .xs
            .iter()
            .map(|g| distribute_tensor(g, &m, ps.next().unwrap(), None))
            .collect::<dtensor_runtime::Result<Vec<_>>>()?;
        let ids = inputs.ids.as_ref().map(|g| distribute_tensor(g, &m, ps.next().unwrap(), None)).transpose()?;
        let mask = inputs.mask.as_ref().map(|g| distribute_tensor(g, &m, ps.next().unwrap(), None)).transpose()?;
        let args = Args { xs, ids, mask };
        let mode = CommDebugMode::new();
        let out = mode.scope(|| apply(name, &args))?;
        if l.free {
            assert_eq!(mode.total(), 0, "{} {name} on {:?} {:?} communicated", T::DTYPE, l.mesh, l.placements);
        }
        assert!(!out.requires_grad(), "an integer op recorded a gradient");
        out.full_tensor()
    })
    .unwrap()
}

/// `name` on every layout equals its 1-rank result, which equals the op on `f64` cast back;
/// returns the 1-rank result.
fn check<T: Scalar>(name: &str, inputs: &Inputs<T>, layouts: &[Layout]) -> ArrayD<T> {
    let one_layout = Layout {
        mesh: vec![1],
        placements: vec![vec![R]; inputs.xs.len() + inputs.ids.is_some() as usize + inputs.mask.is_some() as usize],
        free: true,
    };
    let one = run_on(name, inputs, &one_layout).remove(0);
    let as_f64 = Inputs::<f64> {
        xs: inputs.xs.iter().map(|a| a.mapv(|v| v.as_f64())).collect(),
        ids: inputs.ids.clone(),
        mask: inputs.mask.clone(),
    };
    let float = run_on(name, &as_f64, &one_layout).remove(0);
    assert_eq!(one, float.mapv(T::of_f64), "{} {name}: 1 rank vs the f64 op", T::DTYPE);
    for l in layouts {
        for (rank, got) in run_on(name, inputs, l).into_iter().enumerate() {
            assert_eq!(got, one, "{} {name} on {:?} {:?}, rank {rank}", T::DTYPE, l.mesh, l.placements);
        }
    }
    one
}

/// The comparison `name` of `a` and `b` (broadcast to `a`) by Rust's operators: 1 or 0.
fn compared<T: Scalar>(name: &str, a: &ArrayD<T>, b: &ArrayD<T>) -> ArrayD<T> {
    let test: fn(T, T) -> bool = match name {
        "eq" | "compare_mask(eq)" => |x, y| x == y,
        "ne" => |x, y| x != y,
        "lt" | "compare_mask(lt)" => |x, y| x < y,
        "le" => |x, y| x <= y,
        "gt" => |x, y| x > y,
        "ge" => |x, y| x >= y,
        other => panic!("not a comparison: {other}"),
    };
    let b = b.broadcast(a.raw_dim()).unwrap();
    let mut out = a.clone();
    out.zip_mut_with(&b, |x, &y| *x = if test(*x, y) { T::one() } else { T::zero() });
    out
}

fn data<T: Scalar>(shapes: &[&[usize]]) -> Inputs<T> {
    Inputs { xs: shapes.iter().enumerate().map(|(i, sh)| global::<T>(sh, 100 * i)).collect(), ids: None, mask: None }
}

/// `b` equal to `a` at every third element (so `eq`/`le`/`ge` see ties), else other values.
fn with_ties<T: Scalar>(shape: &[usize]) -> Inputs<T> {
    let a = global::<T>(shape, 0);
    let other = global::<T>(shape, 50);
    let mut k = 0;
    let b = ArrayD::from_shape_fn(IxDyn(shape), |ix| {
        k += 1;
        if k % 3 == 0 {
            a[&ix]
        } else {
            other[&ix]
        }
    });
    Inputs { xs: vec![a, b], ids: None, mask: None }
}

fn compare_layouts() -> Vec<Layout> {
    vec![
        lay(&[2], &[&[s(0)], &[s(0)]], true),
        lay(&[3], &[&[s(1)], &[s(1)]], true),
        lay(&[4], &[&[s(0)], &[s(0)]], true),
        lay(&[2, 2], &[&[s(0), s(1)], &[s(0), s(1)]], true),
        lay(&[2, 2], &[&[R, s(1)], &[R, s(1)]], true),
        // Mismatched shards: redistributed first, same values.
        lay(&[2, 2], &[&[s(0), R], &[R, s(1)]], false),
    ]
}

fn check_comparisons<T: Scalar>() {
    // [5, 3] is uneven on 2, 3 and 4 ranks (an empty shard on 4); [1, 3] leaves most empty.
    for shape in [[5usize, 3], [1, 3]] {
        let inputs = with_ties::<T>(&shape);
        for op in ["eq", "ne", "lt", "le", "gt", "ge", "compare_mask(lt)", "compare_mask(eq)"] {
            let one = check(op, &inputs, &compare_layouts());
            assert_eq!(one, compared(op, &inputs.xs[0], &inputs.xs[1]), "{} {op}", T::DTYPE);
        }
    }
    // Broadcasting against a [3] row: the row is Replicate, the matrix keeps its shard.
    let b = data::<T>(&[&[5, 3], &[3]]);
    let one = check("lt", &b, &[lay(&[4], &[&[s(0)], &[R]], true), lay(&[2, 2], &[&[s(0), s(1)], &[R, s(0)]], true)]);
    assert_eq!(one, compared("lt", &b.xs[0], &b.xs[1]));
}

#[test]
fn comparisons_match_one_rank_for_every_integer_dtype() {
    check_comparisons::<i64>();
    check_comparisons::<i32>();
    check_comparisons::<u8>();
}

/// A u8 mask of `shape` with a mix of 0, 1 and other non-zero bytes.
fn byte_mask(shape: &[usize]) -> ArrayD<u8> {
    let mut k = 0u32;
    ArrayD::from_shape_simple_fn(IxDyn(shape), || {
        k += 1;
        [0u8, 1, 0, 7, 255][(k % 5) as usize]
    })
}

fn check_selection<T: Scalar>() {
    let mut full = data::<T>(&[&[5, 3], &[5, 3]]);
    full.mask = Some(byte_mask(&[5, 3]));
    let same = |mesh: &[usize], p: &[Placement]| lay(mesh, &[p, p, p], true);
    let layouts = vec![same(&[2], &[s(0)]), same(&[3], &[s(1)]), same(&[4], &[s(0)]), same(&[2, 2], &[s(0), s(1)]), {
        // A Replicate mask against sharded data: no communication either.
        lay(&[2, 2], &[&[s(0), s(1)], &[s(0), s(1)], &[R, R]], true)
    }];
    let one = check("where_", &full, &layouts);
    let (mask, x, y) = (full.mask.as_ref().unwrap(), &full.xs[0], &full.xs[1]);
    let want = ArrayD::from_shape_fn(x.raw_dim(), |ix| if mask[&ix] != 0 { x[&ix] } else { y[&ix] });
    assert_eq!(one, want, "{} where_ by hand", T::DTYPE);
    // masked_fill has one data input: its mask placements come second.
    let mut one = data::<T>(&[&[5, 3]]);
    one.mask = Some(byte_mask(&[5, 3]));
    let fill = vec![
        lay(&[4], &[&[s(0)], &[s(0)]], true),
        lay(&[2, 2], &[&[s(1), s(0)], &[s(1), s(0)]], true),
        lay(&[2, 2], &[&[s(0), R], &[R, R]], true),
    ];
    let filled = check("masked_fill", &one, &fill);
    let mask = one.mask.as_ref().unwrap();
    let want =
        ArrayD::from_shape_fn(one.xs[0].raw_dim(), |ix| if mask[&ix] != 0 { T::of_f64(42.0) } else { one.xs[0][&ix] });
    assert_eq!(filled, want, "{} masked_fill by hand", T::DTYPE);
    // A broadcast [3] mask row.
    one.mask = Some(byte_mask(&[3]));
    check("masked_fill", &one, &[lay(&[3], &[&[s(0)], &[R]], true), lay(&[2, 2], &[&[s(0), s(1)], &[R, s(0)]], true)]);
}

#[test]
fn where_and_masked_fill_match_one_rank_for_every_integer_dtype() {
    check_selection::<i64>();
    check_selection::<i32>();
    check_selection::<u8>();
}

/// A one-input shape op on `shape`, with layouts that keep the shard (`free`) or not: the
/// input and the 1-rank result.
fn check_unary<T: Scalar>(
    op: &str,
    shape: &[usize],
    layouts: &[(&[usize], &[Placement], bool)],
) -> (ArrayD<T>, ArrayD<T>) {
    let inputs = data::<T>(&[shape]);
    let ls: Vec<Layout> = layouts.iter().map(|(m, p, free)| lay(m, &[p], *free)).collect();
    let one = check(op, &inputs, &ls);
    (inputs.xs.into_iter().next().unwrap(), one)
}

fn check_shape_ops<T: Scalar>() {
    // [4, 6] merges evenly on 2 ranks; [5, 6] does not and is redistributed.
    let (x, one) = check_unary::<T>(
        "reshape",
        &[4, 6],
        &[(&[2], &[s(0)], true), (&[2, 2], &[s(0), R], true), (&[4], &[s(1)], false)],
    );
    assert_eq!(one.iter().collect::<Vec<_>>(), x.iter().collect::<Vec<_>>());
    assert_eq!(one.shape(), &[24]);
    check_unary::<T>("reshape", &[5, 6], &[(&[2], &[s(0)], false), (&[4], &[R], true)]);
    check_unary::<T>("view", &[6, 2], &[(&[3], &[s(0)], true), (&[2, 2], &[s(1), R], false)]);
    check_unary::<T>("flatten", &[1, 3], &[(&[4], &[s(1)], false), (&[3], &[R], true)]);
    check_unary::<T>("unflatten", &[5, 6], &[(&[2], &[s(0)], true), (&[2, 2], &[s(0), s(0)], true)]);
    check_unary::<T>("squeeze", &[5, 1, 3], &[(&[4], &[s(0)], true), (&[2, 2], &[s(2), s(0)], true)]);
    check_unary::<T>("unsqueeze", &[5, 3], &[(&[3], &[s(1)], true), (&[2, 2], &[s(1), s(0)], true)]);
    // [2, 3, 5] with 4 ranks on dim 0 leaves two shards empty.
    let moves: &[(&[usize], &[Placement], bool)] =
        &[(&[4], &[s(0)], true), (&[3], &[s(2)], true), (&[2, 2], &[s(1), s(2)], true), (&[2, 2], &[R, s(0)], true)];
    // The 1-rank results by hand (ndarray), so that a kernel shared with the floats is checked too.
    let (x, one) = check_unary::<T>("permute", &[2, 3, 5], moves);
    assert_eq!(one, x.clone().permuted_axes(IxDyn(&[2, 0, 1])));
    let (x, one) = check_unary::<T>("transpose", &[2, 3, 5], moves);
    assert_eq!(one, x.clone().permuted_axes(IxDyn(&[2, 1, 0])));
    check_unary::<T>("contiguous", &[2, 3, 5], moves);
    check_unary::<T>("expand", &[1, 4, 5], &[(&[3], &[s(1)], true), (&[2, 2], &[R, s(2)], true)]);
    let (x, one) = check_unary::<T>(
        "narrow",
        &[5, 3],
        &[(&[4], &[s(1)], true), (&[2], &[s(0)], false), (&[2, 2], &[R, s(1)], true)],
    );
    assert_eq!(one, x.slice_axis(Axis(0), (1..3).into()).to_owned());
    check_unary::<T>("slice", &[5, 3], &[(&[4], &[s(0)], true), (&[3], &[s(1)], false)]);
    check_unary::<T>("split", &[5, 3], &[(&[3], &[s(1)], true), (&[2, 2], &[s(0), s(1)], false)]);
    check_unary::<T>("chunk", &[5, 3], &[(&[4], &[s(0)], true), (&[2, 2], &[s(0), R], true)]);
    // Dim 1 is repeated twice (its shard is gathered first), dim 0 once (its shard is kept).
    check_unary::<T>("repeat", &[2, 3], &[(&[3], &[s(0)], true), (&[2, 2], &[s(0), s(1)], false)]);
    check_unary::<T>("repeat_interleave", &[3, 4], &[(&[2], &[s(1)], true), (&[4], &[s(0)], true)]);
    // cat along dim 0 keeps shards of dim 1; stack along a new dim 1 keeps both.
    let two = data::<T>(&[&[5, 3], &[2, 3]]);
    let cats = [lay(&[3], &[&[s(1)], &[s(1)]], true), lay(&[2, 2], &[&[s(0), s(1)], &[s(0), s(1)]], false)];
    let one = check("cat", &two, &cats);
    assert_eq!(one, ndarray::concatenate(Axis(0), &[two.xs[0].view(), two.xs[1].view()]).unwrap());
    let pair = data::<T>(&[&[5, 3], &[5, 3]]);
    let stacks = [lay(&[4], &[&[s(0)], &[s(0)]], true), lay(&[2, 2], &[&[s(0), s(1)], &[s(0), s(1)]], true)];
    check("stack", &pair, &stacks);
}

#[test]
fn shape_ops_match_one_rank_for_every_integer_dtype() {
    check_shape_ops::<i64>();
    check_shape_ops::<i32>();
    check_shape_ops::<u8>();
}

fn check_indexing<T: Scalar>() {
    let mut sel = data::<T>(&[&[5, 4]]);
    sel.ids = Some(ArrayD::from_shape_vec(IxDyn(&[3]), vec![3i64, 0, 3]).unwrap());
    let sel_layouts = [
        // Rows sharded, the indexed dim 1 whole: local.
        lay(&[4], &[&[s(0)], &[R]], true),
        // A sharded index with a replicated input shards the output on dim 1.
        lay(&[3], &[&[R], &[s(0)]], true),
        lay(&[2, 2], &[&[s(0), R], &[R, s(0)]], true),
        // A shard of the indexed dim is gathered first.
        lay(&[2], &[&[s(1)], &[R]], false),
    ];
    let one = check("index_select", &sel, &sel_layouts);
    assert_eq!(one, sel.xs[0].select(Axis(1), &[3, 0, 3]));
    let mut gat = data::<T>(&[&[5, 4]]);
    gat.ids = Some(ArrayD::from_shape_fn(IxDyn(&[5, 2]), |ix| ((ix[0] * 3 + ix[1]) % 4) as i64));
    let gat_layouts = [
        lay(&[4], &[&[s(0)], &[s(0)]], true),
        lay(&[2, 2], &[&[s(0), R], &[s(0), s(1)]], true),
        lay(&[2], &[&[s(1)], &[R]], false),
    ];
    check("gather", &gat, &gat_layouts);
}

#[test]
fn index_select_and_gather_match_one_rank_for_every_integer_dtype() {
    check_indexing::<i64>();
    check_indexing::<i32>();
    check_indexing::<u8>();
}

/// A Partial integer input is reduced before a comparison and kept through a reshape.
#[test]
fn partial_integers_through_comparisons_and_views() {
    let outs = run(4, |ctx| {
        let m = ctx.init_device_mesh(&[4], &["x"])?;
        let local = ArrayD::from_shape_fn(IxDyn(&[3, 2]), |ix| (ctx.rank() * 10 + ix[0] * 2 + ix[1]) as i64);
        let p = dtensor_runtime::from_local(local, &m, &[Partial(ReduceOp::Sum)], Default::default())?;
        let view = CommDebugMode::new();
        let r = view.scope(|| p.reshape(&[6]))?;
        assert_eq!(view.total(), 0, "a reshape keeps Partial");
        assert_eq!(r.placements(), &[Partial(ReduceOp::Sum)]);
        let threshold = distribute_tensor(ArrayD::from_elem(IxDyn(&[3, 2]), 64i64), &m, &[R], None)?;
        let mask = p.lt_mask(&threshold)?;
        // The sum is reduced first (to whichever layout moves the fewest bytes).
        assert!(!matches!(mask.placements()[0], Placement::Partial(_)), "{:?}", mask.placements());
        Ok((r.full_tensor()?, mask.full_tensor()?))
    })
    .unwrap();
    // Σ over ranks of 10r + k = 60 + 4k.
    let sum: Vec<i64> = (0..6).map(|k| 60 + 4 * k).collect();
    for (r, mask) in outs {
        assert_eq!(r.as_slice().unwrap(), sum.as_slice());
        let want: Vec<i64> = sum.iter().map(|&v| i64::from(v < 64)).collect();
        assert_eq!(mask.as_slice().unwrap(), want.as_slice());
    }
}

/// An integer mask selecting in a float tensor is read as "non-zero", whatever its layout: a
/// sharded `u8`/`i64` mask (cast straight to the float, every non-zero integer staying
/// non-zero) and a Partial `u8` mask whose wrapping sum is 0 on some elements (200 + 56 = 256
/// wraps to 0: those must select `other`, as the reduced mask says).
#[test]
fn integer_masks_select_in_float_tensors_by_their_reduced_value() {
    let outs = run(2, |ctx| {
        let m = ctx.init_device_mesh(&[2], &["x"])?;
        let x = distribute_tensor(ArrayD::from_shape_fn(IxDyn(&[5]), |ix| ix[0] as f32 + 1.0), &m, &[s(0)], None)?;
        let y = distribute_tensor(ArrayD::from_elem(IxDyn(&[5]), -1.0f32), &m, &[s(0)], None)?;
        let sharded = ArrayD::from_shape_vec(IxDyn(&[5]), vec![0u8, 255, 1, 0, 128]).unwrap();
        let wide = ArrayD::from_shape_vec(IxDyn(&[5]), vec![1i64 << 40, 0, -3, 0, 1]).unwrap();
        let by_u8 = x.where_(&distribute_tensor(sharded, &m, &[s(0)], None)?, &y)?;
        let by_i64 = x.where_(&distribute_tensor(wide, &m, &[R], None)?, &y)?;
        // Rank 0 holds 200 on elements 0-1, rank 1 holds 56 there: their u8 sum wraps to 0.
        let part = if ctx.rank() == 0 { vec![200u8, 200, 1, 0, 0] } else { vec![56u8, 56, 0, 0, 2] };
        let pm = dtensor_runtime::from_local(
            ArrayD::from_shape_vec(IxDyn(&[5]), part).unwrap(),
            &m,
            &[Partial(ReduceOp::Sum)],
            Default::default(),
        )?;
        let by_partial = x.where_(&pm, &y)?;
        let filled = x.masked_fill(&pm, 9.0)?;
        Ok([by_u8, by_i64, by_partial, filled].map(|t| t.full_tensor().unwrap().into_raw_vec_and_offset().0))
    })
    .unwrap();
    for [by_u8, by_i64, by_partial, filled] in outs {
        assert_eq!(by_u8, vec![-1.0, 2.0, 3.0, -1.0, 5.0]);
        assert_eq!(by_i64, vec![1.0, -1.0, 3.0, -1.0, 5.0]);
        assert_eq!(by_partial, vec![-1.0, -1.0, 3.0, -1.0, 5.0]);
        assert_eq!(filled, vec![1.0, 2.0, 9.0, 4.0, 9.0]);
    }
}

#[test]
fn integer_index_and_mask_edge_cases_are_typed() {
    run(2, |ctx| {
        let m = ctx.init_device_mesh(&[2], &["x"])?;
        let x = distribute_tensor(global::<u8>(&[2, 3], 0), &m, &[s(0)], None)?;
        // An id a u8 tensor cannot hold, and a negative id: typed errors, not wrapped ids.
        for bad in [300i64, -1] {
            let ids = distribute_tensor(ArrayD::from_elem(IxDyn(&[1]), bad), &m, &[R], None)?;
            let e = x.index_select(1, &ids).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        }
        let ids = distribute_tensor(ArrayD::from_elem(IxDyn(&[1]), 3i64), &m, &[R], None)?;
        assert!(matches!(x.index_select(1, &ids).unwrap_err(), Error::InvalidArgument { .. }));
        // A float mask on integer data counts any non-zero value as true: 0.5 and -2 select
        // the fill value (a plain cast would have turned 0.5 into 0).
        let mask = distribute_tensor(
            ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![0.5f32, 0.0, -2.0, 0.0, 1.0, 0.0]).unwrap(),
            &m,
            &[s(0)],
            None,
        )?;
        let y = x.masked_fill(&mask, 9)?.full_tensor()?;
        let g = global::<u8>(&[2, 3], 0);
        let want: Vec<u8> =
            g.iter().zip([true, false, true, false, true, false]).map(|(&v, hit)| if hit { 9 } else { v }).collect();
        assert_eq!(y.as_slice().unwrap(), want.as_slice());
        // A comparison that is no comparison is a typed error.
        assert!(matches!(x.compare_mask(BinaryOp::Add, &x).unwrap_err(), Error::InvalidArgument { .. }));
        Ok(())
    })
    .unwrap();
}
