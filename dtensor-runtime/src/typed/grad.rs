//! Typed autograd: gradients whose layout the type system derives from the forward.
//!
//! Two rules, each on one mesh dim, lifted to layouts:
//!
//! - [`LeafGradRule`]: the layout of a leaf's accumulated gradient. The autograd engine
//!   reduces every gradient that reaches a leaf to the leaf's layout with its Partials made
//!   Replicate (`Shard<D>` → `Shard<D>`, `Replicate` → `Replicate`, `Partial<Op>` →
//!   `Replicate`), so [`Dt::grad`] returns a value whose type says it is reduced, never a
//!   partial sum that could be used as if it were one.
//! - [`LocalGradRule`] / [`FromLocalGradRule`]: the gradient layouts that may cross a
//!   local/global boundary. A local tensor has no layout, so the layout of its gradient is a
//!   promise the user makes; the rules refuse the promises that are wrong for every program:
//!   a `Shard<D>` value's gradient is sharded the same way, a Partial value's gradient is the
//!   whole (replicated) gradient. A `Replicate` value leaving for local code is the one real
//!   choice, and the type makes the user write it: `Replicate` when every rank uses its copy
//!   the same way (the local gradients are equal), `Partial<Sum>` when ranks use it
//!   differently (each local gradient is one term of the sum). This is the distinction Meta's
//!   `spmd_types` draws between an invariant and a varying replicated value, checked by rustc
//!   here instead of at run time.
//!
//! ```compile_fail,E0277
//! use dtensor_runtime::typed::{dims::tp, Dt, Replicate, Shard};
//! fn f(x: &Dt<f32, (tp,), (Shard<0>,), 2>) {
//!     // error: a `Shard<0>` value's local gradient is `Shard<0>`, not `Replicate`
//!     let _ = x.to_local_grad::<(Replicate,)>();
//! }
//! ```

use super::lift::{lift_binary, lift_unary, never_binary};
use super::markers::{Avg, Partial, ReduceMarker, Replicate, Shard, Sum};
use super::{Dt, MeshDims, TypedLayout};
use crate::autograd::BackwardOptions;
use crate::dtensor::{DTensor, FromLocal};
use crate::element::Element;
use crate::error::Result;
use crate::mesh::DeviceMesh;

/// The layout of a leaf's gradient on one mesh dim (hidden from the docs: its impls would
/// fill every marker's page).
#[doc(hidden)]
pub trait LeafGradRule<Name> {
    /// The gradient's placement on this mesh dim.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// The layout of a leaf's accumulated gradient (see [`LeafGradRule`]).
    LeafGradLayout,
    LeafGradRule
);

/// The layout of the gradient of a leaf laid out `L` on the mesh `M`.
pub type LeafGrad<L, M> = <L as LeafGradLayout<M>>::Out;

/// The typed gradient of a leaf `Dt<T, M, L, R>`.
pub type GradOf<T, M, L, const R: usize> = Dt<T, M, LeafGrad<L, M>, R>;

impl<N, const D: usize> LeafGradRule<N> for Shard<D> {
    type Out = Shard<D>;
}
impl<N> LeafGradRule<N> for Replicate {
    type Out = Replicate;
}
impl<N, Op: ReduceMarker> LeafGradRule<N> for Partial<Op> {
    type Out = Replicate;
}

/// Whether a value laid out `Self` on mesh dim `Name` may hand its local shard to local code
/// whose gradient is laid out `G` (hidden from the docs).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "a `{Self}` value's local gradient cannot be `{G}` on mesh dim `{Name}`",
    label = "gradient layout `{G}` is wrong for a `{Self}` value",
    note = "the gradient of a `Shard<D>` value is `Shard<D>`; of a `Partial<Sum>` or `Partial<Avg>` value, `Replicate`; of a `Replicate` value, `Replicate` when every rank uses its copy the same way or `Partial<Sum>` when the ranks use it differently"
)]
pub trait LocalGradRule<G, Name> {
    /// `G` (the relation has no output; the lift needs one).
    type Out: super::PlacementMarker;
}

lift_binary!(
    /// [`LocalGradRule`] on every mesh dim: the gradient layouts `Dt::to_local_grad` accepts.
    LocalGradLayout,
    LocalGradRule
);
never_binary!(LocalGradRule);

impl<N, const D: usize> LocalGradRule<Shard<D>, N> for Shard<D> {
    type Out = Shard<D>;
}
impl<N> LocalGradRule<Replicate, N> for Replicate {
    type Out = Replicate;
}
impl<N> LocalGradRule<Partial<Sum>, N> for Replicate {
    type Out = Partial<Sum>;
}
impl<N> LocalGradRule<Replicate, N> for Partial<Sum> {
    type Out = Replicate;
}
impl<N> LocalGradRule<Replicate, N> for Partial<Avg> {
    type Out = Replicate;
}

/// Whether a value laid out `Self` on mesh dim `Name`, built from local shards, may send its
/// gradient back to them laid out `G` (hidden from the docs).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "a `{Self}` value built from local shards cannot send its gradient back as `{G}` on mesh dim `{Name}`",
    label = "gradient layout `{G}` is wrong for a `{Self}` value",
    note = "the local shards of a `Shard<D>` value get their `Shard<D>` piece of the gradient; those of a `Replicate`, `Partial<Sum>` or `Partial<Avg>` value get the whole gradient (`Replicate`)"
)]
pub trait FromLocalGradRule<G, Name> {
    /// `G` (see [`LocalGradRule::Out`]).
    type Out: super::PlacementMarker;
}

lift_binary!(
    /// [`FromLocalGradRule`] on every mesh dim: the gradient layouts `Dt::from_local_grad`
    /// accepts.
    FromLocalGradLayout,
    FromLocalGradRule
);
never_binary!(FromLocalGradRule);

impl<N, const D: usize> FromLocalGradRule<Shard<D>, N> for Shard<D> {
    type Out = Shard<D>;
}
impl<N> FromLocalGradRule<Replicate, N> for Replicate {
    type Out = Replicate;
}
impl<N> FromLocalGradRule<Replicate, N> for Partial<Sum> {
    type Out = Replicate;
}
impl<N> FromLocalGradRule<Replicate, N> for Partial<Avg> {
    type Out = Replicate;
}

impl<T: Element, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// The accumulated gradient of a leaf (a parameter), `None` before any backward or for
    /// a tensor that is not a leaf. Its layout is the leaf's with Partials made Replicate:
    /// the engine reduces every gradient that reaches a leaf to it (the data-parallel sum of a
    /// replicated weight's gradient, for one), so the type says it is reduced.
    #[track_caller]
    pub fn grad(&self) -> Result<Option<GradOf<T, M, L, R>>>
    where
        L: LeafGradLayout<M>,
    {
        self.as_dtensor().grad().map(|g| Dt::from_op("grad", || Ok(g))).transpose()
    }

    /// Clears a leaf's gradient (PyTorch `zero_grad(set_to_none=True)`).
    pub fn zero_grad(&self) {
        self.as_dtensor().zero_grad()
    }

    /// Whether autograd records ops on this tensor.
    pub fn requires_grad(&self) -> bool {
        self.as_dtensor().requires_grad()
    }

    /// Whether this tensor is a leaf of the autograd graph (a parameter, or made without
    /// grad).
    pub fn is_leaf(&self) -> bool {
        self.as_dtensor().is_leaf()
    }

    /// The same values and layout, cut from the autograd graph.
    pub fn detach(&self) -> Self {
        Dt::from_dtensor_unchecked(self.as_dtensor().detach())
    }

    /// This rank's local shard as a local tensor with autograd (PyTorch
    /// `to_local(grad_placements=GL)`): local code may compute on it, and the gradient it
    /// sends back is taken as the local shard of a gradient laid out `GL`. `GL` must be a
    /// legal gradient layout for `L` ([`LocalGradRule`]); for a `Replicate` mesh dim, choose
    /// `Replicate` if every rank uses its copy the same way and `Partial<Sum>` if not.
    #[track_caller]
    pub fn to_local_grad<GL>(&self) -> Result<DTensor<T>>
    where
        L: LocalGradLayout<GL, M>,
        GL: TypedLayout<M>,
    {
        self.as_dtensor().to_local_grad(Some(&GL::placements()))
    }

    /// Wraps this rank's local tensor `local` (with autograd history) as a typed tensor of
    /// layout `L` on `mesh` (PyTorch `DTensor.from_local` of a tensor that requires grad).
    /// The gradient flowing back is redistributed to `GL` ([`FromLocalGradRule`]: the
    /// Partials of `L` made Replicate) and its local shard handed to `local`. `opts` gives the
    /// global shape for uneven shards; its `grad_placements` must be `None` (`GL` says it).
    #[track_caller]
    pub fn from_local_grad<GL>(local: &DTensor<T>, mesh: &DeviceMesh, opts: FromLocal) -> Result<Self>
    where
        L: FromLocalGradLayout<GL, M>,
        GL: TypedLayout<M>,
    {
        if opts.grad_placements.is_some() {
            return Err(crate::error::Error::InvalidArgument {
                context: "Dt::from_local_grad".into(),
                reason: "the gradient layout is the type parameter `GL`; leave `FromLocal::grad_placements` as None"
                    .into(),
            });
        }
        let opts = FromLocal { grad_placements: Some(GL::placements()), ..opts };
        Dt::from_dtensor(crate::autograd::from_local_grad(local, mesh, &L::placements(), opts)?)
    }
}

impl<T: Element, M: MeshDims, L: TypedLayout<M>> Dt<T, M, L, 0> {
    /// [`backward`](Dt::backward) with options: keeping the graph, reducing the leaf
    /// gradients in another dtype, overlapping their all-reduces with the rest of the pass
    /// (see [`DTensor::backward_opts`]).
    pub fn backward_opts(&self, opts: &BackwardOptions) -> Result<()> {
        self.as_dtensor().backward_opts(opts)
    }

    /// [`backward`](Dt::backward) that keeps the graph for another backward pass.
    pub fn backward_retaining_graph(&self) -> Result<()> {
        self.as_dtensor().backward_retaining_graph()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typed::dims::{dp, tp};
    use crate::typed::Shard;
    use ndarray::ArrayD;

    /// A data-parallel weight's typed gradient is the same value as the dynamic one, and its
    /// type (Replicate) is what the engine made: the Partial dp sum was reduced.
    #[test]
    fn typed_grad_is_the_dynamic_grad_reduced() {
        let out = crate::run(4, |ctx| {
            let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
            let w = ArrayD::from_shape_fn(vec![3, 4], |i| (i[0] * 4 + i[1]) as f64 * 0.25 - 1.0);
            let x = ArrayD::from_shape_fn(vec![6, 3], |i| (i[0] * 3 + i[1]) as f64 * 0.1);
            let w: Dt<f64, (dp, tp), (Replicate, Shard<1>), 2> = Dt::distribute(&w, &mesh)?.requires_grad_(true);
            let x: Dt<f64, (dp, tp), (Shard<0>, Replicate), 2> = Dt::distribute(&x, &mesh)?;
            assert!(w.is_leaf() && w.requires_grad() && !x.requires_grad());
            assert!(w.grad()?.is_none());
            let y = x.as_dtensor().matmul(w.as_dtensor())?;
            y.mul(&y)?.sum()?.backward()?;
            let g: Dt<f64, (dp, tp), (Replicate, Shard<1>), 2> = w.grad()?.expect("a leaf's gradient");
            let dynamic = w.as_dtensor().grad().unwrap();
            assert_eq!(g.to_host()?, dynamic.to_host()?);
            w.zero_grad();
            assert!(w.grad()?.is_none());
            assert!(!w.detach().requires_grad());
            g.full_tensor()
        })
        .unwrap();
        assert!(out.iter().all(|g| *g == out[0]));
    }

    /// `to_local_grad::<(Partial<Sum>,)>` of a replicated value whose ranks use it
    /// differently gives the true gradient; `Replicate` would have kept only this rank's term.
    #[test]
    fn a_varying_use_of_a_replicated_value_sums_the_local_gradients() {
        let out = crate::run(2, |ctx| {
            let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
            let w = ArrayD::from_shape_vec(vec![2], vec![1.0f64, 2.0]).unwrap();
            let w: Dt<f64, (tp,), (Replicate,), 1> = Dt::distribute(&w, &mesh)?.requires_grad_(true);
            let local = w.to_local_grad::<(Partial<Sum>,)>()?;
            // Rank r scales its copy by r + 1: d/dw Σ_r (r + 1)·Σ w = 1 + 2 = 3 per element.
            let scale = (mesh.rank() + 1) as f64;
            let local_loss = local.mul_scalar(scale)?.sum()?;
            let loss: Dt<f64, (tp,), (Partial<Sum>,), 0> =
                Dt::from_local_grad::<(Replicate,)>(&local_loss, &mesh, FromLocal::default())?;
            loss.backward()?;
            Ok(w.grad()?.unwrap().to_host()?.into_raw_vec_and_offset().0)
        })
        .unwrap();
        assert_eq!(out, vec![vec![3.0, 3.0]; 2]);
    }
}
