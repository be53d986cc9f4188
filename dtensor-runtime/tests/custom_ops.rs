//! User ops (`CustomOp`, `apply_op`) and `local_map`: they behave like built-in ops (strategy
//! search, implicit-collective refusal, autograd), and a broken definition is a typed error
//! naming the user's op. Values are checked against the single-rank computation.

use dtensor_runtime::ndarray::{ArrayD, Dimension, IxDyn};
use dtensor_runtime::ops::custom::Backward;
use dtensor_runtime::ops::implicit::{forbid_implicit, ScopeSite};
use dtensor_runtime::{
    apply_op, distribute_tensor, run, CommDebugMode, CustomOp, DTensor, DimRule, Error, LocalMap, Placement, ReduceOp,
    Replicate, Result, Shard,
};

const P: Placement = Placement::Partial(ReduceOp::Sum);

fn global(shape: &[usize], seed: usize) -> ArrayD<f64> {
    ArrayD::from_shape_fn(IxDyn(shape), |ix| {
        let k = ix.slice().iter().fold(seed, |a, &i| a * 17 + i * 5 + 1);
        ((k % 89) as f64) / 89.0 - 0.5
    })
}

/// A backward as a plain function.
type BackwardFn = fn(&Backward<'_, f64>) -> Result<Vec<Option<DTensor<f64>>>>;

/// `x · 2`, with rules, kernel and backward each replaceable to break one promise.
#[derive(Clone)]
struct Double {
    rules: fn(usize) -> Vec<DimRule>,
    /// Rows the kernel drops from its output (a wrong local shape when > 0).
    drop_rows: usize,
    /// An output shape whose element count overflows.
    huge_output: bool,
    backward: Option<BackwardFn>,
}

fn good_rules(ndim: usize) -> Vec<DimRule> {
    let mut r = vec![DimRule::new(&[Replicate], Replicate), DimRule::new(&[P], P)];
    r.extend((0..ndim as isize).map(|d| DimRule::new(&[Shard(d)], Shard(d))));
    r
}

fn good_backward(ctx: &Backward<'_, f64>) -> Result<Vec<Option<DTensor<f64>>>> {
    Ok(vec![Some(ctx.grad().mul_scalar(2.0)?)])
}

impl Default for Double {
    fn default() -> Self {
        Double { rules: good_rules, drop_rows: 0, huge_output: false, backward: Some(good_backward) }
    }
}

impl CustomOp<f64> for Double {
    fn name(&self) -> &'static str {
        "double"
    }
    fn output_shape(&self, inputs: &[&[usize]]) -> Result<Vec<usize>> {
        Ok(if self.huge_output { vec![usize::MAX / 2, 3] } else { inputs[0].to_vec() })
    }
    fn rules(&self, inputs: &[&[usize]]) -> Vec<DimRule> {
        (self.rules)(inputs[0].len())
    }
    fn forward(&self, inputs: &[&ArrayD<f64>]) -> Result<ArrayD<f64>> {
        let x = inputs[0];
        let keep = x.shape()[0].saturating_sub(self.drop_rows);
        Ok(x.slice_axis(dtensor_runtime::ndarray::Axis(0), (0..keep).into()).mapv(|v| 2.0 * v))
    }
    fn backward(&self, ctx: &Backward<'_, f64>) -> Result<Vec<Option<DTensor<f64>>>> {
        match self.backward {
            Some(b) => b(ctx),
            None => Err(Error::OpDefinition { op: "double".into(), problem: "no backward in this test".into() }),
        }
    }
}

fn definition_error(op: Double, placement: Placement) -> String {
    let g = global(&[5, 3], 1);
    let errs = run(2, move |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let x = distribute_tensor(&g, &mesh, &[placement], Some(0))?.requires_grad_(true);
        let e = match apply_op(&op, &[&x]).and_then(|y| y.sum()?.backward()) {
            Err(e) => e,
            Ok(()) => panic!("the broken op ran"),
        };
        assert!(matches!(e, Error::OpDefinition { ref op, .. } if op == "double"), "{e}");
        Ok(e.to_string())
    })
    .unwrap();
    errs[0].clone()
}

#[test]
fn a_user_op_runs_like_a_builtin_forward_and_backward() {
    let g = global(&[5, 3], 2);
    let out = run(4, move |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["tp"])?;
        let mut got = Vec::new();
        for p in [Replicate, Shard(0), Shard(1), Shard(-1)] {
            let x = distribute_tensor(&g, &mesh, &[p], Some(0))?.requires_grad_(true);
            let y = apply_op(&Double::default(), &[&x])?;
            assert_eq!(y.placements(), x.placements(), "{p:?} passes through");
            y.mul(&y)?.sum()?.backward()?;
            got.push((y.full_tensor()?, x.grad().expect("a gradient").full_tensor()?));
        }
        Ok(got)
    })
    .unwrap();
    let g = global(&[5, 3], 2);
    for (y, dx) in out.into_iter().flatten() {
        assert_eq!(y, g.mapv(|v| 2.0 * v));
        // d/dx Σ (2x)² = 8x
        assert_eq!(dx, g.mapv(|v| 8.0 * v));
    }
}

#[test]
fn a_rule_with_the_wrong_number_of_inputs_is_an_error_naming_the_op() {
    let op = Double { rules: |_| vec![DimRule::new(&[Replicate, Replicate], Replicate)], ..Double::default() };
    let e = definition_error(op, Replicate);
    assert!(e.contains("rule 0 ((R, R) → R) gives 2 input placements for 1 inputs"), "{e}");
}

#[test]
fn a_rule_sharding_a_dim_out_of_range_is_an_error_naming_the_rule_and_tensor() {
    let input = Double { rules: |_| vec![DimRule::new(&[Shard(2)], Shard(0))], ..Double::default() };
    let e = definition_error(input, Replicate);
    assert!(e.contains("rule 0") && e.contains("of input 0, which has 2 dims"), "{e}");
    let output = Double { rules: |_| vec![DimRule::new(&[Shard(0)], Shard(-3))], ..Double::default() };
    let e = definition_error(output, Replicate);
    assert!(e.contains("of the output, which has 2 dims"), "{e}");
}

#[test]
fn contradictory_or_missing_rules_are_errors() {
    let contradictory = Double {
        rules: |_| vec![DimRule::new(&[Shard(0)], Shard(0)), DimRule::new(&[Shard(-2)], Replicate)],
        ..Double::default()
    };
    let e = definition_error(contradictory, Shard(0));
    assert!(e.contains("rules 0") && e.contains("and 1") && e.contains("different outputs"), "{e}");
    let none = Double { rules: |_| Vec::new(), ..Double::default() };
    let e = definition_error(none, Replicate);
    assert!(e.contains("no sharding rule"), "{e}");
}

#[test]
fn a_kernel_returning_the_wrong_local_shape_is_an_error() {
    let e = definition_error(Double { drop_rows: 1, ..Double::default() }, Shard(0));
    assert!(e.contains("its kernel returned a local shard of shape [2, 3] on rank 0"), "{e}");
    assert!(e.contains("has a local shard of shape [3, 3]"), "{e}");
}

#[test]
fn an_output_shape_too_large_to_exist_is_an_error_before_anything_runs() {
    let g = global(&[4, 3], 8);
    run(2, move |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let x = distribute_tensor(&g, &mesh, &[Shard(0)], Some(0))?;
        let e = apply_op(&Double { huge_output: true, ..Double::default() }, &[&x]).expect_err("an overflowing shape");
        assert!(matches!(e, Error::ShapeOverflow { .. }), "{e}");
        assert!(e.to_string().contains("double"), "{e}");
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_backward_of_the_wrong_count_shape_or_mesh_is_an_error() {
    let count = Double { backward: Some(|_| Ok(vec![])), ..Double::default() };
    assert!(definition_error(count, Shard(0)).contains("returned 0 gradients for 1 inputs"));
    let shape = Double { backward: Some(|ctx| Ok(vec![Some(ctx.grad().sum()?)])), ..Double::default() };
    assert!(definition_error(shape, Shard(0)).contains("gradient of shape [] for input 0 of shape [5, 3]"));
    let mesh = Double { backward: Some(|ctx| Ok(vec![Some(ctx.grad().to_local_grad(None)?)])), ..Double::default() };
    let e = definition_error(mesh, Replicate);
    assert!(e.contains("on mesh") && e.contains("the input lives on mesh"), "{e}");
    let missing = Double { backward: None, ..Double::default() };
    assert!(definition_error(missing, Shard(0)).contains("no backward in this test"));
}

#[test]
fn inside_a_distribute_body_a_user_op_may_not_redistribute_on_its_own() {
    // Only Shard(0): a Partial input needs a reduce-scatter first.
    let op = Double { rules: |_| vec![DimRule::new(&[Shard(0)], Shard(0))], ..Double::default() };
    let g = global(&[4, 3], 3);
    run(2, move |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let local = g.mapv(|v| v / 2.0);
        let x = dtensor_runtime::from_local(local, &mesh, &[P], Default::default())?;
        let e = {
            let _scope = forbid_implicit(ScopeSite { function: "step", file: file!(), line: line!() });
            apply_op(&op, &[&x]).expect_err("an implicit reduce-scatter")
        };
        assert!(matches!(e, Error::ImplicitCollective { ref op, .. } if op == "double"), "{e}");
        // outside, it runs: the move is logged, and the values are the single-rank ones
        let y = apply_op(&op, &[&x])?;
        assert_eq!(y.placements(), &[Shard(0)]);
        assert_eq!(y.full_tensor()?, g.mapv(|v| 2.0 * v));
        Ok(())
    })
    .unwrap();
}

#[test]
fn local_map_runs_local_code_with_declared_layouts_forward_and_backward() {
    // 5 rows over 4 ranks: 2, 2, 1, 0
    let (g, w) = (global(&[5, 3], 4), global(&[3], 5));
    let out = run(4, move |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["tp"])?;
        let x = distribute_tensor(&g, &mesh, &[Shard(0)], Some(0))?.requires_grad_(true);
        // a replicated weight every rank uses on different rows: its gradient is a Partial sum
        let v = distribute_tensor(&w, &mesh, &[Replicate], Some(0))?.requires_grad_(true);
        let spec = LocalMap::new("scaled_rows", &[&[Shard(0)]])
            .in_placements(&[&[Shard(0)], &[Replicate]])
            .in_grad_placements(&[&[Shard(0)], &[P]])
            .out_shapes(&[&[5, 3]]);
        let mode = CommDebugMode::new();
        let y = mode.scope(|| spec.call(&[&x, &v], |l| Ok(vec![l[0].mul(&l[1])?.exp()?])))?.remove(0);
        assert_eq!(mode.total(), 0, "local_map runs no collective of its own");
        assert_eq!(y.placements(), &[Shard(0)]);
        y.sum()?.backward()?;
        Ok((y.full_tensor()?, x.grad().unwrap().full_tensor()?, v.grad().unwrap().full_tensor()?))
    })
    .unwrap();
    // single-rank reference: y = exp(x·w), dy/dx = w·y, dy/dw = Σ_rows x·y
    let (g, w) = (global(&[5, 3], 4), global(&[3], 5));
    let y = ArrayD::from_shape_fn(IxDyn(&[5, 3]), |ix| (g[[ix[0], ix[1]]] * w[ix[1]]).exp());
    let dx = ArrayD::from_shape_fn(IxDyn(&[5, 3]), |ix| w[ix[1]] * y[[ix[0], ix[1]]]);
    let dw = ArrayD::from_shape_fn(IxDyn(&[3]), |ix| (0..5).map(|r| g[[r, ix[0]]] * y[[r, ix[0]]]).sum());
    for (gy, gdx, gdw) in out {
        for (got, want) in [(&gy, &y), (&gdx, &dx), (&gdw, &dw)] {
            assert_eq!(got.shape(), want.shape());
            for (a, b) in got.iter().zip(want) {
                assert!((a - b).abs() < 1e-12, "{a} vs {b}");
            }
        }
    }
}

#[test]
fn local_map_refuses_an_input_of_another_layout_unless_asked_to_move_it() {
    let g = global(&[4, 2], 6);
    run(2, move |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let x = distribute_tensor(&g, &mesh, &[Shard(0)], Some(0))?;
        let spec = LocalMap::new("row_norms", &[&[Replicate]]).in_placements(&[&[Replicate]]);
        let identity = |l: &[DTensor<f64>]| Ok(vec![l[0].clone()]);
        let e = spec.call(&[&x], identity).expect_err("a Shard(0) input where Replicate is declared");
        assert!(matches!(e, Error::LocalMapInput { ref op, input: 0, .. } if op == "row_norms"), "{e}");
        assert!(e.to_string().contains("input 0 is laid out (S(0)), but the function declares (R)"), "{e}");
        let x = x.requires_grad_(true);
        let mode = CommDebugMode::new();
        let y = mode.scope(|| spec.clone().redistribute_inputs(true).call(&[&x], identity))?.remove(0);
        assert_eq!(mode.count_for_op(dtensor_runtime::CollectiveKind::AllGather, "row_norms"), 1, "{}", mode.summary());
        assert_eq!(y.full_tensor()?, g);
        // the move is on the tape: the gradient comes back to x, in x's layout
        y.mul(&y)?.sum()?.backward()?;
        let dx = x.grad().expect("the moved input's gradient");
        assert_eq!(dx.placements(), &[Shard(0)]);
        assert_eq!(dx.full_tensor()?, g.mapv(|v| 2.0 * v));
        Ok(())
    })
    .unwrap();
}

/// A Partial input's local term gets the whole gradient by default (its gradient is
/// Replicate); declaring it Partial would make the gradient n times too large, and is refused.
#[test]
fn local_map_gives_a_partial_input_the_whole_gradient() {
    let g = global(&[3, 2], 9);
    run(2, move |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let w = distribute_tensor(&g, &mesh, &[Replicate], Some(0))?.requires_grad_(true);
        let p = w.redistribute(&[P])?; // each rank holds a term, w / 2
        let identity = |l: &[DTensor<f64>]| Ok(vec![l[0].clone()]);
        let y = LocalMap::new("terms", &[&[P]]).in_placements(&[&[P]]).call(&[&p], identity)?.remove(0);
        y.sum()?.backward()?;
        // d/dw Σ w = 1 everywhere, on every rank
        assert_eq!(w.grad().unwrap().full_tensor()?, g.mapv(|_| 1.0));
        let e = LocalMap::new("terms", &[&[P]])
            .in_grad_placements(&[&[P]])
            .call(&[&p], identity)
            .expect_err("a Partial gradient for a Partial input");
        assert!(e.to_string().contains("input 0 is P(sum) on mesh dim 0, and its gradient cannot be P(sum)"), "{e}");
        Ok(())
    })
    .unwrap();
}

#[test]
fn local_map_needs_the_global_shape_of_a_sharded_output() {
    // 5 rows over 4 ranks: 2, 2, 1, 0; a shape inferred from each rank's rows would be 8, 8, 4, 0
    let g = global(&[5, 2], 10);
    run(4, move |ctx| {
        let mesh = ctx.init_device_mesh(&[4], &["tp"])?;
        let x = distribute_tensor(&g, &mesh, &[Shard(0)], Some(0))?;
        let rows = |l: &[DTensor<f64>]| Ok(vec![l[0].exp()?]);
        let e = LocalMap::new("rows", &[&[Shard(0)]]).call(&[&x], rows).expect_err("no global shape");
        assert!(e.to_string().contains("output 0 is sharded ((S(0))): give its global shape"), "{e}");
        let y = LocalMap::new("rows", &[&[Shard(0)]]).out_shapes(&[&[5, 2]]).call(&[&x], rows)?.remove(0);
        assert_eq!(y.shape(), &[5, 2]);
        // the library's vectorised exp is within a few ulp of libm's
        let close = y.full_tensor()?.iter().zip(&g).all(|(a, b)| (a - b.exp()).abs() < 1e-14);
        assert!(close);
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_rule_whose_output_a_kernel_cannot_make_is_an_error() {
    for (rules, what) in [
        ((|_| vec![DimRule::new(&[Replicate], P)]) as fn(usize) -> Vec<DimRule>, "P(sum)"),
        (|_| vec![DimRule::new(&[Replicate], Shard(0))], "S(0)"),
    ] {
        let e = definition_error(Double { rules, ..Double::default() }, Replicate);
        assert!(e.contains(&format!("makes a {what} output from inputs that are not split")), "{e}");
    }
}

#[test]
fn local_map_checks_what_the_function_returns() {
    let g = global(&[4, 2], 7);
    run(2, move |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let x = distribute_tensor(&g, &mesh, &[Shard(0)], Some(0))?;
        let two = LocalMap::new("f", &[&[Shard(0)], &[Shard(0)]]);
        let e = two.call(&[&x], |l| Ok(vec![l[0].clone()])).expect_err("one output for two");
        assert!(e.to_string().contains("returned 1 outputs, 2 are declared"), "{e}");
        let one = LocalMap::new("f", &[&[Shard(0)]]);
        let e = one.call(&[&x], |_| Ok(vec![x.clone()])).expect_err("a DTensor, not a local tensor");
        assert!(e.to_string().contains("output 0 is a DTensor on mesh"), "{e}");
        let wrong = LocalMap::new("f", &[&[Shard(0)]]).out_shapes(&[&[9, 2]]);
        let e = wrong.call(&[&x], |l| Ok(vec![l[0].clone()])).expect_err("a shard of another global shape");
        assert!(matches!(e, Error::OpDefinition { .. }) && e.to_string().contains("output 0"), "{e}");
        let counts = LocalMap::new("f", &[&[Shard(0)]]).in_placements(&[&[Shard(0)], &[Shard(0)]]);
        let e = counts.call(&[&x], |l| Ok(vec![l[0].clone()])).expect_err("two layouts for one input");
        assert!(e.to_string().contains("declares 2 input layouts for 1 inputs"), "{e}");
        // a layout for another mesh, a dim the tensor does not have: errors naming the function and input
        let mesh_dims = LocalMap::new("f", &[&[Shard(0)]]).in_placements(&[&[Shard(0), Replicate]]);
        let e = mesh_dims.call(&[&x], |l| Ok(vec![l[0].clone()])).expect_err("2 placements on a 1-d mesh");
        assert!(e.to_string().contains("local_map f") && e.to_string().contains("input 0"), "{e}");
        let grad_dim = LocalMap::new("f", &[&[Shard(0)]]).in_grad_placements(&[&[Shard(5)]]);
        let e = grad_dim.call(&[&x], |l| Ok(vec![l[0].clone()])).expect_err("a gradient sharded on dim 5 of 2");
        assert!(e.to_string().contains("gradient layout it declares for input 0"), "{e}");
        Ok(())
    })
    .unwrap();
}
