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
mod valid;

#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Lays out a struct's parameters or a function's tensors on a named device mesh, with
/// placements checked at compile time.
///
/// # On a struct
///
/// ```ignore
/// use dtensor::DTensor;
///
/// #[dtensor::distribute(mesh = "dp,tp")]
/// pub struct Mlp {
///     #[placements = [Replicate, Shard(1)]] // column parallel
///     pub w1: DTensor<f32>,
///     #[placements = [Replicate, Shard(0)]] // row parallel
///     pub w2: DTensor<f32>,
/// }
/// // w1: Dt<f32, (dp, tp), (Replicate, Shard<1>), 2>, ...
/// // let mlp = Mlp::distribute(MlpGlobal { w1, w2 }, &mesh)?;
/// ```
///
/// Every `DTensor<T>` field (rank 2 unless written `DTensor<T, RANK>`) becomes a typed
/// `Dt<T, Mesh, Layout, RANK>`, also inside `Vec`, `Option`, `Box` and `[_; N]`. Placements
/// come from the field's `#[placements = [..]]` or the struct-level default
/// `placements = [..]`; parameters cannot be `Partial`. A field holding another `#[distribute]`
/// struct (or a `Vec`, `Option`, `Box`, `[_; N]` of them) contributes its parameters under
/// dotted names (`blocks.0.w1`); plain data (numbers, `bool`, `String`) is copied; any other
/// field must be marked `#[distribute(skip)]` — a field the macro cannot type (a tensor behind
/// a type alias, a foreign type) is a compile error at the field, never a parameter silently
/// left out. Generated (impls `#[automatically_derived]`): the `{Name}Global` struct of global
/// arrays, `Name::distribute(global, &mesh)`, `named_parameters`, `named_parameters_mut`,
/// `parameter_placements`, `MESH_DIMS`, the `Module` and `typed::Parameters` impls, and
/// `Name::partition` (a `partition_fn` for `distribute_module` that lays out a dynamic module
/// with the same parameter names). A struct whose parameters all live in nested modules takes
/// its element type from `elem = T` (default `f32`).
///
/// # On a function
///
/// ```ignore
/// #[dtensor::distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
/// fn forward(x: &DTensor<f32>, #[placements(Replicate, Shard(1))] w: &DTensor<f32>) -> dtensor::Result<DTensor<f32>> {
///     x.matmul(w)?.redistribute() // (Shard<0>, Shard<1>) -> the declared result layout
/// }
/// ```
///
/// `DTensor` arguments (also `&[DTensor<T>]`, `Option<&DTensor<T>>`, tuples) take their own
/// `#[placements(..)]` or the default `placements`; the result takes `returns = [..]` (one
/// list for every tensor of the result, or `returns = [[..], [..]]`: one per tensor of a
/// tuple, in order) or the default. A call with a tensor of another layout does not compile
/// (the error names both layouts). A tensor argument or result written through a type alias,
/// and a function in which nothing would be typed, are compile errors.
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
        Ok(other) => {
            let e = syn::Error::new_spanned(
                &other,
                "`#[distribute]` applies to a struct (its parameters) or a function (its tensor arguments and result)",
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
