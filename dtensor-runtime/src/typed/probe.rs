//! Finds `DTensor`s that `#[distribute]` cannot see: the macro reads syntax, so a tensor behind
//! a type alias (`type W = DTensor<f32>; fn f(x: &W)`) looks like any other type and would stay
//! untyped. For each argument without a visible tensor the macro emits
//! `(&&Probe::<ArgType>::new()).check()`: method resolution picks [`ProbeTensor`] (whose
//! `check` cannot be called, with a message) when the type is a tensor shape, and the
//! do-nothing [`ProbeOther`] otherwise (autoref specialisation; both resolve in user code, so
//! the error points at the argument).
#![doc(hidden)]

use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::Result;
use std::marker::PhantomData;

/// Zero-sized stand-in for a value of type `X`.
pub struct Probe<X: ?Sized>(PhantomData<X>);

impl<X: ?Sized> Probe<X> {
    /// A probe of `X`.
    pub const fn new() -> Self {
        Probe(PhantomData)
    }
}

impl<X: ?Sized> Default for Probe<X> {
    fn default() -> Self {
        Self::new()
    }
}

/// Never implemented: a `DTensor` reached `#[distribute]` under another name.
#[diagnostic::on_unimplemented(
    message = "`#[distribute]` cannot type `{Self}`: it is written through a type alias (or another name) the macro cannot see",
    label = "this `DTensor` would be silently untyped",
    note = "write the tensor as `DTensor<T>` (or `&DTensor<T>`, `&[DTensor<T>]`, `Option<&DTensor<T>>`) in the signature, so `#[distribute]` gives it its placements"
)]
pub trait VisibleTensor {}

/// The hit: the probed type is a tensor shape.
pub trait ProbeTensor {
    /// The probed type.
    type Probed: ?Sized;
    /// Fails to compile (the bound never holds).
    fn check(&self)
    where
        Self::Probed: VisibleTensor,
    {
    }
}

/// The miss: anything else.
pub trait ProbeOther {
    /// Does nothing.
    fn check(&self) {}
}

impl<X: ?Sized> ProbeOther for Probe<X> {}

macro_rules! probe_shapes {
    ($($ty:ty),* $(,)?) => {$(
        impl<'a, T: Element> ProbeTensor for &Probe<$ty> {
            type Probed = $ty;
        }
    )*};
}

probe_shapes!(
    DTensor<T>,
    &'a DTensor<T>,
    &'a mut DTensor<T>,
    &'a [DTensor<T>],
    Vec<DTensor<T>>,
    Option<DTensor<T>>,
    Option<&'a DTensor<T>>,
    Box<DTensor<T>>,
    Result<DTensor<T>>,
);
