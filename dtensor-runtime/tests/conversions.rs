//! One conversion rule everywhere (issue 33, finding 6): Rust's `as`, as PyTorch's casts.
//!
//! - The checkpoint loaders convert a stored dtype into the tensor's by the rule of
//!   `DTensor::cast` (integers through i64: exact beyond 2^53, wrapping into narrower integers),
//!   never through f64 (which rounded I64 values beyond 2^53 and saturated I64 into i32/u8).
//! - A cast of a `Partial` tensor keeps the placement only where converting each rank's term
//!   and then reducing gives the conversion of the reduced value; otherwise it is refused
//!   (`Error::PartialNotAllowed`), never a silently different value.

mod hf_util;

use dtensor_runtime::checkpoint::hf::HfCheckpoint;
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::{
    bf16, f16, from_local, run, Error, FromLocal, Partial, Placement, ReduceOp, Replicate, Result, Scalar,
};
use hf_util::Raw;
use safetensors::Dtype;

fn raw<T: bytemuck::Pod>(dtype: Dtype, v: &[T]) -> Raw {
    Raw { dtype, shape: vec![v.len()], data: bytemuck::cast_slice(v).to_vec() }
}

/// Loads tensor `name` of a file holding `tensors` as `T` on one rank.
fn load<T: Scalar>(tensors: &[(&str, &Raw)], name: &str) -> ArrayD<T> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let views: Vec<(&str, &Raw)> = tensors.to_vec();
    safetensors::serialize_to_file(views, None, &path).unwrap();
    run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        HfCheckpoint::open(&path)?.load_tensor::<T>(name, &mesh, &[Replicate])?.full_tensor()
    })
    .unwrap()
    .remove(0)
}

/// What `DTensor::cast` makes of `v` (the one rule), on one rank.
fn cast<S: Scalar, T: Scalar>(v: &[S]) -> ArrayD<T> {
    let a = ArrayD::from_shape_vec(IxDyn(&[v.len()]), v.to_vec()).unwrap();
    run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1], &["x"])?;
        from_local(a.clone(), &mesh, &[Replicate], FromLocal::default())?.cast::<T>()?.full_tensor()
    })
    .unwrap()
    .remove(0)
}

fn same_bits<T: Scalar>(a: &ArrayD<T>, b: &ArrayD<T>) -> bool {
    bytemuck::cast_slice::<T, u8>(a.as_slice().unwrap()) == bytemuck::cast_slice::<T, u8>(b.as_slice().unwrap())
}

/// Every stored integer or float dtype into every element type: the loader's value is
/// `cast`'s, bit for bit. Returns the number of (stored, loaded) pairs tried.
#[test]
fn the_loader_converts_as_cast_does() {
    let i64s: Vec<i64> = vec![0, 1, -1, 255, 256, 300, -300, i32::MAX as i64 + 7, (1 << 53) + 1, i64::MAX, i64::MIN];
    let i32s: Vec<i32> = vec![0, 1, -1, 255, 256, 300, -300, i32::MAX, i32::MIN, 16_777_217];
    let u8s: Vec<u8> = vec![0, 1, 127, 128, 255];
    let f32s: Vec<f32> = vec![0.0, -0.0, 0.6, -0.6, 3.7, -3.7, 255.9, 256.5, 1e20, -1e20, f32::NAN, f32::INFINITY];
    let f64s: Vec<f64> = vec![0.6, -3.7, 1e300, (1u64 << 53) as f64 + 2.0, f64::NAN, f64::NEG_INFINITY];
    let bf16s: Vec<bf16> = f32s.iter().map(|&x| bf16::from_f32(x)).collect();
    let f16s: Vec<f16> = vec![f16::from_f32(0.6), f16::from_f32(-3.7), f16::MAX, f16::NEG_INFINITY, f16::NAN];
    let (ri64, ri32, ru8) = (raw(Dtype::I64, &i64s), raw(Dtype::I32, &i32s), raw(Dtype::U8, &u8s));
    let (rf32, rf64) = (raw(Dtype::F32, &f32s), raw(Dtype::F64, &f64s));
    let (rbf16, rf16) = (raw(Dtype::BF16, &bf16s), raw(Dtype::F16, &f16s));
    let file: Vec<(&str, &Raw)> = vec![
        ("i64", &ri64),
        ("i32", &ri32),
        ("u8", &ru8),
        ("f32", &rf32),
        ("f64", &rf64),
        ("bf16", &rbf16),
        ("f16", &rf16),
    ];
    let mut pairs = 0;
    macro_rules! each_target {
        ($name:literal, $src:expr) => {{
            macro_rules! one {
                ($t:ty) => {{
                    let got = load::<$t>(&file, $name);
                    let want = cast::<_, $t>(&$src);
                    assert!(same_bits(&got, &want), "{} as {}: loaded {got:?}, cast {want:?}", $name, stringify!($t));
                    pairs += 1;
                }};
            }
            one!(i64);
            one!(i32);
            one!(u8);
            one!(f32);
            one!(f64);
            one!(bf16);
            one!(f16);
        }};
    }
    each_target!("i64", i64s);
    each_target!("i32", i32s);
    each_target!("u8", u8s);
    each_target!("f32", f32s);
    each_target!("f64", f64s);
    each_target!("bf16", bf16s);
    each_target!("f16", f16s);
    println!("stored x loaded dtype pairs: {pairs}");
    assert_eq!(pairs, 49);
}

/// The cases by value: I64 beyond 2^53 loads exactly as i64; I64 into i32 and u8 wraps
/// (it saturated through f64).
#[test]
fn i64_checkpoint_values_wrap_and_stay_exact() {
    let v: Vec<i64> = vec![(1 << 53) + 1, i32::MAX as i64 + 1, 300, -1];
    let r = raw(Dtype::I64, &v);
    let file = [("ids", &r)];
    assert_eq!(load::<i64>(&file, "ids").as_slice().unwrap(), v.as_slice());
    assert_eq!(load::<i32>(&file, "ids").as_slice().unwrap(), [1, i32::MIN, 300, -1]);
    assert_eq!(load::<u8>(&file, "ids").as_slice().unwrap(), [1, 0, 44, 255]);
}

/// `terms[r]` as rank r's term of a `Partial(op)` tensor of `S`, cast to `T` on 2 ranks:
/// the full tensor after the cast, or the cast's error.
fn partial_cast<S: Scalar, T: Scalar>(terms: [&[f64]; 2], op: ReduceOp) -> Result<ArrayD<T>> {
    let out = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let mine: Vec<S> = terms[ctx.rank()].iter().map(|&v| S::of_f64(v)).collect();
        let p = from_local(
            ArrayD::from_shape_vec(IxDyn(&[mine.len()]), mine).unwrap(),
            &mesh,
            &[Partial(op)],
            FromLocal::default(),
        )?;
        p.cast::<T>()?.full_tensor()
    });
    out.map(|mut v| v.remove(0))
}

/// The reduced value of `terms` in `S`, then cast to `T` (what a correct cast must give).
fn reduce_then_cast<S: Scalar, T: Scalar>(terms: [&[f64]; 2], op: ReduceOp) -> ArrayD<T> {
    run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let mine: Vec<S> = terms[ctx.rank()].iter().map(|&v| S::of_f64(v)).collect();
        let p = from_local(
            ArrayD::from_shape_vec(IxDyn(&[mine.len()]), mine).unwrap(),
            &mesh,
            &[Partial(op)],
            FromLocal::default(),
        )?;
        p.redistribute(&[Replicate])?.cast::<T>()?.full_tensor()
    })
    .unwrap()
    .remove(0)
}

/// Finding 6 (second half): `cast` of a `Partial(sum)` float tensor to an integer truncated
/// each term (0.6 + 0.6 gave 0, not 1); now it is refused, and reducing first gives 1.
#[test]
fn partial_sum_floats_into_integers_are_refused() {
    let e = partial_cast::<f32, i64>([&[0.6], &[0.6]], ReduceOp::Sum).unwrap_err();
    assert!(matches!(e, Error::PartialNotAllowed { placement: Placement::Partial(ReduceOp::Sum), .. }), "{e}");
    assert!(e.to_string().contains("reduce first"), "{e}");
    assert_eq!(reduce_then_cast::<f32, i64>([&[0.6], &[0.6]], ReduceOp::Sum).as_slice().unwrap(), [1]);
    // Partial(avg) into an integer would make an integer average, which does not exist.
    let e = partial_cast::<f64, i32>([&[1.0], &[2.0]], ReduceOp::Avg).unwrap_err();
    assert!(matches!(e, Error::PartialNotAllowed { .. }), "{e}");
}

/// Every (source, target, reduce op): either the cast keeps the Partial and cast-then-reduce
/// equals reduce-then-cast (exactly for integer targets and max/min; within the target's
/// rounding for float sums, averages and products, as PyTorch's casts), or it is refused.
#[test]
fn every_partial_cast_is_exact_or_refused() {
    // Terms chosen to break a wrong rule: fractions that sum to a whole, integers that wrap.
    let terms: [&[f64]; 2] = [&[0.6, -0.6, 200.0, 70000.0, 3.0], &[0.6, -0.6, 100.0, 70000.0, -5.0]];
    let int_terms: [&[f64]; 2] = [&[200.0, 256.0, -3.0, 70000.0, 2.0], &[100.0, 10.0, -4.0, 70000.0, 3.0]];
    let (mut kept, mut refused) = (0, 0);
    macro_rules! case {
        ($s:ty, $t:ty) => {{
            let src = <$s as Scalar>::DTYPE;
            let tm = if src.is_float() { terms } else { int_terms };
            for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product] {
                if !src.is_float() && op == ReduceOp::Avg {
                    continue; // integer Partial(avg) cannot exist
                }
                match partial_cast::<$s, $t>(tm, op) {
                    Ok(got) => {
                        let want = reduce_then_cast::<$s, $t>(tm, op);
                        let dst = <$t as Scalar>::DTYPE;
                        if !dst.is_float() || matches!(op, ReduceOp::Max | ReduceOp::Min) {
                            assert!(same_bits(&got, &want), "{src}->{dst} {op:?}: {got:?} vs {want:?}");
                        } else {
                            for (g, w) in got.iter().zip(&want) {
                                let (g, w) = (g.as_f64(), w.as_f64());
                                // Within the coarser of the two precisions (the terms round in either).
                                let tol = if dst.is_half() || src.is_half() { 1e-2 } else { 1e-5 };
                                assert!(
                                    (g - w).abs() <= tol * w.abs().max(1.0) || (g.is_infinite() && w.is_infinite()),
                                    "{src}->{dst} {op:?}: {g} vs {w}"
                                );
                            }
                        }
                        kept += 1;
                    }
                    Err(Error::PartialNotAllowed { .. }) => refused += 1,
                    Err(e) => panic!("{src}->{} {op:?}: {e}", <$t as Scalar>::DTYPE),
                }
            }
        }};
    }
    macro_rules! from {
        ($s:ty) => {
            case!($s, f32);
            case!($s, f64);
            case!($s, bf16);
            case!($s, f16);
            case!($s, i64);
            case!($s, i32);
            case!($s, u8);
        };
    }
    from!(f32);
    from!(f64);
    from!(bf16);
    from!(i64);
    from!(i32);
    from!(u8);
    println!("partial casts: {kept} kept, {refused} refused");
    // 3 float sources x 7 targets x 5 ops + 3 integer sources x 7 targets x 4 ops.
    assert_eq!(kept + refused, 3 * 7 * 5 + 3 * 7 * 4);
    assert!(refused > 0 && kept > 0);
}
