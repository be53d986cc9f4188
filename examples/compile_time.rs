//! Layouts checked by the compiler: `cargo run --example compile_time`.
//!
//! `#[distribute]` turns a struct's `DTensor` fields and a function's `DTensor` arguments into
//! typed tensors `Dt<T, Mesh, Layout, RANK>`; every op inside the function must have a
//! sharding rule for its operands' layouts, and every call must pass the declared layouts.
//! The program below compiles and runs. The three illegal variants after it do not compile;
//! their errors, copied from the UI tests (`ui-tests/tests/ui/fail/*.stderr`, rustc 1.95), are
//! in the comments.

use dtensor::typed::dims::{dp, tp};
use dtensor::{distribute, DTensor, Dt, Replicate, Shard};

/// A column-parallel projection: the weight's output features are split over `tp`.
#[distribute(mesh = "dp,tp")]
pub struct Proj {
    #[placements = [Replicate, Shard(1)]]
    pub w: DTensor<f32>,
}

/// Batch sharded over dp, replicated over tp: `(Shard<0>, Replicate) @ (Replicate, Shard<1>)`
/// is legal and gives `(Shard<0>, Shard<1>)`, the declared result. No communication.
#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate], returns = [Shard(0), Shard(1)])]
fn project(x: &DTensor<f32>, p: &Proj) -> dtensor::Result<DTensor<f32>> {
    x.matmul(&p.w)
}

fn main() -> dtensor::Result<()> {
    let x = dtensor::ndarray::ArrayD::from_shape_fn(vec![4, 3], |ix| (ix[0] + ix[1]) as f32);
    let w = dtensor::ndarray::ArrayD::from_shape_fn(vec![3, 6], |ix| (ix[0] * 6 + ix[1]) as f32 * 0.1);
    let shapes = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let proj = Proj::distribute(ProjGlobal { w: w.clone() }, &mesh)?;
        let xd: Dt<f32, (dp, tp), (Shard<0>, Replicate), 2> = Dt::distribute(&x, &mesh)?;
        let y = project(&xd, &proj)?; // y: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2>
        let full = y.full_tensor()?;
        Ok((y.placements().to_vec(), y.local().shape().to_vec(), full))
    })?;
    // The single-device result (both arrays are 2-d by construction).
    fn d2(a: &dtensor::ndarray::ArrayD<f32>) -> dtensor::ndarray::ArrayView2<'_, f32> {
        a.view().into_dimensionality().expect("2-d")
    }
    let expected = d2(&x).dot(&d2(&w)).into_dyn();
    for (rank, (placements, local, full)) in shapes.iter().enumerate() {
        println!("rank {rank}: y placements {placements:?}, local shard {local:?}");
        assert_eq!(full, &expected, "rank {rank}: the full tensor differs from the single-device x @ w");
    }
    println!("the full tensor equals the single-device x @ w on every rank");
    Ok(())
}

// 1. An op with no sharding rule inside a #[distribute] function
//    (ui-tests/tests/ui/fail/macro_fn_body_rule.rs):
//
//    #[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
//    fn project(x: &DTensor<f32>, w: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
//        x.matmul(w)
//    }
//
// error[E0277]: matmul of `dtensor::Shard<0>` × `dtensor::Shard<0>` on mesh dim `dp` is not a legal layout: redistribute one side first
//  --> tests/ui/fail/macro_fn_body_rule.rs:6:14
//   |
// 6 |     x.matmul(w)
//   |       ------ ^ no matmul sharding rule for `dtensor::Shard<0>` × `dtensor::Shard<0>` on mesh dim `dp`
//   |       |
//   |       required by a bound introduced by this call
//   |
//   = help: the trait `dtensor::typed::MatmulRule<dtensor::Shard<0>, dp, Rank<2>>` is not implemented for `dtensor::Shard<0>`
//   = note: legal per mesh dim ([.., m, k] @ [k, n]): R×R→R, S(m or batch)×R→S, R×S(n)→S(n), S(k)×S(k)→Partial<Sum>, P×R→P, R×P→P (P = Partial<Sum|Avg>)
//   (... the list of implemented rules follows)
//
// 2. A call with a tensor of another layout (ui-tests/tests/ui/fail/macro_fn_wrong_layout.rs):
//
//    #[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
//    fn scale(x: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
//        x.add(x)
//    }
//
//    fn caller(y: &Dt<f32, (dp, tp), (Replicate, Shard<1>), 2>) {
//        let _ = scale(y);
//    }
//
// error[E0308]: mismatched types
//   --> tests/ui/fail/macro_fn_wrong_layout.rs:11:19
//    |
// 11 |     let _ = scale(y);
//    |             ----- ^ expected `&Dt<f32, (dp, tp), (Shard<0>, ...), 2>`, found `&Dt<f32, (dp, tp), (Replicate, ...), 2>`
//    |             |
//    |             arguments to this function are incorrect
//    |
//    = note: expected reference `&Dt<f32, (dp, tp), (dtensor::Shard<0>, dtensor::Replicate), 2>`
//               found reference `&Dt<f32, (dp, tp), (dtensor::Replicate, dtensor::Shard<1>), 2>`
//
// 3. A Partial parameter (ui-tests/tests/ui/fail/macro_partial_parameter.rs):
//
//    #[distribute(mesh = "dp,tp")]
//    pub struct Layer {
//        #[placements = [Replicate, Partial(Sum)]]
//        pub w: DTensor<f32>,
//    }
//
// error: `w` is a parameter and cannot be `Partial` (mesh dim `tp`): parameters hold real values; use `Replicate` or `Shard(d)`
//  --> tests/ui/fail/macro_partial_parameter.rs:6:32
//   |
// 6 |     #[placements = [Replicate, Partial(Sum)]]
//   |                                ^^^^^^^^^^^^
