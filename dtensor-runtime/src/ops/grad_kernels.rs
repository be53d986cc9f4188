//! The float kernels that backward rules of ops written once for every [`Scalar`] (views,
//! slices, `where`, indexing) call. Integer tensors never require grad, so they never record a
//! backward; the split is made on the element type's identity, here beside the ops it names.

use crate::dtensor::DTensor;
use crate::element::{bf16, f16, same_type, Element, Scalar};
use crate::error::{Error, Result};

/// The float-only ops that backward rules of ops generic over [`Scalar`] (views, slices,
/// `where`, indexing) call: reached through [`grad_kernels`], since those rules are
/// written once for every element type and integers never record a backward.
pub(crate) struct GradKernels<T: Scalar> {
    /// Sums a broadcast gradient back to a shape.
    pub(crate) sum_to: fn(DTensor<T>, &[usize]) -> Result<DTensor<T>>,
    /// The gradient of `index_select`.
    pub(crate) index_add: IndexGrad<T>,
    /// The gradient of `gather`.
    pub(crate) scatter_add: IndexGrad<T>,
}

/// The gradient of an indexing op: (output gradient, `i64` ids, dim, input shape) → input
/// gradient.
pub(crate) type IndexGrad<T> = fn(&DTensor<T>, &DTensor<i64>, usize, &[usize]) -> Result<DTensor<T>>;

impl<T: Element> GradKernels<T> {
    /// The kernels of a float type.
    pub(crate) const FLOAT: GradKernels<T> = GradKernels {
        sum_to: super::sum_to::<T>,
        index_add: super::index::index_add::<T>,
        scatter_add: super::index::scatter_add::<T>,
    };
}

/// The float kernels of `T` (`None` for an integer type).
fn kernels_of<T: Scalar>() -> Option<GradKernels<T>> {
    fn of<F: Element, T: Scalar>() -> Option<GradKernels<T>> {
        same_type(GradKernels::<F>::FLOAT)
    }
    of::<f32, T>().or_else(of::<f64, T>).or_else(of::<bf16, T>).or_else(of::<f16, T>)
}

/// `T`'s [`GradKernels`], or an autograd error for an integer type (unreachable in practice:
/// integer tensors cannot require grad, so no backward of theirs is recorded).
pub(crate) fn grad_kernels<T: Scalar>() -> Result<GradKernels<T>> {
    kernels_of::<T>().ok_or_else(|| Error::Autograd(format!("dtype {} has no gradients", T::DTYPE)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_have_kernels_integers_none() {
        assert!(kernels_of::<f32>().is_some() && kernels_of::<bf16>().is_some());
        assert!(kernels_of::<f64>().is_some() && kernels_of::<f16>().is_some());
        assert!(kernels_of::<i64>().is_none() && kernels_of::<i32>().is_none() && kernels_of::<u8>().is_none());
        assert!(matches!(grad_kernels::<i64>(), Err(Error::Autograd(_))));
    }
}
