//! Accumulates spanned errors so that one expansion reports every problem at once.

use proc_macro2::TokenStream;
use quote::ToTokens;
use std::fmt::Display;

/// A list of `syn::Error`s combined into one (each keeps its own span).
#[derive(Default)]
pub(crate) struct Errors {
    inner: Option<syn::Error>,
}

impl Errors {
    /// Records an error.
    pub(crate) fn push(&mut self, e: syn::Error) {
        match &mut self.inner {
            Some(all) => all.combine(e),
            None => self.inner = Some(e),
        }
    }

    /// Records an error spanned on `tokens`.
    pub(crate) fn spanned(&mut self, tokens: impl ToTokens, msg: impl Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }

    /// Records the error of a fallible step and returns its value, if any.
    pub(crate) fn ok<T>(&mut self, r: syn::Result<T>) -> Option<T> {
        r.map_err(|e| self.push(e)).ok()
    }

    /// `compile_error!`s for everything recorded, or `None` when there was nothing.
    pub(crate) fn into_compile_errors(self) -> Option<TokenStream> {
        self.inner.map(|e| e.into_compile_error())
    }
}
