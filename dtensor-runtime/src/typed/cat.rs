//! Typed `cat`: tensors of one layout concatenated along dim `D` keep it, under the slicing
//! rule ([`AlongRule`](super::slice::AlongRule)): a `Shard<D>` does not compile (the runtime
//! would gather the dim first), shards of other dims, `Replicate` and every `Partial` (cat is
//! linear) pass.

use super::reduce::Dim;
use super::slice::{AlongLayout, Cat};
use super::{Dt, MeshDims, TypedLayout};
use crate::element::Element;
use crate::error::Result;
use crate::ops::cat::cat;

impl<T: Element, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Concatenates `tensors` (at least one, all of this type) along dim `D` (PyTorch
    /// `torch.cat`); the layout is kept.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dim, Dt, Shard};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let a: Dt<f32, (tp,), (Shard<0>,), 2> = Dt::distribute(&ndarray::ArrayD::zeros(vec![4, 2]), &mesh)?;
    ///     let b: Dt<f32, (tp,), (Shard<0>,), 2> = Dt::distribute(&ndarray::ArrayD::ones(vec![4, 3]), &mesh)?;
    ///     let c = Dt::cat(&[&a, &b], Dim::<1>)?;
    ///     c.full_tensor()
    /// })
    /// .unwrap();
    /// assert_eq!(out[0].shape(), &[4, 5]);
    /// assert_eq!(out[0].sum(), 12.0);
    /// ```
    #[track_caller]
    pub fn cat<const D: usize>(tensors: &[&Self], _dim: Dim<D>) -> Result<Self>
    where
        L: AlongLayout<M, Cat<D>>,
    {
        const { assert!(D < R, "`cat(.., Dim::<D>)`: D must be < the tensor rank R") };
        let dynamic: Vec<_> = tensors.iter().map(|t| t.as_dtensor()).collect();
        Dt::from_op("cat", cat(&dynamic, D as isize))
    }
}
