//! Typed `local_map`: a function on the local shards of typed tensors, whose input layouts are
//! their types, whose gradient layouts are type parameters checked by the local-gradient rules
//! ([`LocalGradRule`](super::grad::LocalGradRule)), and whose output layout is the result's
//! type. The dynamic [`LocalMap`] runs it; no input is ever redistributed (the types already
//! say the layout), so nothing communicates but what the function itself calls.
//!
//! ```
//! use dtensor_runtime::ndarray::ArrayD;
//! use dtensor_runtime::typed::{dims::tp, Dt, Partial, Replicate, Shard, Sum};
//!
//! let sums = dtensor_runtime::run(2, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
//!     let g = ArrayD::from_shape_fn(vec![4, 3], |i| (i[0] * 3 + i[1]) as f32);
//!     let x: Dt<f32, (tp,), (Shard<1>,), 2> = Dt::distribute(&g, &mesh)?;
//!     // row sums of the local columns: partial sums of the row sums (gradient: Shard<1>)
//!     let rows: Dt<f32, (tp,), (Partial<Sum>,), 1> =
//!         x.local_map::<(Shard<1>,), _, _>("local_row_sum", Some(&[4]), |l| l.sum_dim(1, false))?;
//!     rows.redistribute::<(Replicate,)>()?.full_tensor()
//! })
//! .unwrap();
//! assert_eq!(sums[0].as_slice().unwrap(), &[3.0, 12.0, 21.0, 30.0]);
//! ```
//!
//! A gradient layout that is wrong for every program does not compile:
//!
//! ```compile_fail,E0277
//! use dtensor_runtime::typed::{dims::tp, Dt, Replicate, Shard};
//! fn f(x: &Dt<f32, (tp,), (Shard<0>,), 2>) {
//!     // error: a `Shard<0>` value's local gradient cannot be `Replicate` on mesh dim `tp`
//!     let _: dtensor_runtime::Result<Dt<f32, (tp,), (Shard<0>,), 2>> =
//!         x.local_map::<(Replicate,), _, _>("f", None, |l| Ok(l.clone()));
//! }
//! ```

use super::grad::LocalGradLayout;
use super::{Dt, MeshDims, TypedLayout};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::Result;
use crate::ops::local_map::LocalMap;

impl<T: Element, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Runs `f` on this rank's local shard (a local tensor with autograd) and wraps its
    /// result as a typed tensor laid out `LO` of rank `RO` (PyTorch's `local_map` with
    /// `in_placements` = this type's layout). `GL` is the layout of this tensor's gradient
    /// ([`LocalGradRule`](super::grad::LocalGradRule)); the output's gradient is its layout
    /// with Partials made Replicate. `out_shape` is the output's global shape, needed when it
    /// is sharded (see [`LocalMap::out_shapes`]). Named `name` in
    /// errors and `CommDebugMode`.
    #[track_caller]
    pub fn local_map<GL, LO, const RO: usize>(
        &self,
        name: &'static str,
        out_shape: Option<&[usize]>,
        f: impl FnOnce(&DTensor<T>) -> Result<DTensor<T>>,
    ) -> Result<Dt<T, M, LO, RO>>
    where
        L: LocalGradLayout<GL, M>,
        GL: TypedLayout<M>,
        LO: TypedLayout<M>,
    {
        let spec = spec(name, &[&L::placements()], &[&GL::placements()], &LO::placements(), out_shape);
        typed_output(name, spec.call(&[self.as_dtensor()], |l| Ok(vec![f(&l[0])?]))?.remove(0))
    }

    /// [`local_map`](Dt::local_map) of this tensor and `rhs`: `GL` and `GL2` are their
    /// gradient layouts (`x.local_map2::<GL, GL2, _, _, _, _>(&y, ..)`: the others are inferred).
    #[track_caller]
    #[allow(clippy::type_complexity)] // one function, both operands' gradient layouts
    pub fn local_map2<GL, GL2, LO, L2, const R2: usize, const RO: usize>(
        &self,
        rhs: &Dt<T, M, L2, R2>,
        name: &'static str,
        out_shape: Option<&[usize]>,
        f: impl FnOnce(&DTensor<T>, &DTensor<T>) -> Result<DTensor<T>>,
    ) -> Result<Dt<T, M, LO, RO>>
    where
        L: LocalGradLayout<GL, M>,
        L2: LocalGradLayout<GL2, M>,
        GL: TypedLayout<M>,
        GL2: TypedLayout<M>,
        LO: TypedLayout<M>,
    {
        let spec = spec(
            name,
            &[&L::placements(), &L2::placements()],
            &[&GL::placements(), &GL2::placements()],
            &LO::placements(),
            out_shape,
        );
        typed_output(name, spec.call(&[self.as_dtensor(), rhs.as_dtensor()], |l| Ok(vec![f(&l[0], &l[1])?]))?.remove(0))
    }
}

/// The output as the typed tensor the caller declared; a mismatch (the function's output has
/// another rank) names the function.
#[track_caller]
fn typed_output<T: Element, M: MeshDims, L: TypedLayout<M>, const R: usize>(
    name: &str,
    out: DTensor<T>,
) -> Result<Dt<T, M, L, R>> {
    Dt::from_dtensor(out).map_err(|e| match e {
        crate::error::Error::TypedMismatch { what, expected, actual } => crate::error::Error::TypedMismatch {
            what: format!("output of local_map `{name}`: {what}"),
            expected,
            actual,
        },
        e => e,
    })
}

/// The dynamic spec of a typed `local_map`: the layouts come from the types.
fn spec(
    name: &'static str,
    inputs: &[&[crate::placement::Placement]],
    grads: &[&[crate::placement::Placement]],
    out: &[crate::placement::Placement],
    out_shape: Option<&[usize]>,
) -> LocalMap {
    let spec = LocalMap::new(name, &[out]).in_placements(inputs).in_grad_placements(grads);
    match out_shape {
        Some(s) => spec.out_shapes(&[s]),
        None => spec,
    }
}
