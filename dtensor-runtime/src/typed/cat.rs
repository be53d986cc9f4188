//! Typed `cat`: tensors of one layout concatenated along dim `D` keep it, under the slicing
//! rule ([`AlongRule`](super::slice::AlongRule)): a `Shard<D>` does not compile (the runtime
//! would gather the dim first), shards of other dims, `Replicate` and every `Partial` (cat is
//! linear) pass.
//!
//! Typed `stack` is the runtime's `unsqueeze` then `cat` along the new dim `D`: the layout
//! follows the unsqueeze rule (shards of dims `≥ D` shift up by one, see
//! [`inserted_dim`](super::view::inserted_dim)); the new dim is never sharded, so the cat
//! keeps everything and every layout stacks without communication.

use super::matmul::Rank;
use super::rank::RankPlus1;
use super::reduce::Dim;
use super::slice::{AlongLayout, Cat};
use super::view::{Unsqueeze, ViewLayout};
use super::{Dt, MeshDims, TypedLayout};
use crate::element::Scalar;
use crate::error::Result;
use crate::ops::cat::{cat, stack};

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
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
        Dt::from_op("cat", || cat(&dynamic, D as isize))
    }

    /// Stacks same-shape `tensors` (at least one, all of this type) along a new dim `D`
    /// (`0 ≤ D ≤ R`; PyTorch `torch.stack`); shards of dims `≥ D` shift up by one. The output
    /// rank `R + 1` is inferred.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dim, Dt, Shard};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let a: Dt<f32, (tp,), (Shard<1>,), 2> = Dt::distribute(&ndarray::ArrayD::zeros(vec![2, 3]), &mesh)?;
    ///     let b: Dt<f32, (tp,), (Shard<1>,), 2> = Dt::distribute(&ndarray::ArrayD::ones(vec![2, 3]), &mesh)?;
    ///     let c: Dt<f32, (tp,), (Shard<2>,), 3> = Dt::stack(&[&a, &b], Dim::<0>)?;
    ///     c.full_tensor()
    /// })
    /// .unwrap();
    /// assert_eq!(out[0].shape(), &[2, 2, 3]);
    /// assert_eq!(out[0].sum(), 6.0);
    /// ```
    #[allow(clippy::type_complexity)] // the output layout is a projection, spelled out once
    #[track_caller]
    pub fn stack<const D: usize, const R2: usize>(
        tensors: &[&Self],
        _dim: Dim<D>,
    ) -> Result<Dt<T, M, <L as ViewLayout<M, Unsqueeze<D>>>::Out, R2>>
    where
        L: ViewLayout<M, Unsqueeze<D>>,
        Rank<R>: RankPlus1<Out = Rank<R2>>,
    {
        const { assert!(D <= R, "`stack(.., Dim::<D>)`: D must be ≤ the tensor rank R") };
        let dynamic: Vec<_> = tensors.iter().map(|t| t.as_dtensor()).collect();
        Dt::from_op("stack", || stack(&dynamic, D as isize))
    }
}
