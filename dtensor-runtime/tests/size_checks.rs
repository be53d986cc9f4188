//! Sizes a caller supplies (issue 33, finding 7): every product of user sizes is checked
//! (`Error::ShapeOverflow`, in debug and release alike: a wrapped value is never used) and
//! every buffer sized by them is allocated fallibly (`Error::OutOfMemory`, never an abort).
//! Each entry point that takes a shape or a count is tried with a product that overflows, a
//! zero-sized shape whose other dims overflow, and a representable size too large for memory.

use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::{
    arange, causal_mask, empty, full, linspace, manual_seed, ones, rand, randn, run, zeros, DTensor, Error, Replicate,
    Result, Shard, TensorOptions,
};

/// 2^33 x 2^33 elements: past `usize` on 64-bit (it wrapped to 0 in release).
const WRAPS: [usize; 2] = [1 << 33, 1 << 33];
/// No elements, but the strides of the other dims overflow.
const ZERO_BUT_HUGE: [usize; 3] = [0, 1 << 40, 1 << 40];
/// 2^40 f32 (4 TiB): representable, far past the machine's memory.
const TOO_BIG: [usize; 1] = [1 << 40];

fn overflow<T: std::fmt::Debug>(r: Result<T>, what: &str) {
    match r {
        Err(Error::ShapeOverflow { .. }) => {}
        other => panic!("{what}: expected ShapeOverflow, got {other:?}"),
    }
}

fn out_of_memory<T: std::fmt::Debug>(r: Result<T>, what: &str) {
    match r {
        Err(Error::OutOfMemory { .. }) => {}
        other => panic!("{what}: expected OutOfMemory, got {other:?}"),
    }
}

/// Every factory x every hostile size, on 1 rank and sharded over 2 (the shard of a huge
/// tensor is still huge). Returns the number of cases.
#[test]
fn factories_check_the_global_size_first() {
    let counts = run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["x"])?;
        let mut cases = 0;
        for placements in [vec![Replicate], vec![Shard(0)]] {
            let o = TensorOptions::new().mesh(&mesh).placements(&placements);
            type F<'a> = Box<dyn Fn(&[usize]) -> Result<DTensor<f32>> + 'a>;
            let fs: Vec<(&str, F)> = vec![
                ("zeros", Box::new(|s| zeros::<f32>(s, &o))),
                ("ones", Box::new(|s| ones::<f32>(s, &o))),
                ("empty", Box::new(|s| empty::<f32>(s, &o))),
                ("full", Box::new(|s| full::<f32>(s, 2.5, &o))),
                ("rand", Box::new(|s| rand::<f32>(s, &o))),
                ("randn", Box::new(|s| randn::<f32>(s, &o))),
            ];
            for (name, f) in &fs {
                overflow(f(&WRAPS), name);
                overflow(f(&ZERO_BUT_HUGE), name);
                out_of_memory(f(&TOO_BIG), name);
                cases += 3;
            }
            overflow(causal_mask::<f32>(1 << 33, 1 << 33, &o), "causal_mask");
            out_of_memory(causal_mask::<f32>(1 << 20, 1 << 20, &o), "causal_mask");
            out_of_memory(linspace::<f32>(0.0, 1.0, 1 << 40, &o), "linspace");
            out_of_memory(arange::<i64>(0, 1 << 40, 1, &o), "arange");
            cases += 4;
        }
        Ok(cases)
    })
    .unwrap();
    println!("factory cases per rank: {}", counts[0]);
    assert_eq!(counts, [2 * (6 * 3 + 4); 2]);
}

/// A refused `rand` leaves the generator where it was: the next draw is the same as if the
/// refused call had never been made.
#[test]
fn a_refused_random_factory_does_not_advance_the_generator() {
    let draw = |refuse_first: bool| {
        run(1, |ctx| {
            ctx.init_device_mesh(&[1], &["x"])?;
            manual_seed(3);
            if refuse_first {
                assert!(rand::<f32>(&WRAPS, &TensorOptions::new()).is_err());
                assert!(randn::<f64>(&ZERO_BUT_HUGE, &TensorOptions::new()).is_err());
            }
            rand::<f32>(&[4], &TensorOptions::new())?.full_tensor()
        })
        .unwrap()
    };
    assert_eq!(draw(true), draw(false));
}

/// Every view and repetition op whose output shape comes from the caller.
#[test]
fn shape_ops_check_their_products() {
    run(1, |ctx| {
        ctx.init_device_mesh(&[1], &["x"])?;
        let x = DTensor::local_tensor(ArrayD::<f32>::zeros(vec![2, 3]));
        let empty = DTensor::local_tensor(ArrayD::<f32>::zeros(vec![0, 3]));
        let big = 1isize << 33;
        overflow(x.reshape(&[big, big, -1]), "reshape inferring -1 from an overflowing product");
        overflow(empty.reshape(&[0, big, big]), "reshape to an overflowing zero-sized shape");
        overflow(empty.view(&[big, big, 0]), "view");
        // An overflowing product that wraps to the right count must not pass either.
        overflow(x.reshape_to(&[6, 1 << 32, 1 << 32]), "reshape_to");
        overflow(x.unflatten(1, &[big, big]), "unflatten");
        assert!(matches!(x.unflatten(1, &[-2, 3]), Err(Error::InvalidArgument { .. })));
        assert!(matches!(x.unflatten(1, &[-1, -1]), Err(Error::InvalidArgument { .. })));
        overflow(empty.expand(&[1 << 33, 1 << 33, 0, 3]), "expand");
        out_of_memory(x.expand(&[1 << 38, 2, 3]), "expand materializes");
        overflow(x.repeat(&[usize::MAX, 2]), "repeat");
        out_of_memory(x.repeat(&[1 << 38, 1]), "repeat materializes");
        overflow(x.repeat_interleave(usize::MAX, 0), "repeat_interleave");
        Ok(())
    })
    .unwrap();
}

/// `cat` / `stack` of zero-sized inputs whose concatenated dim passes `usize`.
#[test]
fn concatenation_checks_its_sum() {
    run(1, |ctx| {
        ctx.init_device_mesh(&[1], &["x"])?;
        let z = DTensor::local_tensor(ArrayD::<f32>::zeros(vec![1 << 62, 0]));
        overflow(dtensor_runtime::cat(&[&z, &z, &z, &z], 0), "cat");
        let w = DTensor::local_tensor(ArrayD::<f32>::zeros(vec![0, 1 << 62]));
        overflow(dtensor_runtime::cat(&[&w, &w], 1), "cat past the shape bound");
        overflow(dtensor_runtime::stack(&[&w, &w, &w], 0), "stack");
        Ok(())
    })
    .unwrap();
}

/// `one_hot`'s class count is the caller's: `ids × classes` is checked, and a representable
/// but huge one-hot is an allocation error.
#[test]
fn one_hot_checks_ids_times_classes() {
    run(1, |ctx| {
        ctx.init_device_mesh(&[1], &["x"])?;
        let ids = DTensor::local_tensor(ArrayD::<f32>::zeros(vec![4])).cast::<i64>()?;
        overflow(ids.one_hot::<f32>(usize::MAX / 2), "one_hot");
        out_of_memory(ids.one_hot::<f32>(1 << 40), "one_hot materializes");
        let none = DTensor::local_tensor(ArrayD::<f32>::zeros(vec![0, 1 << 40])).cast::<i64>()?;
        overflow(none.one_hot::<f32>(1 << 40), "one_hot of zero ids with huge dims");
        Ok(())
    })
    .unwrap();
}
