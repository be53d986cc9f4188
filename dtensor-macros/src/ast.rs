//! The input as the macro sees it: which fields / arguments are tensors, with their element
//! type, rank and declared placements.

use crate::attr::{self, PlacementList};
use crate::errors::Errors;
use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::{Expr, ExprLit, GenericArgument, Lit, PathArguments, Type, TypeReference};

/// Rank of `DTensor<T>` when the type does not say (`DTensor<T, N>` does).
pub(crate) const DEFAULT_RANK: usize = 2;

/// A `DTensor<T>` / `DTensor<T, N>` type, possibly behind a reference.
pub(crate) struct TensorTy {
    pub elem: Type,
    pub rank: usize,
    pub rank_explicit: bool,
    /// `&`, `&'a`, `&mut` in front of the tensor, if any.
    pub reference: Option<TypeReference>,
    /// The whole type as written (for spans).
    pub tokens: TokenStream,
    /// The dynamic type through the user's own path (`DTensor<f32>` without the rank), so the
    /// generated code uses the user's import of `DTensor`.
    pub dynamic: TokenStream,
}

/// Replaces every `DTensor<T, N>` inside `ty` by `DTensor<T>` (the fallback expansion emits
/// the user's types, and `DTensor` has no rank parameter).
pub(crate) fn strip_rank(ty: &mut Type) {
    match ty {
        Type::Path(p) => {
            if let Ok(Some(t)) = tensor_ty(&Type::Path(p.clone())) {
                if let Ok(dynamic) = syn::parse2::<Type>(t.dynamic) {
                    *ty = dynamic;
                }
                return;
            }
            for seg in p.path.segments.iter_mut() {
                if let PathArguments::AngleBracketed(a) = &mut seg.arguments {
                    for g in a.args.iter_mut() {
                        if let GenericArgument::Type(t) = g {
                            strip_rank(t);
                        }
                    }
                }
            }
        }
        Type::Reference(r) => strip_rank(&mut r.elem),
        Type::Tuple(t) => t.elems.iter_mut().for_each(strip_rank),
        Type::Paren(p) => strip_rank(&mut p.elem),
        Type::Array(a) => strip_rank(&mut a.elem),
        Type::Slice(s) => strip_rank(&mut s.elem),
        _ => {}
    }
}

/// Recognises `DTensor<T>`, `DTensor<T, N>` (any path ending in `DTensor`) and references to
/// them. `Ok(None)`: not a tensor type.
pub(crate) fn tensor_ty(ty: &Type) -> syn::Result<Option<TensorTy>> {
    let (inner, reference) = match ty {
        Type::Reference(r) => (&*r.elem, Some(r.clone())),
        other => (other, None),
    };
    let Type::Path(p) = inner else { return Ok(None) };
    let Some(last) = p.path.segments.last() else { return Ok(None) };
    if last.ident != "DTensor" || p.qself.is_some() {
        return Ok(None);
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return Err(syn::Error::new_spanned(ty, "write the element type: `DTensor<f32>` (or `DTensor<f32, RANK>`)"));
    };
    let args: Vec<&GenericArgument> = args.args.iter().collect();
    let (elem, rank) = match args.as_slice() {
        [GenericArgument::Type(t)] => (t.clone(), None),
        [GenericArgument::Type(t), r] => (t.clone(), Some(*r)),
        _ => {
            return Err(syn::Error::new_spanned(
                ty,
                "expected `DTensor<T>` or `DTensor<T, RANK>` with an integer literal RANK",
            ))
        }
    };
    let rank = match rank {
        None => None,
        Some(r) => {
            let lit = match r {
                GenericArgument::Const(Expr::Lit(ExprLit { lit: Lit::Int(i), .. })) => Some(i),
                GenericArgument::Const(Expr::Block(_)) => None,
                _ => None,
            };
            match lit.and_then(|i| i.base10_parse::<usize>().ok()) {
                Some(n) => Some(n),
                None => {
                    return Err(syn::Error::new_spanned(r, "the rank in `DTensor<T, RANK>` must be an integer literal"))
                }
            }
        }
    };
    let mut path = p.path.clone();
    if let Some(seg) = path.segments.last_mut() {
        seg.arguments = PathArguments::AngleBracketed(syn::parse_quote!(<#elem>));
    }
    Ok(Some(TensorTy {
        dynamic: path.to_token_stream(),
        elem,
        rank: rank.unwrap_or(DEFAULT_RANK),
        rank_explicit: rank.is_some(),
        reference,
        tokens: ty.to_token_stream(),
    }))
}

/// A tensor field of a struct or a tensor argument of a function.
pub(crate) struct TensorSlot {
    /// Field name, or argument pattern as written.
    pub name: String,
    pub ty: TensorTy,
    /// Its own `#[placements]`, if any.
    pub placements: Option<PlacementList>,
    /// It had a `#[placements]` attribute that was invalid (already reported).
    pub placements_invalid: bool,
    /// Where to point "needs placements" errors.
    pub span_tokens: TokenStream,
}

/// Recognises a field / argument type, taking its `#[placements]` attribute. Non-tensor
/// slots with a `#[placements]` attribute are an error.
pub(crate) fn slot(
    name: String,
    ty: &Type,
    attrs: &mut Vec<syn::Attribute>,
    span_tokens: TokenStream,
    errs: &mut Errors,
) -> Option<TensorSlot> {
    let had_attr = attrs.iter().any(attr::is_placements_attr);
    let placements = attr::take_placements_attr(attrs, errs);
    match errs.ok(tensor_ty(ty)).flatten() {
        Some(ty) => {
            let placements_invalid = had_attr && placements.is_none();
            Some(TensorSlot { name, ty, placements, placements_invalid, span_tokens })
        }
        None => {
            if had_attr {
                errs.spanned(ty, format!("`#[placements]` on `{name}`, which is not a `DTensor<T>`"));
            }
            None
        }
    }
}
