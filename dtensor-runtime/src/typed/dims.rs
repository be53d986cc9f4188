//! Mesh dimension names at the type level, so that rule errors can say *which* mesh dim
//! (`on mesh dim `tp``) is at fault, and conversions can check the runtime mesh's names.
//!
//! The common names are predefined (`dp`, `tp`, ...); declare others with [`mesh_dim!`](crate::mesh_dim).
//! A mesh type is a tuple of names, one per mesh dim: `(dp, tp)`.
#![allow(non_camel_case_types)] // the type *is* the dim name users see in errors

/// A mesh dimension name.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a mesh dimension name",
    label = "declare it with `dtensor::mesh_dim!({Self})` or use a predefined one (`dp`, `tp`, ...)"
)]
pub trait MeshDim: 'static {
    /// The name as the runtime mesh spells it.
    const NAME: &'static str;
}

/// Declares mesh dimension name types for the typed layer.
///
/// ```
/// dtensor_runtime::mesh_dim!(pub expert, pub stage);
/// use dtensor_runtime::typed::MeshDim;
/// assert_eq!(<expert as MeshDim>::NAME, "expert");
/// ```
#[macro_export]
macro_rules! mesh_dim {
    ($($vis:vis $name:ident),+ $(,)?) => {$(
        #[allow(non_camel_case_types)]
        #[doc = concat!("Mesh dimension `", stringify!($name), "`.")]
        $vis enum $name {}
        impl $crate::typed::MeshDim for $name {
            const NAME: &'static str = stringify!($name);
        }
    )+};
}

/// The predefined names: their types and the list the `#[distribute]` macro maps to them,
/// from one list.
macro_rules! predefined {
    ($($name:ident),+) => {
        /// Names the `#[distribute]` macro maps to the predefined types (the macro refers to
        /// any other name in the user's scope).
        pub const PREDEFINED: &[&str] = &[$(stringify!($name)),+];
        mesh_dim!($(pub $name),+);
    };
}
predefined!(dp, tp, pp, cp, sp, ep, fsdp, dim0, dim1, dim2, dim3);

/// A mesh at the type level: a tuple of [`MeshDim`] names, one per mesh dimension.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a typed mesh",
    label = "a typed mesh is a tuple of mesh dim names, e.g. `(dp, tp)` or `(tp,)`"
)]
pub trait MeshDims: 'static {
    /// Number of mesh dimensions.
    const NDIM: usize;
    /// The names, in mesh-dim order.
    fn names() -> Vec<&'static str>;
}

macro_rules! mesh_tuples {
    ($(($($n:ident),+)),+) => {$(
        impl<$($n: MeshDim),+> MeshDims for ($($n,)+) {
            const NDIM: usize = [$($n::NAME),+].len();
            fn names() -> Vec<&'static str> {
                vec![$($n::NAME),+]
            }
        }
    )+};
}

mesh_tuples!((N0), (N0, N1), (N0, N1, N2), (N0, N1, N2, N3));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ndim() {
        assert_eq!(<(dp, tp) as MeshDims>::names(), vec!["dp", "tp"]);
        assert_eq!(<(dp, tp, pp) as MeshDims>::NDIM, 3);
        for n in PREDEFINED {
            assert!(!n.is_empty());
        }
        assert_eq!(<fsdp as MeshDim>::NAME, "fsdp");
    }
}
