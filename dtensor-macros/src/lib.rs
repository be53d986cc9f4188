//! Proc macros of dtensor-rs: `#[distribute]` turns structs and functions over `DTensor`s into
//! typed code (`dtensor::typed::Dt`), so that illegal layouts fail at `cargo build`.
//!
//! Use it through the facade crate `dtensor` (generated code refers to `::dtensor::...`).
//!
//! Structure (as thiserror-impl): parse (`attr`: the macro's syntax; `ast`: the tensor fields
//! and arguments) → validate (`valid`: every check) → expand (`expand`: code generation only).
//! Every problem is reported on the token that caused it, all at once, and a failed expansion
//! still emits the item (without the macro's attributes) plus stubs of everything it would
//! generate, so that no follow-up errors bury the real one.

mod ast;
mod attr;
mod errors;
mod expand;
mod infer;
mod valid;

#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Lays out a struct's parameters or a function's tensors on a named device mesh, with
/// placements checked at compile time.
///
/// # On a struct
///
/// ```
/// use dtensor::{distribute, DTensor};
///
/// #[distribute(mesh = "dp,tp")]
/// pub struct Mlp {
///     #[placements = [Replicate, Shard(1)]] // column parallel
///     pub w1: DTensor<f32>,
///     #[placements = [Replicate, Shard(0)]] // row parallel
///     pub w2: DTensor<f32>,
/// }
/// // w1: Dt<f32, (dp, tp), (Replicate, Shard<1>), 2>, ...
///
/// let names = dtensor::run(4, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
///     let ones = |r: usize, c: usize| dtensor::ndarray::ArrayD::<f32>::ones(vec![r, c]);
///     let mlp = Mlp::distribute(MlpGlobal { w1: ones(4, 8), w2: ones(8, 4) }, &mesh)?;
///     Ok(mlp.named_parameters().into_iter().map(|(n, _)| n).collect::<Vec<_>>())
/// })
/// .unwrap();
/// assert_eq!(names[0], ["w1", "w2"]);
/// ```
///
/// Every `DTensor<T>` field (rank 2 unless written `DTensor<T, RANK>`) becomes a typed
/// `Dt<T, Mesh, Layout, RANK>`, also inside `Vec`, `Option`, `Box` and `[_; N]`. Placements
/// come from the field's `#[placements = [..]]` or the struct-level default
/// `placements = [..]`; parameters cannot be `Partial`. A field holding another `#[distribute]`
/// struct (or a `Vec`, `Option`, `Box`, `[_; N]` of them) contributes its parameters under
/// dotted names (`blocks.0.w1`); plain data (numbers, `bool`, `String`) is copied; any other
/// field must be marked `#[distribute(skip)]` — a field the macro cannot type (a tensor behind
/// a type alias, a foreign type) is one compile error at the field, never a parameter silently
/// left out. Parameters are floating point: a `DTensor<i64>` field is an error (integer tensors
/// are arguments of `#[distribute]` functions). A tensor field marked `#[distribute(buffer)]`
/// is state, not a parameter (running statistics, fixed tables): placed, loaded and saved the
/// same way, listed by `named_buffers` and never by `named_parameters` (so no optimizer sees
/// it), never requiring grad. Generated (impls `#[automatically_derived]`): the `{Name}Global` struct of global
/// arrays, `Name::distribute(global, &mesh)`, `Name::load_hf(&mut checkpoint, prefix, &mesh)`
/// (built from a Hugging Face checkpoint with the declared placements, each rank reading only
/// its shards), `named_parameters`, `named_parameters_mut`, `named_buffers`,
/// `named_buffers_mut`, `parameter_placements`, `MESH_DIMS`, the `Module` and
/// `typed::Parameters` impls, and
/// `Name::partition` (a `partition_fn` for `distribute_module` that lays out a dynamic module
/// with the same parameter names). A struct whose parameters all live in nested modules takes
/// its element type from `elem = T` (default `f32`).
///
/// `fsdp = "dp"` declares that the struct is used fully sharded over `dp`
/// (`dtensor::typed::Fsdp<T, Name, dp>`): its fields keep the layouts they are used in
/// (`Replicate` on `dp`, a field sharded there is an error), and the macro also generates
/// `NameShards`, the parameters as they rest — each field with its resting layout as its type
/// (`Shard<d>` on `dp`, `d` the first tensor dim no other mesh dim shards; nested modules by
/// their own shards structs, which they declare the same way) — returned by `Fsdp::shards`.
///
/// # On a function
///
/// ```
/// use dtensor::{distribute, DTensor};
///
/// #[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
/// fn forward(x: &DTensor<f32>, #[placements(Replicate, Shard(1))] w: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
///     x.matmul(w)?.redistribute() // (Shard<0>, Shard<1>) -> the declared result layout
/// }
///
/// let shapes = dtensor::run(4, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
///     let x = dtensor::Dt::distribute(&dtensor::ndarray::ArrayD::ones(vec![4, 3]), &mesh)?;
///     let w = dtensor::Dt::distribute(&dtensor::ndarray::ArrayD::ones(vec![3, 6]), &mesh)?;
///     let y = forward(&x, &w)?; // every layout is inferred from `forward`'s signature
///     Ok(y.local().shape().to_vec())
/// })
/// .unwrap();
/// assert_eq!(shapes[0], [2, 6]);
/// ```
///
/// `DTensor` arguments (also `&[DTensor<T>]`, `Option<&DTensor<T>>`, tuples) take their own
/// `#[placements(..)]` or the default `placements`; the result takes `returns = [..]` (one
/// list for every tensor of the result, or `returns = [[..], [..]]`: one per tensor of a
/// tuple, in order) or the default. A call with a tensor of another layout does not compile
/// (the error names both layouts). A tensor argument or result written through a type alias,
/// and a function in which nothing would be typed, are compile errors.
///
/// The signature keeps no hidden generic: a tensor argument is exactly
/// `&Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>`, so callers need no annotation, rustdoc shows
/// the layout, and `f(&x.redistribute()?)` infers the target from `f`. A tensor of another
/// layout is a type mismatch naming both layouts (on the mesh, `(dp, tp)`): redistribute it.
///
/// In the body, `x.add(&y.redistribute()?)` (also `sub`, `mul`, `div` and the comparison masks
/// `eq_mask` … `ge_mask`) redistributes `y` to the layout the op needs beside `x`'s: `x`'s own,
/// except that a `Partial` `x` of `mul`/`div` takes a `Replicate` operand there. The op alone
/// cannot choose among the layouts it accepts, so the body says `y.redistribute_like(&x)` (with
/// that exception) for you. An explicit target (`redistribute::<L>()`, or `redistribute::<_>()`
/// for a type of your own with a `redistribute` method) and a turbofish on the op are left as
/// written, and so are macro calls (`assert!(..)`); outside a body, write `Dt::redistribute_like`.
///
/// # No implicit communication
///
/// The body runs in a scope in which a *dynamic* op that would redistribute an input on its
/// own (e.g. `exp` of a `Partial` tensor reached through `.as_dtensor()`) returns
/// `Error::ImplicitCollective`, naming the op, the layouts and this function, instead of
/// running a collective the code does not show. Explicit `.redistribute()` calls are always
/// allowed; `implicit = "allow"` lets the body's dynamic ops redistribute as they would
/// outside (`implicit = "deny"` is the default).
///
/// The scope covers what the body starts: a helper thread spawned inside it answers to it.
/// What would run after the body returned cannot: under the default, the function may not be
/// `async` nor return a closure, iterator or future (`impl Fn`, `impl Iterator`, their `dyn`
/// forms), a compile error that says so.
///
/// # Other arguments
///
/// `crate = "path"` names the facade crate when it is renamed or re-exported (default
/// `::dtensor`).
///
/// # Placement syntax
///
/// `Shard(d)` (negative `d` counts from the end), `Replicate`, `Partial(Sum|Avg|Min|Max|Product)`
/// (bare `Partial` is `Partial(Sum)`), one per mesh dim in order, or by name:
/// `[tp = Shard(1)]` (unnamed dims are `Replicate`). Mesh dim names other than `dp`, `tp`, `pp`,
/// `cp`, `sp`, `ep`, `fsdp`, `dim0`..`dim3` must be declared with `dtensor::mesh_dim!`.
#[proc_macro_attribute]
pub fn distribute(args: TokenStream, item: TokenStream) -> TokenStream {
    distribute_impl(args.into(), item.into()).into()
}

/// Parse → validate → expand (or the fallback), on `proc_macro2` tokens (unit-testable).
fn distribute_impl(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> proc_macro2::TokenStream {
    let mut errs = errors::Errors::default();
    let args_tokens = args.clone();
    let args = attr::parse_args(args, &mut errs);
    let krate = expand::krate(&args);
    match syn::parse2::<syn::Item>(item.clone()) {
        Ok(syn::Item::Struct(mut s)) => {
            let fields = ast::parse_struct(&mut s, &mut errs);
            let plan = valid::validate_struct(&args, &s, fields, &mut errs);
            match (plan, errs.into_compile_errors()) {
                (Some(plan), None) => expand::expand_struct(&krate, s, plan),
                (_, e) => expand::fallback_struct(&krate, &args, s, e.unwrap_or_default()),
            }
        }
        Ok(syn::Item::Fn(mut f)) => {
            let slots = ast::parse_fn(&mut f, &mut errs);
            let plan = valid::validate_fn(&args, &f, slots, &mut errs);
            match (plan, errs.into_compile_errors()) {
                (Some(plan), None) => expand::expand_fn(&krate, f, plan),
                (_, e) => expand::fallback_fn(f, e.unwrap_or_default()),
            }
        }
        Ok(syn::Item::Impl(imp)) => {
            if let Some(lit) = &args.fsdp {
                errs.spanned(lit, "`fsdp` only applies to structs (the parameters that rest sharded)");
            }
            let e = errs.into_compile_errors();
            let imp = impl_block(&args_tokens, args.mesh.is_some(), imp);
            quote::quote!(#e #imp)
        }
        Ok(other) => {
            let e = syn::Error::new_spanned(
                &other,
                "`#[distribute]` applies to a struct (its parameters), a function (its tensor arguments and result) or an `impl` block (its methods)",
            )
            .into_compile_error();
            quote::quote!(#e #item)
        }
        Err(e) => {
            let e = e.into_compile_error();
            quote::quote!(#e #item)
        }
    }
}

/// `#[distribute]` on an `impl` block: every method with its own `#[distribute(..)]` (whose
/// missing arguments come from the block's), and every method with a `DTensor` in its
/// signature when the block names a mesh, is expanded as a function; in a trait impl with the
/// trait's signature kept ([`expand::expand_trait_fn`]).
fn impl_block(block_args: &proc_macro2::TokenStream, block_has_mesh: bool, mut imp: syn::ItemImpl) -> syn::ItemImpl {
    let in_trait = imp.trait_.is_some();
    for item in imp.items.iter_mut() {
        let syn::ImplItem::Fn(f) = item else { continue };
        let own = f.attrs.iter().position(attr::is_field_distribute_attr).map(|i| f.attrs.remove(i));
        let mentions_tensor = f.sig.inputs.iter().any(|a| matches!(a, syn::FnArg::Typed(pt) if has_tensor(&pt.ty)))
            || matches!(&f.sig.output, syn::ReturnType::Type(_, t) if has_tensor(t));
        if own.is_none() && !(block_has_mesh && mentions_tensor) {
            continue;
        }
        let mut errs = errors::Errors::default();
        let own_tokens = match own.as_ref().map(|a| &a.meta) {
            Some(syn::Meta::List(l)) => l.tokens.clone(),
            _ => proc_macro2::TokenStream::new(),
        };
        // The block's own errors were reported once, on the block (`fsdp` there too).
        let mut defaults = attr::parse_args(block_args.clone(), &mut errors::Errors::default());
        defaults.fsdp = None;
        let args = attr::parse_args(own_tokens, &mut errs).or(defaults);
        let krate = expand::krate(&args);
        let (attrs, vis, sig, block) = (&f.attrs, &f.vis, &f.sig, &f.block);
        let Ok(mut func) = syn::parse2::<syn::ItemFn>(quote::quote!(#(#attrs)* #vis #sig #block)) else { continue };
        let slots = ast::parse_fn(&mut func, &mut errs);
        let plan = valid::validate_fn(&args, &func, slots, &mut errs);
        if let (Some(plan), true) = (&plan, in_trait) {
            valid::check_trait_fn(&func, plan, &mut errs);
        }
        let tokens = match (plan, errs.into_compile_errors()) {
            (Some(plan), None) if in_trait => expand::expand_trait_fn(&krate, func, plan),
            (Some(plan), None) => expand::expand_fn(&krate, func, plan),
            (_, e) => expand::fallback_fn(func, e.unwrap_or_default()),
        };
        *item = syn::ImplItem::Verbatim(tokens);
    }
    imp
}

/// Does `ty` mention a `DTensor`?
fn has_tensor(ty: &syn::Type) -> bool {
    let mut found = Vec::new();
    ast::find_tensors(ty, &mut found).is_err() || !found.is_empty()
}
