//! [`Parameters`]: what a field of a `#[distribute]` struct contributes to the struct's
//! parameters. The macro sees only syntax, so it cannot tell a nested `#[distribute]` struct
//! from plain data; instead every field type must implement this trait, and a type that does
//! not (a `DTensor` hidden behind a type alias, a foreign type) is a compile error at the field,
//! never a parameter silently left out of `named_parameters`.
//!
//! Implemented for typed tensors ([`Dt`]: one parameter), every `#[distribute]` struct (its
//! parameters under the field's name), `Vec`, `[_; N]` (`name.0`, `name.1`, ...), `Option` and
//! `Box` of those, and plain data (numbers, `bool`, `char`, `String`, `&'static str`, `()`,
//! `PhantomData`): no parameters. Mark any other field `#[distribute(skip)]`.
//!
//! A field marked `#[distribute(buffer)]` holds tensors of the same kinds that are not
//! parameters: the struct lists them through [`Parameters::collect_buffers`] instead, and
//! builds them through [`into_buffers`] (detached, never requiring grad).

use super::lift::lift_unary;
use super::source::{plain_field, TensorSource};
use super::{Dt, MeshDims, TypedLayout};
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::Result;
use crate::mesh::DeviceMesh;
#[doc(hidden)]
pub use crate::names::{join, matches_pattern};
use crate::placement::Placement;
use ndarray::ArrayD;
use std::marker::PhantomData;

/// The parameters a field of a `#[distribute]` struct holds, by dotted name.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a parameter, module or plain-data field of a `#[distribute]` struct",
    label = "#[distribute] cannot type this field",
    note = "a field may be `DTensor<T>` written out with `#[placements = [..]]` (not through a type alias), another `#[distribute]` struct, a `Vec`, `Option`, `Box` or `[_; N]` of those, or plain data (numbers, `bool`, `String`)",
    note = "mark a field that holds no parameters `#[distribute(skip)]`"
)]
pub trait Parameters<T: Element>: Sized {
    /// The global (not yet distributed) form: `ArrayD<T>` for a tensor, `Self` for plain data.
    type Global;
    /// Distributes the global form over `mesh` with the declared placements; parameters
    /// require grad.
    fn distribute_global(global: Self::Global, mesh: &DeviceMesh) -> Result<Self>;
    /// Appends every parameter under `prefix` (`""`: at the top).
    fn collect_parameters<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a DTensor<T>)>);
    /// Same, mutably.
    fn collect_parameters_mut<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut DTensor<T>)>);
    /// Appends the declared placements of every parameter under `prefix`.
    fn collect_placements(&self, prefix: &str, out: &mut Vec<(String, Vec<Placement>)>);
    /// Appends the declared placements by name pattern, without an instance: a container's
    /// indices are `*` (`blocks.*.w1`).
    fn collect_patterns(prefix: &str, out: &mut Vec<(String, Vec<Placement>)>);
    /// Builds the value from `source` under `prefix`, each parameter laid out with its
    /// declared placements as it is read (no full-size copy first); parameters require grad.
    /// A `Vec` takes as many elements as the source has indices, an `Option` is `Some` when the
    /// source holds something under its name; plain data is an error naming the field.
    fn load_parameters(source: &mut dyn TensorSource<T>, prefix: &str) -> Result<Self>;
    /// Appends every buffer under `prefix` (a `#[distribute(buffer)]` field's tensors; a bare
    /// tensor in a parameter position holds none).
    fn collect_buffers<'a>(&'a self, _prefix: &str, _out: &mut Vec<(String, &'a DTensor<T>)>) {}
    /// Same, mutably.
    fn collect_buffers_mut<'a>(&'a mut self, _prefix: &str, _out: &mut Vec<(String, &'a mut DTensor<T>)>) {}
}

/// `p` with every tensor it holds made a buffer: detached, never requiring grad (what
/// `#[distribute(buffer)]` fields are built through).
pub fn into_buffers<T: Element, P: Parameters<T>>(mut p: P) -> P {
    let mut out = Vec::new();
    p.collect_parameters_mut("", &mut out);
    for (_, t) in out {
        *t = t.detach();
    }
    p
}

/// What a `#[distribute]` struct's `named_parameters`, `named_parameters_mut`, `named_buffers`,
/// `named_buffers_mut`, `parameter_placements` and `partition` run: the generated methods are
/// one call each (less code for every struct to compile), the work is here once.
#[doc(hidden)]
pub mod generated {
    use super::*;

    /// Every parameter of `p` by dotted name.
    pub fn named_parameters<T: Element, P: Parameters<T>>(p: &P) -> Vec<(String, &DTensor<T>)> {
        let mut out = Vec::new();
        p.collect_parameters("", &mut out);
        out
    }

    /// Same, mutably.
    pub fn named_parameters_mut<T: Element, P: Parameters<T>>(p: &mut P) -> Vec<(String, &mut DTensor<T>)> {
        let mut out = Vec::new();
        p.collect_parameters_mut("", &mut out);
        out
    }

    /// Every buffer of `p` by dotted name.
    pub fn named_buffers<T: Element, P: Parameters<T>>(p: &P) -> Vec<(String, &DTensor<T>)> {
        let mut out = Vec::new();
        p.collect_buffers("", &mut out);
        out
    }

    /// Same, mutably.
    pub fn named_buffers_mut<T: Element, P: Parameters<T>>(p: &mut P) -> Vec<(String, &mut DTensor<T>)> {
        let mut out = Vec::new();
        p.collect_buffers_mut("", &mut out);
        out
    }

    /// The declared placements of every parameter of `p` by dotted name.
    pub fn parameter_placements<T: Element, P: Parameters<T>>(p: &P) -> Vec<(String, Vec<Placement>)> {
        let mut out = Vec::new();
        p.collect_placements("", &mut out);
        out
    }

    /// The struct's mesh dims against `mesh`'s (a typed mismatch naming both).
    pub fn check_mesh(mesh: &DeviceMesh, dims: &[&str]) -> Result<()> {
        if mesh.dim_names() != dims {
            return Err(crate::error::Error::TypedMismatch {
                what: "mesh dims".into(),
                expected: format!("{dims:?}"),
                actual: format!("{:?}", mesh.dim_names()),
            });
        }
        Ok(())
    }

    /// The placements `P` declares for the parameter called `name` (none: not one of them),
    /// after [`check_mesh`].
    pub fn partition<T: Element, P: Parameters<T>>(
        name: &str,
        mesh: &DeviceMesh,
        dims: &[&str],
    ) -> Result<Option<Vec<Placement>>> {
        check_mesh(mesh, dims)?;
        let mut patterns = Vec::new();
        P::collect_patterns("", &mut patterns);
        Ok(patterns.into_iter().find(|(p, _)| matches_pattern(p, name)).map(|(_, p)| p))
    }
}

/// `P::collect_patterns` for the type `P` of the struct field that `field` projects to, so
/// that generated code need not repeat the field's type.
#[doc(hidden)]
pub fn field_patterns<T: Element, S, P: Parameters<T>>(
    _field: fn(&S) -> &P,
    prefix: &str,
    out: &mut Vec<(String, Vec<Placement>)>,
) {
    P::collect_patterns(prefix, out);
}

/// Whether a parameter may be laid out `Self` on mesh dim `Name`: `Shard<D>` or `Replicate`,
/// never a `Partial` (hidden from the docs). The macro refuses `#[placements = [Partial(..)]]`
/// on a field; this refuses a field written directly as `Dt<.., Partial<..>, ..>`.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "a parameter cannot be laid out `{Self}` on mesh dim `{Name}`: parameters hold real values, not partial sums",
    label = "a parameter field must be `Shard<D>` or `Replicate` here",
    note = "a `Partial` value is an activation or a loss; declare the parameter `Replicate` or `Shard<D>`"
)]
pub trait ParameterRule<Name> {
    /// The same marker.
    type Out: super::PlacementMarker;
}

lift_unary!(
    /// [`ParameterRule`] on every mesh dim: the layouts a parameter of a `#[distribute]`
    /// struct may have.
    ParameterLayout,
    ParameterRule
);

impl<N, const D: usize> ParameterRule<N> for super::Shard<D> {
    type Out = super::Shard<D>;
}
impl<N> ParameterRule<N> for super::Replicate {
    type Out = super::Replicate;
}

impl<T: Element, M: MeshDims, L: TypedLayout<M> + ParameterLayout<M>, const R: usize> Parameters<T> for Dt<T, M, L, R> {
    type Global = ArrayD<T>;
    fn distribute_global(global: ArrayD<T>, mesh: &DeviceMesh) -> Result<Self> {
        Ok(Dt::distribute(&global, mesh)?.requires_grad_(true))
    }
    fn collect_parameters<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a DTensor<T>)>) {
        out.push((prefix.to_string(), self.as_dtensor()));
    }
    fn collect_parameters_mut<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut DTensor<T>)>) {
        out.push((prefix.to_string(), self.as_dtensor_mut()));
    }
    fn collect_placements(&self, prefix: &str, out: &mut Vec<(String, Vec<Placement>)>) {
        Self::collect_patterns(prefix, out);
    }
    fn collect_patterns(prefix: &str, out: &mut Vec<(String, Vec<Placement>)>) {
        out.push((prefix.to_string(), L::placements()));
    }
    fn load_parameters(source: &mut dyn TensorSource<T>, prefix: &str) -> Result<Self> {
        let x = source.tensor(prefix, &L::placements())?;
        if x.ndim() != R {
            return Err(crate::error::Error::TypedMismatch {
                what: format!("rank of the tensor loaded for the parameter `{prefix}`"),
                expected: format!("{R} (its declared type)"),
                actual: format!("{} (shape {:?})", x.ndim(), x.shape()),
            });
        }
        // A source handing out existing parameters (`Fsdp::shards`) keeps each as it is (its
        // leaf and gradient); a tensor read from storage becomes a new leaf.
        let x = if source.hands_out_parameters() { x } else { x.requires_grad_(true) };
        Dt::from_dtensor(x)
    }
}

/// A sequence's elements under `prefix.0`, `prefix.1`, ... (shared by `Vec` and arrays).
mod indexed {
    use super::*;

    pub(super) fn collect<'a, T: Element, P: Parameters<T>>(
        items: &'a [P],
        prefix: &str,
        out: &mut Vec<(String, &'a DTensor<T>)>,
    ) {
        for (i, p) in items.iter().enumerate() {
            p.collect_parameters(&join(prefix, &i.to_string()), out);
        }
    }

    pub(super) fn collect_mut<'a, T: Element, P: Parameters<T>>(
        items: &'a mut [P],
        prefix: &str,
        out: &mut Vec<(String, &'a mut DTensor<T>)>,
    ) {
        for (i, p) in items.iter_mut().enumerate() {
            p.collect_parameters_mut(&join(prefix, &i.to_string()), out);
        }
    }

    pub(super) fn buffers<'a, T: Element, P: Parameters<T>>(
        items: &'a [P],
        prefix: &str,
        out: &mut Vec<(String, &'a DTensor<T>)>,
    ) {
        for (i, p) in items.iter().enumerate() {
            p.collect_buffers(&join(prefix, &i.to_string()), out);
        }
    }

    pub(super) fn buffers_mut<'a, T: Element, P: Parameters<T>>(
        items: &'a mut [P],
        prefix: &str,
        out: &mut Vec<(String, &'a mut DTensor<T>)>,
    ) {
        for (i, p) in items.iter_mut().enumerate() {
            p.collect_buffers_mut(&join(prefix, &i.to_string()), out);
        }
    }

    pub(super) fn placements<T: Element, P: Parameters<T>>(
        items: &[P],
        prefix: &str,
        out: &mut Vec<(String, Vec<Placement>)>,
    ) {
        for (i, p) in items.iter().enumerate() {
            p.collect_placements(&join(prefix, &i.to_string()), out);
        }
    }
}

impl<T: Element, P: Parameters<T>> Parameters<T> for Vec<P> {
    type Global = Vec<P::Global>;
    fn load_parameters(source: &mut dyn TensorSource<T>, prefix: &str) -> Result<Self> {
        (0..source.count(prefix)).map(|i| P::load_parameters(source, &join(prefix, &i.to_string()))).collect()
    }
    fn distribute_global(global: Self::Global, mesh: &DeviceMesh) -> Result<Self> {
        global.into_iter().map(|g| P::distribute_global(g, mesh)).collect()
    }
    fn collect_parameters<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a DTensor<T>)>) {
        indexed::collect(self, prefix, out);
    }
    fn collect_parameters_mut<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut DTensor<T>)>) {
        indexed::collect_mut(self, prefix, out);
    }
    fn collect_placements(&self, prefix: &str, out: &mut Vec<(String, Vec<Placement>)>) {
        indexed::placements(self, prefix, out);
    }
    fn collect_buffers<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a DTensor<T>)>) {
        indexed::buffers(self, prefix, out);
    }
    fn collect_buffers_mut<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut DTensor<T>)>) {
        indexed::buffers_mut(self, prefix, out);
    }
    fn collect_patterns(prefix: &str, out: &mut Vec<(String, Vec<Placement>)>) {
        P::collect_patterns(&join(prefix, "*"), out);
    }
}

impl<T: Element, P: Parameters<T>, const N: usize> Parameters<T> for [P; N] {
    type Global = [P::Global; N];
    fn load_parameters(source: &mut dyn TensorSource<T>, prefix: &str) -> Result<Self> {
        let v: Vec<P> =
            (0..N).map(|i| P::load_parameters(source, &join(prefix, &i.to_string()))).collect::<Result<_>>()?;
        Ok(v.try_into().unwrap_or_else(|_| unreachable!("N elements in, N out")))
    }
    fn distribute_global(global: Self::Global, mesh: &DeviceMesh) -> Result<Self> {
        let v: Vec<P> = global.into_iter().map(|g| P::distribute_global(g, mesh)).collect::<Result<_>>()?;
        // `v` has exactly N elements (one per element of `global`).
        Ok(v.try_into().unwrap_or_else(|_| unreachable!("N elements in, N out")))
    }
    fn collect_parameters<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a DTensor<T>)>) {
        indexed::collect(self, prefix, out);
    }
    fn collect_parameters_mut<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut DTensor<T>)>) {
        indexed::collect_mut(self, prefix, out);
    }
    fn collect_placements(&self, prefix: &str, out: &mut Vec<(String, Vec<Placement>)>) {
        indexed::placements(self, prefix, out);
    }
    fn collect_buffers<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a DTensor<T>)>) {
        indexed::buffers(self, prefix, out);
    }
    fn collect_buffers_mut<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut DTensor<T>)>) {
        indexed::buffers_mut(self, prefix, out);
    }
    fn collect_patterns(prefix: &str, out: &mut Vec<(String, Vec<Placement>)>) {
        P::collect_patterns(&join(prefix, "*"), out);
    }
}

/// `Some(p)` holds `p`'s parameters under the field's own name; `None` holds none.
impl<T: Element, P: Parameters<T>> Parameters<T> for Option<P> {
    type Global = Option<P::Global>;
    fn load_parameters(source: &mut dyn TensorSource<T>, prefix: &str) -> Result<Self> {
        if source.contains(prefix) {
            P::load_parameters(source, prefix).map(Some)
        } else {
            Ok(None)
        }
    }
    fn distribute_global(global: Self::Global, mesh: &DeviceMesh) -> Result<Self> {
        global.map(|g| P::distribute_global(g, mesh)).transpose()
    }
    fn collect_parameters<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a DTensor<T>)>) {
        if let Some(p) = self {
            p.collect_parameters(prefix, out);
        }
    }
    fn collect_parameters_mut<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut DTensor<T>)>) {
        if let Some(p) = self {
            p.collect_parameters_mut(prefix, out);
        }
    }
    fn collect_placements(&self, prefix: &str, out: &mut Vec<(String, Vec<Placement>)>) {
        if let Some(p) = self {
            p.collect_placements(prefix, out);
        }
    }
    fn collect_buffers<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a DTensor<T>)>) {
        if let Some(p) = self {
            p.collect_buffers(prefix, out);
        }
    }
    fn collect_buffers_mut<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut DTensor<T>)>) {
        if let Some(p) = self {
            p.collect_buffers_mut(prefix, out);
        }
    }
    fn collect_patterns(prefix: &str, out: &mut Vec<(String, Vec<Placement>)>) {
        P::collect_patterns(prefix, out);
    }
}

impl<T: Element, P: Parameters<T>> Parameters<T> for Box<P> {
    type Global = Box<P::Global>;
    fn load_parameters(source: &mut dyn TensorSource<T>, prefix: &str) -> Result<Self> {
        P::load_parameters(source, prefix).map(Box::new)
    }
    fn distribute_global(global: Self::Global, mesh: &DeviceMesh) -> Result<Self> {
        Ok(Box::new(P::distribute_global(*global, mesh)?))
    }
    fn collect_parameters<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a DTensor<T>)>) {
        (**self).collect_parameters(prefix, out);
    }
    fn collect_parameters_mut<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut DTensor<T>)>) {
        (**self).collect_parameters_mut(prefix, out);
    }
    fn collect_placements(&self, prefix: &str, out: &mut Vec<(String, Vec<Placement>)>) {
        (**self).collect_placements(prefix, out);
    }
    fn collect_buffers<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a DTensor<T>)>) {
        (**self).collect_buffers(prefix, out);
    }
    fn collect_buffers_mut<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut DTensor<T>)>) {
        (**self).collect_buffers_mut(prefix, out);
    }
    fn collect_patterns(prefix: &str, out: &mut Vec<(String, Vec<Placement>)>) {
        P::collect_patterns(prefix, out);
    }
}

/// Plain data: no parameters, distributed as is.
macro_rules! plain_data {
    ($($(#[$g:meta])? [$($gen:tt)*] $ty:ty),* $(,)?) => {$(
        impl<T: Element, $($gen)*> Parameters<T> for $ty {
            type Global = Self;
            fn distribute_global(global: Self, _mesh: &DeviceMesh) -> Result<Self> {
                Ok(global)
            }
            fn collect_parameters<'a>(&'a self, _prefix: &str, _out: &mut Vec<(String, &'a DTensor<T>)>) {}
            fn collect_parameters_mut<'a>(&'a mut self, _prefix: &str, _out: &mut Vec<(String, &'a mut DTensor<T>)>) {}
            fn collect_placements(&self, _prefix: &str, _out: &mut Vec<(String, Vec<Placement>)>) {}
            fn collect_patterns(_prefix: &str, _out: &mut Vec<(String, Vec<Placement>)>) {}
            fn load_parameters(_source: &mut dyn TensorSource<T>, prefix: &str) -> Result<Self> {
                plain_field(prefix, stringify!($ty))
            }
        }
    )*};
}

plain_data!(
    [] u8, [] u16, [] u32, [] u64, [] u128, [] usize, [] i8, [] i16, [] i32, [] i64, [] i128, [] isize,
    [] f32, [] f64, [] bool, [] char, [] String, [] &'static str, [] (), [X: ?Sized] PhantomData<X>,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_one_segment_per_star() {
        assert!(matches_pattern("blocks.*.w1", "blocks.3.w1"));
        assert!(!matches_pattern("blocks.*.w1", "blocks.3.w2"));
        assert!(!matches_pattern("blocks.*.w1", "blocks.w1"));
        assert!(matches_pattern("w", "w"));
        assert_eq!(join("", "w"), "w");
        assert_eq!(join("blocks.0", "w"), "blocks.0.w");
    }
}
