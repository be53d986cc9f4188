//! `Dt<T, M, L, R>`: a [`DTensor`] whose mesh dims `M`, layout `L` and rank `R` are types.

use super::dims::MeshDims;
use super::layout::TypedLayout;
use crate::dtensor::{distribute_tensor, DTensor};
use crate::element::{Element, Scalar};
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::placement::fmt_placements;
use crate::storage::Storage;
use ndarray::ArrayD;
use std::fmt;
use std::marker::PhantomData;

/// A typed distributed tensor: the dynamic [`DTensor`] plus, at the type level, the names of
/// the mesh dims (`M`, e.g. `(dp, tp)`), the layout (`L`, e.g. `(Shard<0>, Replicate)`) and
/// the tensor rank `R`.
///
/// It costs nothing at run time (`repr(transparent)` over the `DTensor`). Its ops only
/// compile for legal layouts and compute the output layout in the type system; an illegal
/// combination is a compile error that names the op, the markers and the mesh dim.
///
/// ```
/// use dtensor_runtime::typed::{dims::{dp, tp}, Dt, Replicate, Shard};
/// let ok = dtensor_runtime::run(4, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
///     let g = ndarray::ArrayD::<f32>::ones(vec![4, 6]);
///     let x: Dt<f32, (dp, tp), (Shard<0>, Replicate), 2> = Dt::distribute(&g, &mesh)?;
///     let y = x.redistribute::<(Replicate, Shard<1>)>()?;
///     Ok(y.local().shape().to_vec())
/// })
/// .unwrap();
/// assert_eq!(ok[0], vec![4, 3]);
/// ```
#[repr(transparent)]
pub struct Dt<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> {
    inner: DTensor<T>,
    _layout: PhantomData<fn() -> (M, L)>,
}

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Dt<T, M, L, R> {
    /// Evaluated (at `cargo build`) whenever a `Dt` is made: every `Shard<D>` of the layout
    /// must address a dim of a rank-`R` tensor. (Mixed Partial layouts are not `TypedLayout`s
    /// at all, an error `cargo check` already reports.)
    const VALID: () = {
        assert!(
            L::MIN_RANK <= R,
            "the layout shards a tensor dim that does not exist: every `Shard<D>` needs D < the tensor rank R of `Dt<T, M, L, R>`"
        );
    };

    /// Wraps a dynamic tensor after checking its mesh dim names, placements and rank; an
    /// error names the caller's line.
    #[track_caller]
    pub fn from_dtensor(x: DTensor<T>) -> Result<Self> {
        Self::check(&x, std::panic::Location::caller())?;
        Ok(Dt { inner: x, _layout: PhantomData })
    }

    /// [`Dt::from_dtensor`] on a reference, without a copy: a typed view of `x` after the same
    /// checks (what `#[distribute]` uses for the `&DTensor` arguments of a trait method, whose
    /// signature the trait fixes).
    #[track_caller]
    pub fn from_dtensor_ref(x: &DTensor<T>) -> Result<&Self> {
        Self::check(x, std::panic::Location::caller())?;
        // SAFETY: `Dt` is `repr(transparent)` over `DTensor<T>` (the other field is a
        // zero-sized `PhantomData`), so the two references have the same layout.
        Ok(unsafe { &*(x as *const DTensor<T> as *const Self) })
    }

    /// [`Dt::from_dtensor`] of a `#[distribute]` trait method's argument: an error also names
    /// the argument and the method, at the argument's place in the user's code (`file!()`,
    /// `line!()` there: `Location::caller` would name the attribute that generated the call).
    #[doc(hidden)]
    pub fn from_argument(x: DTensor<T>, arg: &'static str, function: &'static str, at: (&str, u32)) -> Result<Self> {
        Self::check(&x, &format_args!("{}:{}", at.0, at.1)).map_err(|e| e.in_argument(arg, function))?;
        Ok(Dt { inner: x, _layout: PhantomData })
    }

    /// [`Dt::from_dtensor_ref`] of a `#[distribute]` trait method's argument (see
    /// [`Dt::from_argument`]).
    #[doc(hidden)]
    pub fn from_argument_ref<'a>(
        x: &'a DTensor<T>,
        arg: &'static str,
        function: &'static str,
        at: (&str, u32),
    ) -> Result<&'a Self> {
        Self::check(x, &format_args!("{}:{}", at.0, at.1)).map_err(|e| e.in_argument(arg, function))?;
        // SAFETY: as in `from_dtensor_ref`.
        Ok(unsafe { &*(x as *const DTensor<T> as *const Self) })
    }

    /// The mesh dim names, rank and placements of `x` against the type; an error names `at`.
    fn check(x: &DTensor<T>, at: &dyn fmt::Display) -> Result<()> {
        let () = Self::VALID;
        let names = M::names();
        if x.device_mesh().dim_names() != names.as_slice() {
            return Err(Error::TypedMismatch {
                what: format!("mesh dims (at {at})"),
                expected: format!("mesh ({})", names.join(", ")),
                actual: format!("mesh ({})", x.device_mesh().dim_names().join(", ")),
            });
        }
        if x.ndim() != R {
            return Err(Error::TypedMismatch {
                what: format!("tensor rank (at {at})"),
                expected: R.to_string(),
                actual: format!("{} (shape {:?})", x.ndim(), x.shape()),
            });
        }
        let want = L::placements();
        if x.placements() != want.as_slice() {
            return Err(Error::TypedMismatch {
                what: format!("layout (at {at})"),
                expected: format!("layout {} on mesh ({})", fmt_placements(&want), names.join(", ")),
                actual: format!("{}: call `.redistribute()`", fmt_placements(x.placements())),
            });
        }
        Ok(())
    }

    /// Wraps `x` without the checks: for a dynamic tensor made from a `Dt` of this very type
    /// by an operation that keeps mesh, rank and placements (`detach`).
    pub(crate) fn from_dtensor_unchecked(x: DTensor<T>) -> Self {
        Dt { inner: x, _layout: PhantomData }
    }

    /// Distributes a global tensor with this type's layout (`src_data_rank = 0`).
    ///
    /// Errors if the mesh dim names or the tensor rank differ from the type, or if the layout
    /// holds a `Partial` (a global tensor has no partial form).
    #[track_caller]
    pub fn distribute(global: &ArrayD<T>, mesh: &DeviceMesh) -> Result<Self> {
        let () = Self::VALID;
        Self::check_mesh(mesh)?;
        if global.ndim() != R {
            return Err(Error::TypedMismatch {
                what: "tensor rank".into(),
                expected: R.to_string(),
                actual: format!("{} (shape {:?})", global.ndim(), global.shape()),
            });
        }
        Self::from_dtensor(distribute_tensor(global, mesh, &L::placements(), Some(0))?)
    }

    fn check_mesh(mesh: &DeviceMesh) -> Result<()> {
        let names = M::names();
        if mesh.dim_names() != names.as_slice() {
            return Err(Error::TypedMismatch {
                what: "mesh dims".into(),
                expected: format!("{names:?}"),
                actual: format!("{:?}", mesh.dim_names()),
            });
        }
        Ok(())
    }

    /// Redistributes to the layout `L2` (runs the collectives). A target without meaning
    /// (`Shard` → `Partial`, `Partial<A>` → `Partial<B>`; the runtime's table) does not compile.
    #[track_caller]
    pub fn redistribute<L2>(&self) -> Result<Dt<T, M, L2, R>>
    where
        L: super::redistribute::RedistributeLayout<L2, M>,
        L2: TypedLayout<M>,
    {
        Dt::from_dtensor(self.inner.redistribute(&L2::placements())?)
    }

    /// Redistributes to the layout of `like` (a typed tensor of any element type on the same
    /// mesh, with the same rank): `y.redistribute_like(&x)` is `y.redistribute::<Lx>()` without
    /// naming `Lx`. Inside a `#[distribute]` function, `x.add(&y.redistribute()?)` (and `sub`,
    /// `mul`, `div`, the comparison masks) means this: the operand takes the layout the op
    /// needs beside the receiver's (the receiver's own, except that a `Partial` receiver of
    /// `mul`/`div` takes a `Replicate` operand there), since the op alone cannot choose among
    /// its legal partners.
    ///
    /// ```
    /// use dtensor_runtime::typed::{dims::tp, Dt, Partial, Replicate, Sum};
    /// let out = dtensor_runtime::run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let x: Dt<f32, (tp,), (Replicate,), 1> = Dt::distribute(&ndarray::arr1(&[1.0, 2.0]).into_dyn(), &mesh)?;
    ///     let p: Dt<f32, (tp,), (Partial<Sum>,), 1> = x.redistribute()?;
    ///     x.add(&p.redistribute_like(&x)?)?.full_tensor() // one all-reduce, then a local add
    /// })
    /// .unwrap();
    /// assert_eq!(out[0].as_slice().unwrap(), &[2.0, 4.0]);
    /// ```
    #[track_caller]
    pub fn redistribute_like<U: Scalar, L2>(&self, like: &Dt<U, M, L2, R>) -> Result<Dt<T, M, L2, R>>
    where
        L: super::redistribute::RedistributeLayout<L2, M>,
        L2: TypedLayout<M>,
    {
        let _ = like;
        self.redistribute()
    }

    /// What `#[distribute]` writes for `x.op(&y.redistribute()?)`: `y` redistributed to the
    /// layout op `K` needs beside `like`'s ([`operand`](super::operand)).
    #[doc(hidden)]
    #[track_caller]
    pub fn redistribute_operand<K, U: Scalar, L2>(
        &self,
        like: &Dt<U, M, L2, R>,
    ) -> Result<Dt<T, M, <L2 as super::operand::OperandLayout<K, M>>::Target, R>>
    where
        L2: TypedLayout<M> + super::operand::OperandLayout<K, M>,
        L: super::redistribute::RedistributeLayout<<L2 as super::operand::OperandLayout<K, M>>::Target, M>,
    {
        let _ = like;
        self.redistribute()
    }

    /// Element-type conversion with the same layout (see [`DTensor::cast`]; integer to
    /// integer is exact with Rust's `as` semantics, float to integer truncates and saturates).
    /// A `Partial` layout whose reduction the conversion would change (a float `Partial<Sum>`
    /// into an integer, for one) is an [`Error::PartialNotAllowed`]:
    /// redistribute first.
    /// The way from integer ids to float arithmetic: `ids.cast::<f32>()?.exp()`.
    #[track_caller]
    pub fn cast<U: Scalar>(&self) -> Result<Dt<U, M, L, R>> {
        Dt::from_op("cast", || self.inner.cast::<U>())
    }

    /// This rank's local shard, where it lives (see [`DTensor::local`]).
    pub fn local(&self) -> &Storage<T> {
        self.inner.local()
    }

    /// This rank's local shard as a host array (see [`DTensor::local_cpu`]).
    pub fn local_cpu(&self) -> Result<&ArrayD<T>> {
        self.inner.local_cpu()
    }

    /// A host copy of this rank's local shard (see [`DTensor::to_host`]).
    pub fn to_host(&self) -> Result<ArrayD<T>> {
        self.inner.to_host()
    }

    /// This rank's local shard, owned, on its device.
    pub fn to_local(&self) -> Storage<T> {
        self.inner.to_local()
    }

    /// The global tensor on every rank, on the host (all-gathers / all-reduces as needed).
    pub fn full_tensor(&self) -> Result<ArrayD<T>> {
        self.inner.full_tensor()
    }

    /// Global shape.
    pub fn shape(&self) -> &[usize] {
        self.inner.shape()
    }

    /// The mesh.
    pub fn device_mesh(&self) -> &DeviceMesh {
        self.inner.device_mesh()
    }

    /// The dynamic placements (always `L`'s).
    pub fn placements(&self) -> &[crate::placement::Placement] {
        self.inner.placements()
    }

    /// The dynamic tensor. There is deliberately no `Deref` to it: a typed op whose rule does
    /// not hold must fail to compile, not fall back to the dynamic op of the same name.
    pub fn as_dtensor(&self) -> &DTensor<T> {
        &self.inner
    }

    /// The dynamic tensor, mutably: for in-place updates of the local values (an optimizer
    /// step). Changing its mesh, placements or shape through it breaks the type's promise;
    /// the next typed op then reports a [`Error::TypedMismatch`].
    pub fn as_dtensor_mut(&mut self) -> &mut DTensor<T> {
        &mut self.inner
    }

    /// Sets whether autograd records ops on this tensor (parameters do); see
    /// [`DTensor::requires_grad_`].
    pub fn requires_grad_(self, requires_grad: bool) -> Self
    where
        T: Element,
    {
        Dt { inner: self.inner.requires_grad_(requires_grad), _layout: PhantomData }
    }

    /// Unwraps into the dynamic tensor (free).
    pub fn into_dtensor(self) -> DTensor<T> {
        self.inner
    }

    /// Runs the dynamic op `run` of the typed op `op` and wraps its output, whose layout the
    /// type system computed. `run` may not redistribute an input in a way that communicates
    /// (the rule promised the layout without a collective): such a move is refused before
    /// anything is sent ([`Error::TypedOpCollective`], naming the caller's line). The output
    /// check is a comparison of a few placements; it guards against the dynamic op and the
    /// typed rule ever disagreeing.
    #[track_caller]
    pub(crate) fn from_op(op: &'static str, run: impl FnOnce() -> Result<DTensor<T>>) -> Result<Self> {
        let out = {
            let _typed = crate::ops::implicit::typed_op(op, std::panic::Location::caller());
            run()
        };
        Self::from_dtensor(out?).map_err(|e| match e {
            Error::TypedMismatch { what, expected, actual } => {
                Error::TypedMismatch { what: format!("output of typed `{op}`: {what}"), expected, actual }
            }
            e => e,
        })
    }
}

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>> Dt<T, M, L, 0> {
    /// Backpropagates from this scalar (a loss, whatever its layout: a `Partial` loss is
    /// summed by the autograd engine); gradients accumulate into the leaves' `.grad()`. Only
    /// rank 0 has it: the type says the tensor has one element. See [`DTensor::backward`].
    pub fn backward(&self) -> Result<()>
    where
        T: Element,
    {
        self.inner.backward()
    }
}

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> Clone for Dt<T, M, L, R> {
    fn clone(&self) -> Self {
        Dt { inner: self.inner.clone(), _layout: PhantomData }
    }
}

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> TryFrom<DTensor<T>> for Dt<T, M, L, R> {
    type Error = Error;
    #[track_caller]
    fn try_from(x: DTensor<T>) -> Result<Self> {
        Self::from_dtensor(x)
    }
}

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> From<Dt<T, M, L, R>> for DTensor<T> {
    fn from(x: Dt<T, M, L, R>) -> DTensor<T> {
        x.inner
    }
}

impl<T: Scalar, M: MeshDims, L: TypedLayout<M>, const R: usize> fmt::Debug for Dt<T, M, L, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Dt<{}, rank {R}>({:?})", std::any::type_name::<L>(), self.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typed::dims::{dp, tp};
    use crate::typed::{Replicate, Shard};

    #[test]
    fn a_wrong_layout_names_the_callers_line() {
        let errs = crate::run(2, |ctx| {
            let mesh = ctx.init_device_mesh(&[1, 2], &["dp", "tp"])?;
            let x = distribute_tensor(
                ArrayD::<f32>::zeros(vec![2, 2]),
                &mesh,
                &[crate::placement::Placement::Replicate, crate::placement::Placement::Replicate],
                Some(0),
            )?;
            let line = line!() + 1;
            let e = Dt::<f32, (dp, tp), (Shard<0>, Replicate), 2>::try_from(x).unwrap_err();
            Ok((e.to_string(), line))
        })
        .unwrap();
        for (e, line) in errs {
            assert!(e.contains(&format!("tensor.rs:{line}")), "{e}");
        }
    }
}
