//! Code generation for `#[distribute]` on structs and functions from inputs that passed
//! validation, and the fallback expansions used when it failed (the item without the macro's
//! attributes plus stubs of what it would generate, so the user sees the macro's errors and
//! not a cascade of follow-up ones). No checks live here: they are all in `valid`.

use crate::ast::{self, TensorTy};
use crate::attr::{self, Args, MeshAst};
use crate::valid::{self, FieldPlan, FnPlan, Marker, StructPlan};
use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Fields, FnArg, ItemFn, ItemStruct, Pat, ReturnType};

/// Mesh dim names the runtime predefines in `dtensor::typed::dims` (a unit test of this
/// crate checks this list against `dtensor_runtime::typed::dims::PREDEFINED`).
pub(crate) const PREDEFINED_DIMS: &[&str] =
    &["dp", "tp", "pp", "cp", "sp", "ep", "fsdp", "dim0", "dim1", "dim2", "dim3"];

/// The path of the facade crate: `crate = ".."` or `::dtensor`.
pub(crate) fn krate(args: &Args) -> TokenStream {
    match &args.krate {
        Some(p) => p.to_token_stream(),
        None => quote!(::dtensor),
    }
}

/// The type of the mesh: a tuple of dim name types. Predefined names come from the runtime;
/// others must be declared in scope with `dtensor::mesh_dim!`. An undeclared one is rustc's
/// "cannot find type" at the mesh string: a failed name lookup cannot carry a note, and a
/// generated fallback type with one would shadow, or be ambiguous with, the user's own dims
/// (a glob import or a block-scoped one outranks them; only a prelude ranks below a glob).
fn mesh_type(krate: &TokenStream, mesh: &MeshAst) -> TokenStream {
    let dims = mesh.names.iter().map(|n| dim_type(krate, mesh, n));
    quote!((#(#dims,)*))
}

/// The type of the mesh dim `name` (see [`mesh_type`]).
fn dim_type(krate: &TokenStream, mesh: &MeshAst, name: &str) -> TokenStream {
    let span = mesh.lit.span();
    let id = Ident::new(name, span);
    if PREDEFINED_DIMS.contains(&name) {
        quote_spanned!(span=> #krate::typed::dims::#id)
    } else {
        quote_spanned!(span=> #id)
    }
}

/// A placement as the user writes it (`Shard(1)`, `Replicate`).
fn placement_tokens(m: Marker) -> TokenStream {
    match m {
        Marker::Shard(d) => {
            let d = Literal::usize_unsuffixed(d);
            quote!(Shard(#d))
        }
        Marker::Replicate => quote!(Replicate),
        Marker::Partial(op) => {
            let op = Ident::new(op, Span::call_site());
            quote!(Partial(#op))
        }
    }
}

/// A nested module field's type in a shards struct: each module `X` (also inside `Vec`,
/// `Option`, `Box`, `[_; N]`) becomes its own shards struct, `<X as FsdpShards<T, D>>::Shards`.
fn shards_type(ty: &syn::Type, shards: &dyn Fn(&syn::Type) -> TokenStream) -> TokenStream {
    match ty {
        syn::Type::Path(p) if p.qself.is_none() => {
            let last = p.path.segments.last().expect("a path has a segment");
            let container = ["Vec", "Option", "Box"].iter().any(|c| last.ident == c);
            if let (true, syn::PathArguments::AngleBracketed(a)) = (container, &last.arguments) {
                if let [syn::GenericArgument::Type(inner)] = a.args.iter().collect::<Vec<_>>().as_slice() {
                    let mut path = p.path.clone();
                    let inner = shards_type(inner, shards);
                    if let Some(seg) = path.segments.last_mut() {
                        seg.arguments = syn::PathArguments::AngleBracketed(syn::parse_quote!(<#inner>));
                    }
                    return path.to_token_stream();
                }
            }
            shards(ty)
        }
        syn::Type::Array(a) => {
            let (inner, len) = (shards_type(&a.elem, shards), &a.len);
            quote!([#inner; #len])
        }
        _ => shards(ty),
    }
}

fn marker_type(krate: &TokenStream, m: Marker) -> TokenStream {
    match m {
        Marker::Shard(d) => {
            let d = Literal::usize_unsuffixed(d);
            quote!(#krate::Shard<#d>)
        }
        Marker::Replicate => quote!(#krate::Replicate),
        Marker::Partial(op) => {
            let op = Ident::new(op, Span::call_site());
            quote!(#krate::Partial<#krate::#op>)
        }
    }
}

/// `(Shard<0>, Replicate)`.
fn layout_type(krate: &TokenStream, markers: &[Marker]) -> TokenStream {
    let ms = markers.iter().map(|m| marker_type(krate, *m));
    quote!((#(#ms,)*))
}

/// `Dt<T, M, L, R>` with the span of the type the user wrote (without its reference).
fn dt_type(krate: &TokenStream, ty: &TensorTy, mesh_ty: &TokenStream, layout: &TokenStream) -> TokenStream {
    let elem = &ty.elem;
    let rank = Literal::usize_unsuffixed(ty.rank);
    let span = ty.tokens.span();
    quote_spanned!(span=> #krate::typed::Dt<#elem, #mesh_ty, #layout, #rank>)
}

/// `&Dt<..>` / `Dt<..>` as the user's `&DTensor<..>` / `DTensor<..>`.
fn typed_tensor(krate: &TokenStream, ty: &TensorTy, mesh_ty: &TokenStream, markers: &[Marker]) -> TokenStream {
    with_reference(ty, dt_type(krate, ty, mesh_ty, &layout_type(krate, markers)))
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

// ------------------------------------------------------------------------------ structs

/// `#[distribute]` on a struct whose checks passed (`item` has its helper attributes removed).
pub(crate) fn expand_struct(krate: &TokenStream, mut item: ItemStruct, plan: StructPlan<'_>) -> TokenStream {
    let mesh_ty = mesh_type(krate, plan.mesh);
    let elem = &plan.elem;
    let ident = item.ident.clone();
    let vis = item.vis.clone();
    let global_ident = format_ident!("{}Global", ident);
    let params = quote!(#krate::typed::Parameters<#elem>);
    let dynamic = quote!(#krate::DTensor<#elem>);
    let generated = quote!(#krate::typed::params::generated);
    // A field whose type is not a parameter by its syntax (a nested `#[distribute]` struct, or
    // a type the macro cannot type: an alias, a foreign type) is checked once, at its span;
    // every generated item assumes the same bound, so a type that fails it is that one error
    // and not one per generated item. `for<'__dt>` keeps rustc from rejecting the bound when
    // it names no generic and is false (a "trivial bound").
    let mut checks = Vec::new();
    let mut generics = item.generics.clone();
    // Same for the element type when it is not plainly a float (an alias, a generic without
    // the `Element` bound): `Parameters<T>` needs `T: Element`.
    if !ast::is_float_elem(elem) {
        let span = elem.span();
        checks.push(quote_spanned!(span=> element_type_is_a_float::<#elem>();));
        generics.make_where_clause().predicates.push(syn::parse_quote!(for<'__dt> #elem: #krate::Element));
    }

    let mut global_fields = Vec::new();
    let mut init = Vec::new();
    let mut collect = Vec::new();
    let mut collect_mut = Vec::new();
    let mut placements = Vec::new();
    let mut patterns = Vec::new();
    let mut load = Vec::new();
    let mut buffers = Vec::new();
    let mut buffers_mut = Vec::new();
    // `fsdp = "dim"`: the fields of `{Name}Shards`, the parameters with their resting layouts.
    let mut shard_fields = Vec::new();
    let fsdp_dim = plan.fsdp.map(|(pos, lit)| (pos, dim_type(krate, plan.mesh, &lit.value())));
    for (f, fplan) in item.fields.iter_mut().zip(&plan.fields) {
        let fname = f.ident.clone().expect("named field");
        if let Some((pos, dim)) = &fsdp_dim {
            let (fvis, ty) = (&f.vis, &f.ty);
            let kept: Vec<_> =
                f.attrs.iter().filter(|a| a.path().is_ident("doc") || a.path().is_ident("cfg")).collect();
            match fplan {
                FieldPlan::Tensors(markers, false) => {
                    let mut written = Vec::new();
                    let _ = ast::find_tensors(ty, &mut written);
                    let rank = written.first().map_or(ast::DEFAULT_RANK, |t| t.rank);
                    let at_rest = markers.first().map(|m| valid::resting(m, rank, *pos)).unwrap_or_default();
                    let list = at_rest.into_iter().map(placement_tokens);
                    shard_fields.push(quote!(#(#kept)* #[placements = [#(#list),*]] #fvis #fname: #ty));
                }
                FieldPlan::Nested => {
                    let elem = &plan.elem;
                    let nested = shards_type(ty, &|m| quote!(<#m as #krate::typed::FsdpShards<#elem, #dim>>::Shards));
                    shard_fields.push(quote!(#(#kept)* #fvis #fname: #nested));
                }
                FieldPlan::Tensors(_, true) | FieldPlan::Plain => {}
            }
        }
        let key = ast::ident_name(&fname);
        let fvis = &f.vis;
        let docs: Vec<_> = f.attrs.iter().filter(|a| a.path().is_ident("doc")).cloned().collect();
        // A field the user compiles conditionally: everything generated about it carries the
        // same `#[cfg]`, so it disappears with the field.
        let cfgs: Vec<_> = f.attrs.iter().filter(|a| a.path().is_ident("cfg")).cloned().collect();
        let mut global_ty = f.ty.clone();
        let surely_parameters = ast::surely_parameters(&f.ty);
        let is_buffer = matches!(fplan, FieldPlan::Tensors(_, true));
        match fplan {
            FieldPlan::Plain => {
                global_fields.push(quote!(#(#cfgs)* #(#docs)* #fvis #fname: #global_ty));
                init.push(quote!(#(#cfgs)* #fname: global.#fname));
                let ty_name = f.ty.to_token_stream().to_string();
                load.push(quote!(#(#cfgs)* #fname: #krate::typed::source::plain_field(
                    &#krate::typed::params::join(prefix, #key), #ty_name)?));
                continue;
            }
            FieldPlan::Tensors(markers, _) => {
                // The user's `DTensor` import counts as used.
                let mut written = Vec::new();
                let _ = ast::find_tensors(&f.ty, &mut written);
                checks.extend(written.iter().map(|t| {
                    let dynamic = &t.dynamic;
                    quote!(#(#cfgs)* let _ = ::core::marker::PhantomData::<#dynamic>;)
                }));
                ast::rewrite_tensors(&mut global_ty, &mut |_, t| {
                    let e = &t.elem;
                    quote!(#krate::ndarray::ArrayD<#e>)
                });
                ast::rewrite_tensors(&mut f.ty, &mut |k, t| typed_tensor(krate, t, &mesh_ty, &markers[k]));
                if !surely_parameters {
                    let ty = &f.ty;
                    global_ty = syn::parse2(quote!(<#ty as #params>::Global)).expect("projection parses");
                }
            }
            FieldPlan::Nested => {
                let ty = &f.ty;
                let span = ty.span();
                global_ty = syn::parse2(quote_spanned!(span=> <#ty as #params>::Global)).expect("projection parses");
            }
        }
        let ty = &f.ty;
        let span = ty.span();
        if !surely_parameters {
            checks.push(quote_spanned!(span=> #(#cfgs)* field_is_a_parameter_module_or_plain_data::<#elem, #ty>();));
            // A where-clause predicate cannot carry a `#[cfg]`: a conditional field's type is
            // checked by its (conditional) uses instead.
            if cfgs.is_empty() {
                generics.make_where_clause().predicates.push(syn::parse_quote!(for<'__dt> #ty: #params));
            }
        }
        global_fields.push(quote!(#(#cfgs)* #(#docs)* #fvis #fname: #global_ty));
        let path = quote!(&#krate::typed::params::join(prefix, #key));
        if is_buffer {
            // A buffer's tensors are placed, loaded and saved as parameters are, but never
            // require grad and are listed by `named_buffers`, so no optimizer sees them.
            init.push(quote_spanned!(span=> #(#cfgs)* #fname: #krate::typed::params::into_buffers(
                <_ as #params>::distribute_global(global.#fname, mesh)?)));
            load.push(quote_spanned!(span=> #(#cfgs)* #fname: #krate::typed::params::into_buffers(
                <_ as #params>::load_parameters(source, #path)?)));
            buffers.push(quote_spanned!(span=> #(#cfgs)* {
                <_ as #params>::collect_parameters(&self.#fname, #path, out);
            }));
            buffers_mut.push(quote_spanned!(span=> #(#cfgs)* {
                <_ as #params>::collect_parameters_mut(&mut self.#fname, #path, out);
            }));
            continue;
        }
        // The field's type is not repeated here (it is inferred from the field): an unknown
        // mesh dim in it is then one error, at the struct, and not one more per impl.
        init.push(quote_spanned!(span=> #(#cfgs)* #fname: <_ as #params>::distribute_global(global.#fname, mesh)?));
        load.push(quote_spanned!(span=> #(#cfgs)* #fname: <_ as #params>::load_parameters(source, #path)?));
        collect.push(quote_spanned!(span=> #(#cfgs)* {
            <_ as #params>::collect_parameters(&self.#fname, #path, out);
        }));
        collect_mut.push(quote_spanned!(span=> #(#cfgs)* {
            <_ as #params>::collect_parameters_mut(&mut self.#fname, #path, out);
        }));
        buffers.push(quote_spanned!(span=> #(#cfgs)* {
            <_ as #params>::collect_buffers(&self.#fname, #path, out);
        }));
        buffers_mut.push(quote_spanned!(span=> #(#cfgs)* {
            <_ as #params>::collect_buffers_mut(&mut self.#fname, #path, out);
        }));
        placements.push(quote_spanned!(span=> #(#cfgs)* {
            <_ as #params>::collect_placements(&self.#fname, #path, out);
        }));
        patterns.push(quote_spanned!(span=> #(#cfgs)* {
            #krate::typed::params::field_patterns::<#elem, Self, _>(|s: &Self| &s.#fname, #path, out);
        }));
    }
    let (impl_g, ty_g, where_g) = generics.split_for_impl();
    let (check_g, _, check_where) = item.generics.split_for_impl();
    let global_doc =
        format!("The global (not yet distributed) parameters of [`{ident}`], for [`{ident}::distribute`].");
    let mesh_names = &plan.mesh.names;
    // Typed field types (`Vec<Dt<f32, (dp, tp), (Replicate, Shard<1>), 2>>`) are long by nature;
    // the user wrote the short dynamic form.
    item.attrs.push(syn::parse_quote!(#[allow(clippy::type_complexity)]));
    let shards_item = match &fsdp_dim {
        None => quote!(),
        Some((_, dim)) => {
            let shards_ident = format_ident!("{}Shards", ident);
            let (mesh_lit, krate_lit) = (&plan.mesh.lit, krate.to_string());
            let fsdp_name = plan.fsdp.map(|(_, l)| l.value()).unwrap_or_default();
            let doc = format!(
                "The parameters of [`{ident}`] as they rest fully sharded over `{fsdp_name}` (`Fsdp::shards`): each \
                 field with its resting layout as its type."
            );
            quote! {
                #[doc = #doc]
                #[#krate::distribute(mesh = #mesh_lit, elem = #elem, crate = #krate_lit)]
                #[derive(Clone)]
                #vis struct #shards_ident {
                    #(#shard_fields,)*
                }

                #[automatically_derived]
                impl #krate::typed::FsdpShards<#elem, #dim> for #ident {
                    type Shards = #shards_ident;
                }
            }
        }
    };
    quote! {
        #item

        #shards_item

        const _: () = {
            #[allow(dead_code, clippy::type_complexity)]
            fn distribute_field_checks #check_g () #check_where {
                fn field_is_a_parameter_module_or_plain_data<Elem: #krate::Element, Field: #krate::typed::Parameters<Elem>>() {}
                fn element_type_is_a_float<Elem: #krate::Element>() {}
                #(#checks)*
            }
        };

        #[doc = #global_doc]
        #vis struct #global_ident #impl_g #where_g {
            #(#global_fields,)*
        }

        #[automatically_derived]
        #[doc(hidden)]
        impl #impl_g #params for #ident #ty_g #where_g {
            type Global = #global_ident #ty_g;
            fn distribute_global(global: Self::Global, mesh: &#krate::DeviceMesh) -> #krate::Result<Self> {
                ::core::result::Result::Ok(Self { #(#init,)* })
            }
            fn collect_parameters<'__a>(
                &'__a self,
                prefix: &str,
                out: &mut ::std::vec::Vec<(::std::string::String, &'__a #dynamic)>,
            ) {
                #(#collect)*
            }
            fn collect_parameters_mut<'__a>(
                &'__a mut self,
                prefix: &str,
                out: &mut ::std::vec::Vec<(::std::string::String, &'__a mut #dynamic)>,
            ) {
                #(#collect_mut)*
            }
            fn collect_placements(
                &self,
                prefix: &str,
                out: &mut ::std::vec::Vec<(::std::string::String, ::std::vec::Vec<#krate::Placement>)>,
            ) {
                #(#placements)*
            }
            fn collect_patterns(
                prefix: &str,
                out: &mut ::std::vec::Vec<(::std::string::String, ::std::vec::Vec<#krate::Placement>)>,
            ) {
                #(#patterns)*
            }
            fn load_parameters(
                source: &mut dyn #krate::typed::TensorSource<#elem>,
                prefix: &str,
            ) -> #krate::Result<Self> {
                ::core::result::Result::Ok(Self { #(#load,)* })
            }
            fn collect_buffers<'__a>(
                &'__a self,
                prefix: &str,
                out: &mut ::std::vec::Vec<(::std::string::String, &'__a #dynamic)>,
            ) {
                #(#buffers)*
            }
            fn collect_buffers_mut<'__a>(
                &'__a mut self,
                prefix: &str,
                out: &mut ::std::vec::Vec<(::std::string::String, &'__a mut #dynamic)>,
            ) {
                #(#buffers_mut)*
            }
        }

        #[automatically_derived]
        impl #impl_g #ident #ty_g #where_g {
            /// Names of the mesh dims this module is laid out on, in mesh-dim order.
            pub const MESH_DIMS: &'static [&'static str] = &[#(#mesh_names),*];

            /// Distributes global parameters over `mesh` with the declared placements
            /// (rank 0's data is scattered / broadcast), nested modules included; the
            /// parameters require grad. Errors if `mesh` does not have this struct's mesh dims.
            pub fn distribute(global: #global_ident #ty_g, mesh: &#krate::DeviceMesh) -> #krate::Result<Self> {
                Self::check_mesh(mesh)?;
                <Self as #params>::distribute_global(global, mesh)
            }

            /// Builds this module from a Hugging Face checkpoint directory: each parameter is
            /// the tensor `prefix` + its dotted name, read with its declared placements (this
            /// rank reads only its shard; no full-size model first), requiring grad. Strict,
            /// as PyTorch's `load_state_dict`: a missing tensor, a tensor under `prefix` that
            /// no parameter takes, or a rank that differs from the declared one is an error,
            /// and no module is returned. Errors if `mesh` does not have this struct's mesh
            /// dims.
            pub fn load_hf(
                checkpoint: &mut #krate::checkpoint::hf::HfCheckpoint,
                prefix: &str,
                mesh: &#krate::DeviceMesh,
            ) -> #krate::Result<Self> {
                Self::check_mesh(mesh)?;
                checkpoint.load_module::<#elem, Self>(prefix, mesh)
            }

            fn check_mesh(mesh: &#krate::DeviceMesh) -> #krate::Result<()> {
                #generated::check_mesh(mesh, Self::MESH_DIMS)
            }

            /// Every parameter with its dotted name (`blocks.0.w1` for a field `blocks` holding
            /// nested modules), in declaration order.
            pub fn named_parameters(&self) -> ::std::vec::Vec<(::std::string::String, &#dynamic)> {
                #generated::named_parameters(self)
            }

            /// Every parameter with its name, mutably (e.g. for an optimizer step).
            pub fn named_parameters_mut(&mut self) -> ::std::vec::Vec<(::std::string::String, &mut #dynamic)> {
                #generated::named_parameters_mut(self)
            }

            /// Every buffer (`#[distribute(buffer)]` fields, nested modules' included) with
            /// its dotted name: state that is placed, loaded and saved but not trained.
            pub fn named_buffers(&self) -> ::std::vec::Vec<(::std::string::String, &#dynamic)> {
                #generated::named_buffers(self)
            }

            /// Every buffer with its name, mutably.
            pub fn named_buffers_mut(&mut self) -> ::std::vec::Vec<(::std::string::String, &mut #dynamic)> {
                #generated::named_buffers_mut(self)
            }

            /// The declared placements of every parameter, by dotted name.
            pub fn parameter_placements(&self) -> ::std::vec::Vec<(::std::string::String, ::std::vec::Vec<#krate::Placement>)> {
                #generated::parameter_placements(self)
            }

            /// A `partition_fn` for `distribute_module` that lays out a *dynamic* module with
            /// the same parameter names as this struct declares (other names: replicated).
            /// Errors if `mesh` does not have this struct's mesh dims.
            pub fn partition(
                name: &str,
                _param: &#dynamic,
                mesh: &#krate::DeviceMesh,
            ) -> #krate::Result<::core::option::Option<::std::vec::Vec<#krate::Placement>>> {
                #generated::partition::<#elem, Self>(name, mesh, Self::MESH_DIMS)
            }
        }

        #[automatically_derived]
        impl #impl_g #krate::Module<#elem> for #ident #ty_g #where_g {
            fn named_parameters(&self) -> ::std::vec::Vec<(::std::string::String, &#dynamic)> {
                #generated::named_parameters(self)
            }
            fn named_parameters_mut(&mut self) -> ::std::vec::Vec<(::std::string::String, &mut #dynamic)> {
                #generated::named_parameters_mut(self)
            }
            fn declared_placements(&self) -> ::std::vec::Vec<(::std::string::String, ::std::vec::Vec<#krate::Placement>)> {
                #generated::parameter_placements(self)
            }
            fn named_buffers(&self) -> ::std::vec::Vec<(::std::string::String, &#dynamic)> {
                #generated::named_buffers(self)
            }
            fn named_buffers_mut(&mut self) -> ::std::vec::Vec<(::std::string::String, &mut #dynamic)> {
                #generated::named_buffers_mut(self)
            }
        }
    }
}

/// The struct as written (helper attributes and ranks removed) and every item the
/// expansion would generate, as stubs: code that uses `{Name}Global`, `Name::distribute`,
/// `named_parameters` or the `Module` impl then compiles, so the macro's errors are the only
/// ones.
pub(crate) fn fallback_struct(krate: &TokenStream, args: &Args, mut item: ItemStruct, e: TokenStream) -> TokenStream {
    let mut elem: Option<syn::Type> = None;
    let mut global_fields = Vec::new();
    for f in item.fields.iter_mut() {
        f.attrs.retain(|a| !attr::is_placements_attr(a) && !attr::is_field_distribute_attr(a));
        ast::strip_rank(&mut f.ty);
        let mut global_ty = f.ty.clone();
        ast::rewrite_tensors(&mut global_ty, &mut |_, t| {
            let e = &t.elem;
            if !ast::is_integer_elem(e) {
                elem.get_or_insert_with(|| e.clone());
            }
            with_reference(t, quote!(#krate::ndarray::ArrayD<#e>))
        });
        if let Some(fname) = &f.ident {
            let fvis = &f.vis;
            global_fields.push(quote!(#fvis #fname: #global_ty));
        }
    }
    let Fields::Named(_) = &item.fields else { return quote!(#e #item) };
    let elem = elem.or_else(|| args.elem.clone()).unwrap_or_else(|| syn::parse_quote!(f32));
    let ident = &item.ident;
    let vis = &item.vis;
    let global_ident = format_ident!("{}Global", ident);
    let (impl_g, ty_g, where_g) = item.generics.split_for_impl();
    let params = quote!(#krate::typed::Parameters<#elem>);
    let dynamic = quote!(#krate::DTensor<#elem>);
    let stub = quote!(::core::unimplemented!("#[distribute] failed to expand"));
    // `fsdp = "dim"` on a mesh that has it: `{Name}Shards` stands for the struct itself, so
    // code using the shards compiles and the macro's errors are the only ones.
    let shards_stub = match (&args.fsdp, &args.mesh) {
        (Some(lit), Some(mesh)) if mesh.names.contains(&lit.value()) && item.generics.params.is_empty() => {
            let (shards_ident, dim) = (format_ident!("{}Shards", ident), dim_type(krate, mesh, &lit.value()));
            quote! {
                #vis type #shards_ident = #ident;
                #[automatically_derived]
                impl #krate::typed::FsdpShards<#elem, #dim> for #ident {
                    type Shards = #ident;
                }
            }
        }
        _ => quote!(),
    };
    quote! {
        #e
        #item
        #shards_stub

        #vis struct #global_ident #impl_g #where_g {
            #(#global_fields,)*
        }

        #[automatically_derived]
        #[allow(unused_variables)]
        impl #impl_g #params for #ident #ty_g #where_g {
            type Global = #global_ident #ty_g;
            fn distribute_global(global: Self::Global, mesh: &#krate::DeviceMesh) -> #krate::Result<Self> { #stub }
            fn collect_parameters<'__a>(&'__a self, prefix: &str, out: &mut ::std::vec::Vec<(::std::string::String, &'__a #dynamic)>) { #stub }
            fn collect_parameters_mut<'__a>(&'__a mut self, prefix: &str, out: &mut ::std::vec::Vec<(::std::string::String, &'__a mut #dynamic)>) { #stub }
            fn collect_placements(&self, prefix: &str, out: &mut ::std::vec::Vec<(::std::string::String, ::std::vec::Vec<#krate::Placement>)>) { #stub }
            fn collect_patterns(prefix: &str, out: &mut ::std::vec::Vec<(::std::string::String, ::std::vec::Vec<#krate::Placement>)>) { #stub }
            fn load_parameters(source: &mut dyn #krate::typed::TensorSource<#elem>, prefix: &str) -> #krate::Result<Self> { #stub }
        }

        #[automatically_derived]
        #[allow(unused_variables, dead_code)]
        impl #impl_g #ident #ty_g #where_g {
            pub const MESH_DIMS: &'static [&'static str] = &[];
            pub fn distribute(global: #global_ident #ty_g, mesh: &#krate::DeviceMesh) -> #krate::Result<Self> { #stub }
            pub fn load_hf(checkpoint: &mut #krate::checkpoint::hf::HfCheckpoint, prefix: &str, mesh: &#krate::DeviceMesh) -> #krate::Result<Self> { #stub }
            pub fn named_parameters(&self) -> ::std::vec::Vec<(::std::string::String, &#dynamic)> { #stub }
            pub fn named_parameters_mut(&mut self) -> ::std::vec::Vec<(::std::string::String, &mut #dynamic)> { #stub }
            pub fn named_buffers(&self) -> ::std::vec::Vec<(::std::string::String, &#dynamic)> { #stub }
            pub fn named_buffers_mut(&mut self) -> ::std::vec::Vec<(::std::string::String, &mut #dynamic)> { #stub }
            pub fn parameter_placements(&self) -> ::std::vec::Vec<(::std::string::String, ::std::vec::Vec<#krate::Placement>)> { #stub }
            pub fn partition(name: &str, _param: &#dynamic, mesh: &#krate::DeviceMesh)
                -> #krate::Result<::core::option::Option<::std::vec::Vec<#krate::Placement>>> { #stub }
        }

        #[automatically_derived]
        impl #impl_g #krate::Module<#elem> for #ident #ty_g #where_g {
            fn named_parameters(&self) -> ::std::vec::Vec<(::std::string::String, &#dynamic)> { #stub }
            fn named_parameters_mut(&mut self) -> ::std::vec::Vec<(::std::string::String, &mut #dynamic)> { #stub }
        }
    }
}

// ---------------------------------------------------------------------------- functions

/// `#[distribute]` on a function whose checks passed (`item` has its helper attributes
/// removed).
pub(crate) fn expand_fn(krate: &TokenStream, mut item: ItemFn, plan: FnPlan<'_>) -> TokenStream {
    let mesh_ty = mesh_type(krate, plan.mesh);
    // Every tensor argument gets its concrete typed form (`x: &Dt<f32, (dp, tp), (Shard<0>,
    // Replicate), 2>`), direct or in a container: no hidden generic, so rustdoc shows the
    // layout, callers need no annotation and `f(&x.redistribute()?)` infers its target. A
    // caller's tensor of another layout is then a type mismatch that names both layouts.
    let mut prologue = Vec::new();
    let mut typed_args = Vec::new();
    for (i, _slot, markers) in &plan.args {
        typed_args.push(*i);
        if let FnArg::Typed(pt) = &mut item.sig.inputs[*i] {
            ast::rewrite_tensors(&mut pt.ty, &mut |j, t| typed_tensor(krate, t, &mesh_ty, &markers[j]));
        }
    }
    // Arguments without a visible tensor: probe for a `DTensor` under another name.
    for (i, arg) in item.sig.inputs.iter().enumerate() {
        if let FnArg::Typed(pt) = arg {
            if !typed_args.contains(&i) && !ast::has_impl_trait(&pt.ty) {
                prologue.push(probe(krate, &pt.ty));
            }
        }
    }
    if let ReturnType::Type(_, t) = &mut item.sig.output {
        if plan.ret.is_empty() {
            if !ast::has_impl_trait(t) {
                prologue.push(probe(krate, t));
            }
        } else {
            ast::rewrite_tensors(t, &mut |j, tt| typed_tensor(krate, tt, &mesh_ty, &plan.ret[j]));
        }
    }
    // Mention the user's `DTensor` path so that its import counts as used.
    for (_, s, _) in &plan.args {
        let dynamic = &s.ty.dynamic;
        prologue.push(quote!(let _ = ::core::marker::PhantomData::<#dynamic>;));
    }
    prologue.push(implicit_scope(krate, &item, plan.allow_implicit));
    crate::infer::operands_take_receiver_layout(krate, &mut item.block);
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

/// `let __dtensor_implicit_scope = ..;`: the promise that no collective runs that the body
/// does not show. Dynamic ops in the body may not redistribute their inputs on their own
/// (unless `implicit = "allow"`, which also lifts a caller's scope for this body).
fn implicit_scope(krate: &TokenStream, item: &ItemFn, allow: bool) -> TokenStream {
    let name = ast::ident_name(&item.sig.ident);
    let site = item.sig.ident.span();
    let scope = if allow {
        quote_spanned!(site=> #krate::ops::implicit::allow_implicit())
    } else {
        quote_spanned!(site=> #krate::ops::implicit::forbid_implicit(#krate::ops::implicit::ScopeSite {
            function: #name,
            file: ::core::file!(),
            line: ::core::line!(),
        }))
    };
    quote!(let __dtensor_implicit_scope = #scope;)
}

/// `#[distribute]` on a method of a trait impl whose checks passed. The trait fixes the
/// signature, so it stays dynamic: each tensor argument is checked against its declared
/// layout on entry (`Dt::from_argument_ref`, an error naming the argument, the method and the
/// argument's line) and the body sees the typed tensor under the same name; the body's typed
/// result is handed back as the trait's `DTensor`.
pub(crate) fn expand_trait_fn(krate: &TokenStream, mut item: ItemFn, plan: FnPlan<'_>) -> TokenStream {
    let mesh_ty = mesh_type(krate, plan.mesh);
    let mut prologue = Vec::new();
    for (i, slot, markers) in &plan.args {
        let FnArg::Typed(pt) = &mut item.sig.inputs[*i] else { continue };
        ast::strip_rank(&mut pt.ty);
        let Pat::Ident(pi) = &*pt.pat else { continue };
        let id = &pi.ident;
        let pat = &pt.pat;
        // At the argument's name: a wrong tensor's error points there.
        let span = id.span();
        let ty = typed_tensor(krate, &slot.ty, &mesh_ty, &markers[0]);
        let conv = if slot.ty.reference.is_some() { quote!(from_argument_ref) } else { quote!(from_argument) };
        let (arg, function) = (ast::ident_name(id), ast::ident_name(&item.sig.ident));
        prologue.push(quote_spanned!(span=>
            let #pat: #ty = #krate::typed::Dt::#conv(#id, #arg, #function, (::core::file!(), ::core::line!()))?;
        ));
    }
    let mut typed_ret = quote!(());
    if let ReturnType::Type(_, t) = &mut item.sig.output {
        let mut typed = (**t).clone();
        ast::rewrite_tensors(&mut typed, &mut |j, tt| typed_tensor(krate, tt, &mesh_ty, &plan.ret[j]));
        typed_ret = typed.to_token_stream();
        ast::strip_rank(t);
    }
    prologue.push(implicit_scope(krate, &item, plan.allow_implicit));
    crate::infer::operands_take_receiver_layout(krate, &mut item.block);
    let body = &item.block;
    let attrs = &item.attrs;
    let vis = &item.vis;
    let sig = &item.sig;
    // A closure, so that the body's own `return`s and `?`s produce the typed result.
    quote! {
        #(#attrs)*
        #[allow(clippy::type_complexity, clippy::redundant_closure_call)]
        #vis #sig {
            #(#prologue)*
            let __dtensor_typed: #typed_ret = (|| -> #typed_ret #body)();
            __dtensor_typed.map(#krate::typed::Dt::into_dtensor)
        }
    }
}

/// `(&&Probe::<ty>::new()).check();` at the span of `ty`: an error when `ty` is a `DTensor`
/// shape the macro did not see (a type alias).
fn probe(krate: &TokenStream, ty: &syn::Type) -> TokenStream {
    let span = ty.span();
    let mut ty = ty.clone();
    elide_lifetimes(&mut ty);
    // Every token of the call at the argument, so that the error points there.
    let krate = respan(krate.clone(), span);
    quote_spanned!(span=> {
        #[allow(unused_imports)]
        use #krate::typed::probe::{ProbeOther as _, ProbeTensor as _};
        (&&#krate::typed::probe::Probe::<#ty>::new()).check();
    })
}

/// `tokens` with every span set to `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut t| {
            if let proc_macro2::TokenTree::Group(g) = &t {
                let mut ng = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                ng.set_span(span);
                t = proc_macro2::TokenTree::Group(ng);
            } else {
                t.set_span(span);
            }
            t
        })
        .collect()
}

/// `'a` → `'_` (the function's lifetimes cannot be named in its body's expressions).
fn elide_lifetimes(ty: &mut syn::Type) {
    struct Elide;
    impl syn::visit_mut::VisitMut for Elide {
        fn visit_lifetime_mut(&mut self, l: &mut syn::Lifetime) {
            if l.ident != "static" {
                *l = syn::Lifetime::new("'_", l.span());
            }
        }
    }
    syn::visit_mut::VisitMut::visit_type_mut(&mut Elide, ty);
}

/// The function with its original signature (helper attributes and ranks removed) and a body
/// that type-checks whatever the signature says, so the macro's errors are the only ones.
pub(crate) fn fallback_fn(mut item: ItemFn, e: TokenStream) -> TokenStream {
    for arg in item.sig.inputs.iter_mut() {
        if let FnArg::Typed(pt) = arg {
            pt.attrs.retain(|a| !attr::is_placements_attr(a));
            ast::strip_rank(&mut pt.ty);
        }
    }
    let mut opaque = false;
    if let ReturnType::Type(_, t) = &mut item.sig.output {
        ast::strip_rank(t);
        opaque = ast::has_impl_trait(t);
    }
    let attrs = &item.attrs;
    let vis = &item.vis;
    let sig = &item.sig;
    // A diverging stub gives an `impl Trait` result no hidden type (rustc picks `()`, which
    // then fails the trait: a second, unrelated error); the user's own body gives it one.
    let body = if opaque {
        let block = &item.block;
        quote!(#block)
    } else {
        quote!({ ::core::unimplemented!("#[distribute] failed to expand") })
    };
    quote! {
        #e
        #(#attrs)*
        #[allow(unused_variables, unused_mut, unreachable_code)]
        #vis #sig #body
    }
}
