//! Code generation for `#[distribute]` on structs and functions, and the fallback expansion
//! used when validation failed (the item without the macro's attributes, so the user sees the
//! macro's errors and not a cascade of follow-up ones).

use crate::ast::{self, TensorSlot, TensorTy};
use crate::attr::{self, Args, MeshAst};
use crate::errors::Errors;
use crate::valid::{self, Marker, Use};
use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Fields, FnArg, ItemFn, ItemStruct, Pat, ReturnType, Type};

/// Mesh dim names the runtime predefines in `dtensor::typed::dims` (keep in sync with
/// `dtensor_runtime::typed::dims::PREDEFINED`).
const PREDEFINED_DIMS: &[&str] = &["dp", "tp", "pp", "cp", "sp", "ep", "fsdp", "dim0", "dim1", "dim2", "dim3"];

/// The type of the mesh: a tuple of dim name types. Predefined names come from the runtime;
/// others must be declared in scope with `dtensor::mesh_dim!`.
fn mesh_type(mesh: &MeshAst) -> TokenStream {
    let span = mesh.lit.span();
    let dims = mesh.names.iter().map(|n| {
        let id = Ident::new(n, span);
        if PREDEFINED_DIMS.contains(&n.as_str()) {
            quote_spanned!(span=> ::dtensor::typed::dims::#id)
        } else {
            quote_spanned!(span=> #id)
        }
    });
    quote!((#(#dims,)*))
}

fn marker_type(m: Marker) -> TokenStream {
    match m {
        Marker::Shard(d) => {
            let d = Literal::usize_unsuffixed(d);
            quote!(::dtensor::Shard<#d>)
        }
        Marker::Replicate => quote!(::dtensor::Replicate),
        Marker::Partial(op) => {
            let op = Ident::new(op, Span::call_site());
            quote!(::dtensor::Partial<::dtensor::#op>)
        }
    }
}

/// `(Shard<0>, Replicate)`.
fn layout_type(markers: &[Marker]) -> TokenStream {
    let ms = markers.iter().map(|m| marker_type(*m));
    quote!((#(#ms,)*))
}

/// `Dt<T, M, L, R>` with the span of the type the user wrote.
fn dt_type(ty: &TensorTy, mesh_ty: &TokenStream, layout: &TokenStream) -> TokenStream {
    let elem = &ty.elem;
    let rank = Literal::usize_unsuffixed(ty.rank);
    let span = ty.tokens.span();
    quote_spanned!(span=> ::dtensor::typed::Dt<#elem, #mesh_ty, #layout, #rank>)
}

/// Puts the reference of the original type (if any) back in front of `inner`.
fn with_reference(ty: &TensorTy, inner: TokenStream) -> TokenStream {
    match &ty.reference {
        None => inner,
        Some(r) => {
            let and = &r.and_token;
            let lt = &r.lifetime;
            let m = &r.mutability;
            quote!(#and #lt #m #inner)
        }
    }
}

/// The mesh from the arguments, or an error when it is missing.
fn require_mesh<'a>(args: &'a Args, item: &impl ToTokens, errs: &mut Errors) -> Option<&'a MeshAst> {
    if args.mesh.is_none() && !args.had_error {
        errs.spanned(item, "missing `mesh`: `#[distribute(mesh = \"dp,tp\")]`");
    }
    args.mesh.as_ref()
}

/// Resolves the placements of one tensor slot (its own list, else the default).
fn resolve_slot(
    slot: &TensorSlot,
    args: &Args,
    mesh: &MeshAst,
    usage: Use,
    what_kind: &str,
    errs: &mut Errors,
) -> Option<Vec<Marker>> {
    if slot.placements_invalid {
        return None; // its own attribute was reported
    }
    let Some(list) = slot.placements.as_ref().or(args.placements.as_ref()) else {
        if args.had_error {
            return None; // e.g. a misspelt or invalid `placements` argument, already reported
        }
        errs.spanned(
            &slot.span_tokens,
            format!(
                "{what_kind} `{}` has no placements: add `#[placements = [..]]` to it or a default `placements = [..]` to `#[distribute]`",
                slot.name
            ),
        );
        return None;
    };
    valid::resolve(list, mesh, slot.ty.rank, slot.ty.rank_explicit, &slot.name, usage, errs)
}

// ------------------------------------------------------------------------------ structs

/// `#[distribute]` on a struct.
pub(crate) fn expand_struct(args: Args, mut item: ItemStruct, mut errs: Errors) -> TokenStream {
    if args.returns.is_some() {
        errs.spanned(&item.ident, "`returns` only applies to functions");
    }
    let mesh = require_mesh(&args, &item.ident, &mut errs);
    let Fields::Named(_) = &item.fields else {
        errs.spanned(&item.fields, "`#[distribute]` needs a struct with named fields");
        return fallback_struct(item, errs);
    };
    // Collect tensor fields (stripping our attributes as we go).
    let mut slots: Vec<(usize, TensorSlot)> = Vec::new();
    for (i, f) in item.fields.iter_mut().enumerate() {
        let name = f.ident.as_ref().map(|i| i.to_string()).unwrap_or_default();
        let span = f.ident.to_token_stream();
        if let Some(s) = ast::slot(name, &f.ty, &mut f.attrs, span, &mut errs) {
            slots.push((i, s));
        }
    }
    let Some(mesh) = mesh else { return fallback_struct(item, errs) };
    if slots.is_empty() {
        errs.spanned(&item.ident, "`#[distribute]` struct has no `DTensor<T>` field");
    }
    let mut resolved = Vec::new();
    for (i, s) in &slots {
        if let Some(ms) = resolve_slot(s, &args, mesh, Use::Parameter, "field", &mut errs) {
            resolved.push((*i, ms));
        }
    }
    // One element type for named_parameters.
    if let Some((_, first)) = slots.first() {
        let e0 = first.ty.elem.to_token_stream().to_string();
        for (_, s) in &slots[1..] {
            if s.ty.elem.to_token_stream().to_string() != e0 {
                errs.spanned(
                    &s.ty.elem,
                    format!("all `DTensor` fields must share one element type (`{e0}`): `named_parameters` lists them together"),
                );
            }
        }
        for (_, s) in &slots {
            if let Some(r) = &s.ty.reference {
                errs.spanned(r, "a `#[distribute]` struct owns its parameters: use `DTensor<T>`, not a reference");
            }
        }
    }
    if let Some(e) = errs.into_compile_errors() {
        return fallback_struct_with(item, e);
    }

    let mesh_ty = mesh_type(mesh);
    let ident = &item.ident;
    let vis = &item.vis;
    let global_ident = format_ident!("{}Global", ident);
    let (impl_g, ty_g, where_g) = item.generics.split_for_impl();
    let dynamic = slots[0].1.ty.dynamic.clone();
    let elem = slots[0].1.ty.elem.clone();

    let mut global_fields = Vec::new();
    let mut init = Vec::new();
    let mut refs = Vec::new();
    let mut muts = Vec::new();
    let mut placements = Vec::new();
    let orig_fields: Vec<syn::Field> = item.fields.iter().cloned().collect();
    for (i, f) in item.fields.iter_mut().enumerate() {
        let fname = f.ident.clone().expect("named field");
        let fvis = &f.vis;
        let fattrs = f.attrs.iter().filter(|a| a.path().is_ident("doc"));
        match resolved.iter().find(|(j, _)| *j == i) {
            Some((_, markers)) => {
                let slot = &slots.iter().find(|(j, _)| *j == i).expect("slot of field").1;
                let layout = layout_type(markers);
                let typed = dt_type(&slot.ty, &mesh_ty, &layout);
                let elem = &slot.ty.elem;
                global_fields.push(quote!(#(#fattrs)* #fvis #fname: ::dtensor::ndarray::ArrayD<#elem>));
                init.push(quote!(#fname: ::dtensor::typed::Dt::distribute(&global.#fname, mesh)?.requires_grad_(true)));
                let key = fname.to_string();
                refs.push(quote!((::std::string::String::from(#key), self.#fname.as_dtensor())));
                muts.push(quote!((::std::string::String::from(#key), self.#fname.as_dtensor_mut())));
                let ps = markers.iter().map(|m| dyn_placement(*m));
                placements.push(quote!((#key, ::std::vec![#(#ps),*])));
                f.ty = syn::parse2(typed).expect("generated type parses");
            }
            None => {
                let ty = &orig_fields[i].ty;
                global_fields.push(quote!(#(#fattrs)* #fvis #fname: #ty));
                init.push(quote!(#fname: global.#fname));
            }
        }
    }
    let global_doc =
        format!("The global (not yet distributed) parameters of [`{ident}`], for [`{ident}::distribute`].");
    let mesh_names = &mesh.names;
    quote! {
        #item

        #[doc = #global_doc]
        #vis struct #global_ident #impl_g #where_g {
            #(#global_fields,)*
        }

        impl #impl_g #ident #ty_g #where_g {
            /// Names of the mesh dims this module is laid out on, in mesh-dim order.
            pub const MESH_DIMS: &'static [&'static str] = &[#(#mesh_names),*];

            /// Distributes global parameters over `mesh` with the declared placements
            /// (rank 0's data is scattered / broadcast); the parameters require grad.
            pub fn distribute(global: #global_ident #ty_g, mesh: &::dtensor::DeviceMesh) -> ::dtensor::Result<Self> {
                ::std::result::Result::Ok(Self { #(#init,)* })
            }

            /// Every parameter with its name, in declaration order.
            pub fn named_parameters(&self) -> ::std::vec::Vec<(::std::string::String, &#dynamic)> {
                ::std::vec![#(#refs),*]
            }

            /// Every parameter with its name, mutably (e.g. for an optimizer step).
            pub fn named_parameters_mut(&mut self) -> ::std::vec::Vec<(::std::string::String, &mut #dynamic)> {
                ::std::vec![#(#muts),*]
            }

            /// The declared placements of every parameter.
            pub fn parameter_placements() -> ::std::vec::Vec<(&'static str, ::std::vec::Vec<::dtensor::Placement>)> {
                ::std::vec![#(#placements),*]
            }

            /// A `partition_fn` for `distribute_module` that lays out a *dynamic* module with
            /// the same parameter names as this struct declares (other names: replicated).
            /// Errors if `mesh` does not have this struct's mesh dims.
            pub fn partition(
                name: &str,
                _param: &#dynamic,
                mesh: &::dtensor::DeviceMesh,
            ) -> ::dtensor::Result<::std::option::Option<::std::vec::Vec<::dtensor::Placement>>> {
                if mesh.dim_names() != Self::MESH_DIMS {
                    return ::std::result::Result::Err(::dtensor::Error::TypedMismatch {
                        what: ::std::string::String::from("mesh dims"),
                        expected: ::std::format!("{:?}", Self::MESH_DIMS),
                        actual: ::std::format!("{:?}", mesh.dim_names()),
                    });
                }
                ::std::result::Result::Ok(
                    Self::parameter_placements().into_iter().find(|(n, _)| *n == name).map(|(_, p)| p),
                )
            }
        }

        impl #impl_g ::dtensor::Module<#elem> for #ident #ty_g #where_g {
            fn named_parameters(&self) -> ::std::vec::Vec<(::std::string::String, &#dynamic)> {
                #ident::named_parameters(self)
            }
            fn named_parameters_mut(&mut self) -> ::std::vec::Vec<(::std::string::String, &mut #dynamic)> {
                #ident::named_parameters_mut(self)
            }
        }
    }
}

fn dyn_placement(m: Marker) -> TokenStream {
    match m {
        Marker::Shard(d) => {
            let d = Literal::isize_unsuffixed(d as isize);
            quote!(::dtensor::Placement::Shard(#d))
        }
        Marker::Replicate => quote!(::dtensor::Placement::Replicate),
        Marker::Partial(op) => {
            let op = Ident::new(op, Span::call_site());
            quote!(::dtensor::Placement::Partial(::dtensor::ReduceOp::#op))
        }
    }
}

fn strip_struct(item: &mut ItemStruct) {
    for f in item.fields.iter_mut() {
        f.attrs.retain(|a| !attr::is_placements_attr(a));
        ast::strip_rank(&mut f.ty);
    }
}

fn fallback_struct(item: ItemStruct, errs: Errors) -> TokenStream {
    let e = errs.into_compile_errors().unwrap_or_default();
    fallback_struct_with(item, e)
}

fn fallback_struct_with(mut item: ItemStruct, e: TokenStream) -> TokenStream {
    strip_struct(&mut item);
    quote!(#e #item)
}

// ---------------------------------------------------------------------------- functions

/// `#[distribute]` on a function.
pub(crate) fn expand_fn(args: Args, mut item: ItemFn, mut errs: Errors) -> TokenStream {
    let mesh = require_mesh(&args, &item.sig.ident, &mut errs);
    let mut slots: Vec<(usize, TensorSlot)> = Vec::new();
    for (i, arg) in item.sig.inputs.iter_mut().enumerate() {
        if let FnArg::Typed(pt) = arg {
            let name = pt.pat.to_token_stream().to_string();
            let span = pt.pat.to_token_stream();
            if let Some(s) = ast::slot(name, &pt.ty, &mut pt.attrs, span, &mut errs) {
                slots.push((i, s));
            }
        }
    }
    let ret = match &item.sig.output {
        ReturnType::Type(_, ty) => Some((**ty).clone()),
        ReturnType::Default => None,
    };
    let Some(mesh) = mesh else { return fallback_fn(item, errs) };
    let mut resolved = Vec::new();
    for (i, s) in &slots {
        if let Some(ms) = resolve_slot(s, &args, mesh, Use::Value, "argument", &mut errs) {
            resolved.push((*i, ms));
        }
    }
    // The result: every `DTensor` inside the return type gets the `returns` layout.
    let mesh_ty = mesh_type(mesh);
    let mut new_ret = None;
    if let Some(ty) = &ret {
        let mut ty = ty.clone();
        let ctx = RetCtx {
            list: args.returns.as_ref().or(args.placements.as_ref()),
            had_error: args.had_error,
            mesh,
            mesh_ty: &mesh_ty,
        };
        rewrite_ret(&mut ty, &ctx, &mut errs);
        new_ret = Some(ty);
    }
    if slots.is_empty() && args.returns.is_none() && new_ret.is_none() {
        errs.spanned(&item.sig.ident, "`#[distribute]` function has no `DTensor<T>` argument or result");
    }
    if let Some(e) = errs.into_compile_errors() {
        return fallback_fn_with(item, e);
    }

    // Arguments: `x: &Dt<T, M, __L0, R>` with `__L0: SameLayout<L>`, then `let x = cast(x)`.
    let mut prologue = Vec::new();
    for (k, (i, markers)) in resolved.iter().enumerate() {
        let slot = &slots.iter().find(|(j, _)| j == i).expect("slot of argument").1;
        let FnArg::Typed(pt) = &mut item.sig.inputs[*i] else { continue };
        let span = pt.ty.span();
        let l = format_ident!("__DtLayout{}", k, span = span);
        let layout = layout_type(markers);
        item.sig.generics.params.push(syn::parse_quote_spanned!(span=>
            #l: ::dtensor::typed::SameLayout<#layout> + ::dtensor::typed::TypedLayout<#mesh_ty>
        ));
        let generic_ty = with_reference(&slot.ty, dt_type(&slot.ty, &mesh_ty, &quote!(#l)));
        let exact_ty = with_reference(&slot.ty, dt_type(&slot.ty, &mesh_ty, &layout));
        let cast = match &slot.ty.reference {
            None => quote!(cast),
            Some(r) if r.mutability.is_some() => quote!(cast_mut),
            Some(_) => quote!(cast_ref),
        };
        // Keep simple names (shadowed by the cast); give other patterns a hidden name.
        let (param, pat): (Pat, Pat) = match &*pt.pat {
            Pat::Ident(pi) if pi.subpat.is_none() => {
                let id = &pi.ident;
                (syn::parse_quote!(#id), (*pt.pat).clone())
            }
            other => {
                let id = format_ident!("__dtensor_arg{}", k);
                (syn::parse_quote!(#id), other.clone())
            }
        };
        let param_id = param.to_token_stream();
        prologue.push(quote_spanned!(span=>
            let #pat: #exact_ty = <#l as ::dtensor::typed::SameLayout<#layout>>::#cast(#param_id);
        ));
        *pt.pat = param;
        *pt.ty = syn::parse2(generic_ty).expect("generated type parses");
    }
    if let Some(ty) = new_ret {
        if let ReturnType::Type(_, t) = &mut item.sig.output {
            **t = ty;
        }
    }
    // Mention the user's `DTensor` path so that its import counts as used.
    for (_, s) in &slots {
        let dynamic = &s.ty.dynamic;
        prologue.push(quote!(let _ = ::core::marker::PhantomData::<#dynamic>;));
    }
    let body = &item.block;
    let attrs = &item.attrs;
    let vis = &item.vis;
    let sig = &item.sig;
    // Typed result types (`Result<Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 2>>`) are long by
    // nature; the user wrote the short dynamic form, so the lint is not theirs to fix.
    quote! {
        #(#attrs)*
        #[allow(clippy::type_complexity)]
        #vis #sig {
            #(#prologue)*
            #body
        }
    }
}

/// What a `DTensor` in the return type turns into.
struct RetCtx<'a> {
    list: Option<&'a attr::PlacementList>,
    had_error: bool,
    mesh: &'a MeshAst,
    mesh_ty: &'a TokenStream,
}

/// Replaces every `DTensor<..>` inside `ty` by its typed form.
fn rewrite_ret(ty: &mut Type, ctx: &RetCtx<'_>, errs: &mut Errors) {
    match errs.ok(ast::tensor_ty(ty)) {
        Some(Some(t)) => {
            let Some(list) = ctx.list else {
                if ctx.had_error {
                    return;
                }
                errs.spanned(
                    &t.tokens,
                    "the result has no placements: add `returns = [..]` or `placements = [..]` to `#[distribute]`",
                );
                return;
            };
            if let Some(ms) = valid::resolve(list, ctx.mesh, t.rank, t.rank_explicit, "the result", Use::Value, errs) {
                let new = with_reference(&t, dt_type(&t, ctx.mesh_ty, &layout_type(&ms)));
                *ty = syn::parse2(new).expect("generated type parses");
            }
            return;
        }
        Some(None) => {}
        None => return,
    }
    match ty {
        Type::Path(p) => {
            for seg in p.path.segments.iter_mut() {
                if let syn::PathArguments::AngleBracketed(a) = &mut seg.arguments {
                    for g in a.args.iter_mut() {
                        if let syn::GenericArgument::Type(t) = g {
                            rewrite_ret(t, ctx, errs);
                        }
                    }
                }
            }
        }
        Type::Tuple(t) => t.elems.iter_mut().for_each(|e| rewrite_ret(e, ctx, errs)),
        Type::Reference(r) => rewrite_ret(&mut r.elem, ctx, errs),
        Type::Paren(p) => rewrite_ret(&mut p.elem, ctx, errs),
        Type::Array(a) => rewrite_ret(&mut a.elem, ctx, errs),
        Type::Slice(s) => rewrite_ret(&mut s.elem, ctx, errs),
        _ => {}
    }
}

fn strip_fn(item: &mut ItemFn) {
    for arg in item.sig.inputs.iter_mut() {
        if let FnArg::Typed(pt) = arg {
            pt.attrs.retain(|a| !attr::is_placements_attr(a));
            ast::strip_rank(&mut pt.ty);
        }
    }
    if let ReturnType::Type(_, t) = &mut item.sig.output {
        ast::strip_rank(t);
    }
}

fn fallback_fn(item: ItemFn, errs: Errors) -> TokenStream {
    let e = errs.into_compile_errors().unwrap_or_default();
    fallback_fn_with(item, e)
}

/// The function with its original signature and a body that type-checks whatever the
/// signature says, so the macro's errors are the only ones.
fn fallback_fn_with(mut item: ItemFn, e: TokenStream) -> TokenStream {
    strip_fn(&mut item);
    let attrs = &item.attrs;
    let vis = &item.vis;
    let sig = &item.sig;
    quote! {
        #e
        #(#attrs)*
        #[allow(unused_variables, unused_mut, unreachable_code)]
        #vis #sig {
            ::core::unimplemented!("#[distribute] failed to expand")
        }
    }
}
