//! Ops on DTensor: each op = a sharding rule (input placements → output placements, plus any
//! input redistribution) and a local ndarray kernel.
//!
//! The signatures below are the contract the typed layer (`crate::typed`) builds on.

use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};

fn pending(op: &str) -> Error {
    Error::Unsupported { op: op.into(), reason: "not implemented yet".into() }
}

impl<T: Element> DTensor<T> {
    /// Element-wise `self + other` (broadcasting).
    pub fn add(&self, _other: &DTensor<T>) -> Result<DTensor<T>> {
        Err(pending("add"))
    }
    /// Element-wise `self - other` (broadcasting).
    pub fn sub(&self, _other: &DTensor<T>) -> Result<DTensor<T>> {
        Err(pending("sub"))
    }
    /// Element-wise `self * other` (broadcasting).
    pub fn mul(&self, _other: &DTensor<T>) -> Result<DTensor<T>> {
        Err(pending("mul"))
    }
    /// Element-wise `self / other` (broadcasting).
    pub fn div(&self, _other: &DTensor<T>) -> Result<DTensor<T>> {
        Err(pending("div"))
    }
    /// `max(x, 0)`.
    pub fn relu(&self) -> Result<DTensor<T>> {
        Err(pending("relu"))
    }
    /// GELU (tanh approximation).
    pub fn gelu(&self) -> Result<DTensor<T>> {
        Err(pending("gelu"))
    }
    /// `[.., m, k] @ [.., k, n]`.
    pub fn matmul(&self, _other: &DTensor<T>) -> Result<DTensor<T>> {
        Err(pending("matmul"))
    }
    /// Sum over `dim`.
    pub fn sum_dim(&self, _dim: isize, _keepdim: bool) -> Result<DTensor<T>> {
        Err(pending("sum_dim"))
    }
    /// Swaps two dims.
    pub fn transpose(&self, _dim0: isize, _dim1: isize) -> Result<DTensor<T>> {
        Err(pending("transpose"))
    }
}
