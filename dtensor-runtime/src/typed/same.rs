//! Type equality as a reflexive trait, so that a layout mismatch is a trait error (E0277)
//! that carries a message, rather than a bare "mismatched types" (E0308).

/// `A: SameLayout<B>` holds exactly when `A == B`.
#[diagnostic::on_unimplemented(
    message = "expected a tensor with layout `{Expected}`, found layout `{Self}`",
    label = "this tensor has layout `{Self}`, not `{Expected}`",
    note = "call `.redistribute::<{Expected}>()` on it first"
)]
pub trait SameLayout<Expected> {}

impl<L> SameLayout<L> for L {}
