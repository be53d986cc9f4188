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
#[derive(Clone)]
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

/// Every `DTensor` inside `ty` (behind references, in tuples, slices, arrays and generic
/// arguments such as `Vec<..>` or `Option<&..>`), in order.
pub(crate) fn find_tensors(ty: &Type, out: &mut Vec<TensorTy>) -> syn::Result<()> {
    if let Some(t) = tensor_ty(ty)? {
        out.push(t);
        return Ok(());
    }
    match ty {
        Type::Path(p) => {
            for seg in &p.path.segments {
                if let PathArguments::AngleBracketed(a) = &seg.arguments {
                    for g in &a.args {
                        if let GenericArgument::Type(t) = g {
                            find_tensors(t, out)?;
                        }
                    }
                }
            }
        }
        Type::Reference(r) => find_tensors(&r.elem, out)?,
        Type::Tuple(t) => {
            for e in &t.elems {
                find_tensors(e, out)?;
            }
        }
        Type::Paren(p) => find_tensors(&p.elem, out)?,
        Type::Array(a) => find_tensors(&a.elem, out)?,
        Type::Slice(s) => find_tensors(&s.elem, out)?,
        Type::Group(g) => find_tensors(&g.elem, out)?,
        _ => {}
    }
    Ok(())
}

/// Replaces every `DTensor` inside `ty` (as [`find_tensors`] finds them, in the same order) by
/// `f(index, tensor)`.
pub(crate) fn rewrite_tensors(ty: &mut Type, f: &mut dyn FnMut(usize, &TensorTy) -> TokenStream) {
    fn go(ty: &mut Type, k: &mut usize, f: &mut dyn FnMut(usize, &TensorTy) -> TokenStream) {
        if let Ok(Some(t)) = tensor_ty(ty) {
            let new = f(*k, &t);
            *k += 1;
            if let Ok(new) = syn::parse2::<Type>(new) {
                *ty = new;
            }
            return;
        }
        match ty {
            Type::Path(p) => {
                for seg in p.path.segments.iter_mut() {
                    if let PathArguments::AngleBracketed(a) = &mut seg.arguments {
                        for g in a.args.iter_mut() {
                            if let GenericArgument::Type(t) = g {
                                go(t, k, f);
                            }
                        }
                    }
                }
            }
            Type::Reference(r) => go(&mut r.elem, k, f),
            Type::Tuple(t) => t.elems.iter_mut().for_each(|e| go(e, k, f)),
            Type::Paren(p) => go(&mut p.elem, k, f),
            Type::Array(a) => go(&mut a.elem, k, f),
            Type::Slice(s) => go(&mut s.elem, k, f),
            Type::Group(g) => go(&mut g.elem, k, f),
            _ => {}
        }
    }
    go(ty, &mut 0, f)
}

/// Does `ty` contain `impl Trait` (which cannot be named in an expression)?
pub(crate) fn has_impl_trait(ty: &Type) -> bool {
    ty.to_token_stream().into_iter().any(|t| matches!(&t, proc_macro2::TokenTree::Ident(i) if i == "impl"))
}

/// Traits whose values run code later, when the caller drives them: a closure, an iterator,
/// a future.
const DEFERRED: &[&str] = &[
    "Fn",
    "FnMut",
    "FnOnce",
    "AsyncFn",
    "AsyncFnMut",
    "AsyncFnOnce",
    "Iterator",
    "IntoIterator",
    "DoubleEndedIterator",
    "ExactSizeIterator",
    "Future",
    "IntoFuture",
    "Stream",
];

/// The first `impl Trait` or `dyn Trait` in `ty` whose trait runs code later (see
/// [`DEFERRED`]), with that trait's name: a value that would run a function body's ops after
/// the function returned.
pub(crate) fn deferred_work(ty: &Type) -> Option<(&Type, String)> {
    let bounds = match ty {
        Type::ImplTrait(t) => Some(&t.bounds),
        Type::TraitObject(t) => Some(&t.bounds),
        _ => None,
    };
    if let Some(bounds) = bounds {
        for b in bounds {
            if let syn::TypeParamBound::Trait(t) = b {
                if let Some(last) = t.path.segments.last() {
                    if DEFERRED.iter().any(|d| last.ident == d) {
                        return Some((ty, last.ident.to_string()));
                    }
                }
            }
        }
        return None;
    }
    match ty {
        Type::Path(p) => p.path.segments.iter().find_map(|seg| match &seg.arguments {
            PathArguments::AngleBracketed(a) => a.args.iter().find_map(|g| match g {
                GenericArgument::Type(t) => deferred_work(t),
                _ => None,
            }),
            _ => None,
        }),
        Type::Reference(r) => deferred_work(&r.elem),
        Type::Tuple(t) => t.elems.iter().find_map(deferred_work),
        Type::Array(a) => deferred_work(&a.elem),
        Type::Slice(s) => deferred_work(&s.elem),
        Type::Paren(p) => deferred_work(&p.elem),
        Type::Group(g) => deferred_work(&g.elem),
        _ => None,
    }
}

/// Is `ty` a type that certainly holds no tensor (numbers, `bool`, `char`, `String`, `str`)?
pub(crate) fn is_plain_data(ty: &Type) -> bool {
    const PLAIN: &[&str] = &[
        "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize", "f32", "f64", "bool",
        "char", "String", "str",
    ];
    match ty {
        Type::Path(p) => p.qself.is_none() && p.path.get_ident().is_some_and(|i| PLAIN.iter().any(|n| i == n)),
        Type::Reference(r) => is_plain_data(&r.elem),
        Type::Tuple(t) => t.elems.iter().all(is_plain_data),
        _ => false,
    }
}

/// Is `ty` an integer or `bool` element type (`DTensor<i64>`), which cannot be a parameter?
pub(crate) fn is_integer_elem(ty: &Type) -> bool {
    const INTEGER: &[&str] =
        &["u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize", "bool"];
    matches!(ty, Type::Path(p) if p.qself.is_none() && p.path.get_ident().is_some_and(|i| INTEGER.iter().any(|n| i == n)))
}

/// Is `ty` written as `f32` or `f64` (certainly an `Element`)?
pub(crate) fn is_float_elem(ty: &Type) -> bool {
    matches!(ty, Type::Path(p) if p.qself.is_none() && p.path.get_ident().is_some_and(|i| i == "f32" || i == "f64"))
}

/// Does `ty` certainly implement `Parameters` by its syntax: a `DTensor` written out, or a
/// `Vec`, `Option`, `Box`, `[_; N]` of one? Any other field type is checked by a bound.
pub(crate) fn surely_parameters(ty: &Type) -> bool {
    if matches!(tensor_ty(ty), Ok(Some(t)) if t.reference.is_none()) {
        return true;
    }
    match ty {
        Type::Array(a) => surely_parameters(&a.elem),
        Type::Path(p) if p.qself.is_none() => {
            let Some(last) = p.path.segments.last() else { return false };
            let PathArguments::AngleBracketed(a) = &last.arguments else { return false };
            let wraps = ["Vec", "Option", "Box"].iter().any(|w| last.ident == w);
            wraps
                && matches!(a.args.iter().collect::<Vec<_>>().as_slice(), [GenericArgument::Type(t)] if surely_parameters(t))
        }
        _ => false,
    }
}

/// A field of a struct or an argument of a function that holds tensors.
pub(crate) struct TensorSlot {
    /// Field name, or argument pattern as written.
    pub name: String,
    /// The first tensor in the type (the only one for a direct `DTensor` / `&DTensor`).
    pub ty: TensorTy,
    /// Every tensor in the type, in [`rewrite_tensors`] order.
    pub all: Vec<TensorTy>,
    /// Its own `#[placements]`, if any.
    pub placements: Option<PlacementList>,
    /// It had a `#[placements]` attribute that was invalid (already reported).
    pub placements_invalid: bool,
    /// Where to point "needs placements" errors.
    pub span_tokens: TokenStream,
}

/// Recognises a field / argument type, taking its `#[placements]` attribute. Slots without
/// a tensor but with a `#[placements]` attribute are an error.
pub(crate) fn slot(
    name: String,
    ty: &Type,
    attrs: &mut Vec<syn::Attribute>,
    span_tokens: TokenStream,
    errs: &mut Errors,
) -> Option<TensorSlot> {
    let had_attr = attrs.iter().any(attr::is_placements_attr);
    let placements = attr::take_placements_attr(attrs, errs);
    let mut all = Vec::new();
    let found = errs.ok(find_tensors(ty, &mut all));
    match found.filter(|_| !all.is_empty()) {
        Some(()) => {
            let placements_invalid = had_attr && placements.is_none();
            let first = all[0].clone();
            Some(TensorSlot { name, ty: first, all, placements, placements_invalid, span_tokens })
        }
        None => {
            if had_attr {
                errs.spanned(ty, format!("`#[placements]` on `{name}`, which is not a `DTensor<T>`"));
            }
            None
        }
    }
}

/// A struct field as written.
pub(crate) enum FieldAst {
    /// Holds `DTensor`s (directly or inside a container); `true`: `#[distribute(buffer)]`.
    Tensors(Box<TensorSlot>, bool),
    /// `#[distribute(skip)]`.
    Skip,
    /// Numbers, `bool`, `String`, ...: certainly no parameters.
    Plain,
    /// Any other type (a nested `#[distribute]` struct, a container of them, or a type the
    /// `Parameters` bound will reject).
    Other,
}

/// The name a user reads for `ident`: a raw identifier without its `r#` (`r#type` is `type`),
/// as a parameter name, in a message and in a generated string.
pub(crate) fn ident_name(ident: &syn::Ident) -> String {
    syn::ext::IdentExt::unraw(ident).to_string()
}

/// Classifies every field of a struct (in order), taking the macro's helper attributes out.
pub(crate) fn parse_struct(item: &mut syn::ItemStruct, errs: &mut Errors) -> Vec<FieldAst> {
    let mut out = Vec::new();
    for f in item.fields.iter_mut() {
        let name = f.ident.as_ref().map(ident_name).unwrap_or_default();
        let span = f.ident.to_token_stream();
        let flag = attr::take_field_flag(&mut f.attrs, errs);
        let slot = slot(name.clone(), &f.ty, &mut f.attrs, span.clone(), errs);
        use attr::FieldFlag;
        out.push(match (flag, slot) {
            (FieldFlag::Skip, Some(s)) => {
                errs.spanned(
                    &s.span_tokens,
                    format!("`{}` holds a `DTensor`: it is a parameter and cannot be `#[distribute(skip)]`", s.name),
                );
                FieldAst::Skip
            }
            (FieldFlag::Skip, None) => FieldAst::Skip,
            (FieldFlag::Buffer, Some(s)) => FieldAst::Tensors(Box::new(s), true),
            (FieldFlag::Buffer, None) => {
                errs.spanned(
                    &span,
                    format!("`#[distribute(buffer)]` on `{name}`, which holds no `DTensor<T>` written out (a nested struct declares its own buffers)"),
                );
                FieldAst::Skip
            }
            (FieldFlag::None, Some(s)) => FieldAst::Tensors(Box::new(s), false),
            (FieldFlag::None, None) if is_plain_data(&f.ty) => FieldAst::Plain,
            (FieldFlag::None, None) => FieldAst::Other,
        });
    }
    out
}

/// The arguments of a function that hold tensors (with their index), taking the macro's
/// helper attributes out.
pub(crate) fn parse_fn(item: &mut syn::ItemFn, errs: &mut Errors) -> Vec<(usize, TensorSlot)> {
    let mut slots = Vec::new();
    for (i, arg) in item.sig.inputs.iter_mut().enumerate() {
        if let syn::FnArg::Typed(pt) = arg {
            let name = match &*pt.pat {
                syn::Pat::Ident(p) => ident_name(&p.ident),
                other => other.to_token_stream().to_string(),
            };
            let span = pt.pat.to_token_stream();
            if let Some(s) = slot(name, &pt.ty, &mut pt.attrs, span, errs) {
                slots.push((i, s));
            }
        }
    }
    slots
}
