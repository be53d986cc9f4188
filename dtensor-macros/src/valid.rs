//! Validation: every check of the macro's input (placements against the mesh and the tensor
//! rank, required arguments, field and argument shapes), reporting every problem on the token
//! that caused it. The expansion only generates code from what passed.

use crate::ast::{FieldAst, TensorSlot};
use crate::attr::{Args, Kind, ListKind, MeshAst, PlacementAst, PlacementList, Returns};
use crate::errors::Errors;
use quote::ToTokens;
use syn::{ItemFn, ItemStruct, ReturnType};

/// A placement checked against the mesh and the rank: what the typed marker will be.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Marker {
    Shard(usize),
    Replicate,
    Partial(&'static str),
}

/// Where a placement list is used (changes what is legal and how errors read).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    /// A struct field: a parameter, so never `Partial`.
    Parameter,
    /// A function argument or result.
    Value,
}

/// Resolves `list` for a tensor named `what` of rank `rank` on `mesh`: one marker per mesh dim.
pub(crate) fn resolve(
    list: &PlacementList,
    mesh: &MeshAst,
    rank: usize,
    rank_explicit: bool,
    what: &str,
    usage: Use,
    errs: &mut Errors,
) -> Option<Vec<Marker>> {
    let n = mesh.names.len();
    let by_dim: Vec<Option<&PlacementAst>> = match &list.kind {
        ListKind::Positional(ps) => {
            if ps.len() != n {
                errs.spanned(
                    &list.tokens,
                    format!(
                        "{} placements given for `{what}` but the mesh \"{}\" has {n} dims: give exactly one placement per mesh dim",
                        ps.len(),
                        mesh.lit.value()
                    ),
                );
                return None;
            }
            ps.iter().map(Some).collect()
        }
        ListKind::Keyed(kv) => {
            let mut slots: Vec<Option<&PlacementAst>> = vec![None; n];
            let mut ok = true;
            for (name, tokens, p) in kv {
                match mesh.names.iter().position(|m| m == name) {
                    None => {
                        errs.spanned(
                            tokens,
                            format!(
                                "unknown mesh dim `{name}`: the mesh \"{}\" has {}",
                                mesh.lit.value(),
                                list_names(mesh)
                            ),
                        );
                        ok = false;
                    }
                    Some(i) if slots[i].is_some() => {
                        errs.spanned(tokens, format!("mesh dim `{name}` is given twice"));
                        ok = false;
                    }
                    Some(i) => slots[i] = Some(p),
                }
            }
            if !ok {
                return None;
            }
            slots
        }
    };
    let mut out = Vec::with_capacity(n);
    let mut ok = true;
    for (i, p) in by_dim.into_iter().enumerate() {
        let Some(p) = p else {
            out.push(Marker::Replicate);
            continue;
        };
        let m = match p.kind {
            Kind::Replicate => Marker::Replicate,
            Kind::Partial(op) => {
                if usage == Use::Parameter {
                    errs.spanned(
                        &p.tokens,
                        format!(
                            "`{what}` is a parameter and cannot be `Partial` (mesh dim `{}`): parameters hold real values; use `Replicate` or `Shard(d)`",
                            mesh.names[i]
                        ),
                    );
                    ok = false;
                }
                Marker::Partial(op)
            }
            Kind::Shard(d) => {
                let nd = normalize_dim(d, rank);
                if nd.is_none() {
                    let from = if rank_explicit {
                        format!("rank {rank}")
                    } else {
                        format!("rank {rank} (the default of `DTensor<T>`; write `DTensor<T, RANK>` for another rank)")
                    };
                    errs.spanned(
                        &p.tokens,
                        format!("`Shard({d})` on mesh dim `{}` is out of range for `{what}` of {from}", mesh.names[i]),
                    );
                    ok = false;
                }
                Marker::Shard(nd.unwrap_or(0))
            }
        };
        out.push(m);
    }
    ok.then_some(out)
}

/// A possibly negative dim resolved against `rank` (`-1` is the last), `None` out of range:
/// the runtime's `shape::normalize_dim` rule (a unit test checks they agree).
pub(crate) fn normalize_dim(d: i64, rank: usize) -> Option<usize> {
    let n = i64::try_from(rank).ok()?;
    let nd = if d < 0 { d.checked_add(n)? } else { d };
    (0..n).contains(&nd).then_some(nd as usize)
}

fn list_names(mesh: &MeshAst) -> String {
    let names: Vec<String> = mesh.names.iter().map(|n| format!("`{n}`")).collect();
    names.join(", ")
}

// ------------------------------------------------------------------- item-level checks

/// The mesh from the arguments, or an error when it is missing.
pub(crate) fn require_mesh<'a>(args: &'a Args, item: &impl ToTokens, errs: &mut Errors) -> Option<&'a MeshAst> {
    if args.mesh.is_none() && !args.had_error {
        errs.spanned(item, "missing `mesh`: `#[distribute(mesh = \"dp,tp\")]`");
    }
    args.mesh.as_ref()
}

/// Resolves the placements of every tensor of one slot (its own list, else the default).
pub(crate) fn resolve_slot(
    slot: &TensorSlot,
    args: &Args,
    mesh: &MeshAst,
    usage: Use,
    what_kind: &str,
    errs: &mut Errors,
) -> Option<Vec<Vec<Marker>>> {
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
    let all: Vec<Option<Vec<Marker>>> =
        slot.all.iter().map(|t| resolve(list, mesh, t.rank, t.rank_explicit, &slot.name, usage, errs)).collect();
    all.into_iter().collect()
}

/// The layout a parameter used as `markers` (one per mesh dim, tensor rank `rank`) rests in
/// under FSDP over mesh dim `pos`: `Shard(d)` there, `d` the first tensor dim no other mesh
/// dim shards; as used when every dim is sharded already. The runtime's
/// `dtensor::fsdp::resting_layout` is the same rule (`Fsdp::shards` checks the two agree for
/// every parameter, at run time, naming the parameter if not).
pub(crate) fn resting(markers: &[Marker], rank: usize, pos: usize) -> Vec<Marker> {
    let taken: Vec<usize> = markers
        .iter()
        .filter_map(|m| match m {
            Marker::Shard(d) => Some(*d),
            _ => None,
        })
        .collect();
    let mut out = markers.to_vec();
    if let Some(d) = (0..rank).find(|d| !taken.contains(d)) {
        out[pos] = Marker::Shard(d);
    }
    out
}

/// A struct field as the expansion sees it.
pub(crate) enum FieldPlan {
    /// Holds tensors (directly or in a container), with the markers of each; `true`: they are
    /// buffers (`#[distribute(buffer)]`), not parameters.
    Tensors(Vec<Vec<Marker>>, bool),
    /// `#[distribute(skip)]` or plain data: copied as is.
    Plain,
    /// Anything else: a nested `#[distribute]` struct (or a container of them), checked by the
    /// `Parameters` bound.
    Nested,
}

/// What `#[distribute]` on a struct expands to, once every check passed.
pub(crate) struct StructPlan<'a> {
    pub mesh: &'a MeshAst,
    pub fields: Vec<FieldPlan>,
    /// The element type of `named_parameters`.
    pub elem: syn::Type,
    /// `fsdp = "dim"`: the position of that dim in the mesh, and the name as written.
    pub fsdp: Option<(usize, &'a syn::LitStr)>,
}

/// Every check of a struct (the fields were parsed by [`crate::ast::parse_struct`]).
pub(crate) fn validate_struct<'a>(
    args: &'a Args,
    item: &ItemStruct,
    fields: Vec<FieldAst>,
    errs: &mut Errors,
) -> Option<StructPlan<'a>> {
    if args.returns.is_some() {
        errs.spanned(&item.ident, "`returns` only applies to functions");
    }
    if let Some((_, tokens)) = &args.implicit {
        errs.spanned(tokens, "`implicit` only applies to functions (it governs the ops in a function's body)");
    }
    let mesh = require_mesh(args, &item.ident, errs);
    if !matches!(item.fields, syn::Fields::Named(_)) {
        errs.spanned(&item.fields, "`#[distribute]` needs a struct with named fields");
        return None;
    }
    let mesh = mesh?;
    let fsdp = match &args.fsdp {
        None => None,
        Some(lit) => match mesh.names.iter().position(|n| *n == lit.value()) {
            Some(pos) if item.generics.params.is_empty() => Some((pos, lit)),
            Some(_) => {
                errs.spanned(
                    &item.generics,
                    "`fsdp` needs a struct without generic parameters (its shards struct is generated with concrete types)",
                );
                None
            }
            None => {
                errs.spanned(
                    lit,
                    format!(
                        "`fsdp = \"{}\"` is not a dim of the mesh \"{}\": name the mesh dim the parameters are fully sharded over",
                        lit.value(),
                        mesh.names.join(",")
                    ),
                );
                None
            }
        },
    };
    if !fields.iter().any(|f| matches!(f, FieldAst::Tensors(..) | FieldAst::Other)) {
        errs.spanned(
            &item.ident,
            "`#[distribute]` struct has no parameters: it needs a `DTensor<T>` field or a field holding another `#[distribute]` struct",
        );
    }
    let mut plans = Vec::with_capacity(fields.len());
    let mut first_elem: Option<(String, syn::Type)> = None;
    for f in fields {
        plans.push(match f {
            FieldAst::Tensors(slot, buffer) => {
                let e = slot.ty.elem.to_token_stream().to_string();
                let integer = slot.all.iter().find(|t| crate::ast::is_integer_elem(&t.elem));
                if let Some(t) = integer {
                    errs.spanned(
                        &t.elem,
                        format!(
                            "`{}` is a parameter, and parameters are floating point: write `DTensor<f32>` (or f64, bf16, f16); integer tensors (token ids, targets) are arguments of a `#[distribute]` fn, not fields",
                            slot.name
                        ),
                    );
                }
                match &first_elem {
                    _ if integer.is_some() => {}
                    None => first_elem = Some((e, slot.ty.elem.clone())),
                    Some((e0, _)) if *e0 != e => errs.spanned(
                        &slot.ty.elem,
                        format!("all `DTensor` fields must share one element type (`{e0}`): `named_parameters` lists them together"),
                    ),
                    Some(_) => {}
                }
                for t in &slot.all {
                    if let Some(r) = &t.reference {
                        errs.spanned(r, "a `#[distribute]` struct owns its parameters: use `DTensor<T>`, not a reference");
                    }
                }
                match resolve_slot(&slot, args, mesh, Use::Parameter, "field", errs) {
                    Some(ms) => {
                        if let (Some((pos, lit)), false) = (fsdp, buffer) {
                            if let Some(m) = ms.iter().map(|m| m[pos]).find(|m| *m != Marker::Replicate) {
                                let dim = lit.value();
                                let what = match m {
                                    Marker::Shard(d) => format!("Shard({d})"),
                                    _ => "Partial".to_string(),
                                };
                                errs.spanned(
                                    &slot.span_tokens,
                                    format!(
                                        "`{}` is `{what}` on `{dim}`, the mesh dim `fsdp` shards: declare the layout it is used in, `Replicate` on `{dim}` (FSDP keeps it sharded at rest and gathers it for use)",
                                        slot.name
                                    ),
                                );
                            }
                        }
                        FieldPlan::Tensors(ms, buffer)
                    }
                    None => FieldPlan::Plain,
                }
            }
            FieldAst::Skip | FieldAst::Plain => FieldPlan::Plain,
            FieldAst::Other => FieldPlan::Nested,
        });
    }
    if let Some((_, lit)) = fsdp {
        let has_parameters = plans.iter().any(|p| matches!(p, FieldPlan::Tensors(_, false) | FieldPlan::Nested));
        if !has_parameters {
            errs.spanned(
                lit,
                "`fsdp` on a struct without parameters (its tensors are all buffers): nothing rests sharded",
            );
        }
    }
    if let (Some(e), Some((e0, _))) = (&args.elem, &first_elem) {
        if e.to_token_stream().to_string() != *e0 {
            errs.spanned(e, format!("`elem` differs from the element type of the `DTensor` fields (`{e0}`)"));
        }
    }
    let elem = first_elem.map(|(_, t)| t).or_else(|| args.elem.clone()).unwrap_or_else(|| syn::parse_quote!(f32));
    Some(StructPlan { mesh, fields: plans, elem, fsdp })
}

/// What `#[distribute]` on a function expands to, once every check passed.
pub(crate) struct FnPlan<'a> {
    pub mesh: &'a MeshAst,
    /// Tensor arguments (index into the inputs) and the markers of each of their tensors.
    pub args: Vec<(usize, TensorSlot, Vec<Vec<Marker>>)>,
    /// The markers of every tensor of the result, in order.
    pub ret: Vec<Vec<Marker>>,
    /// `implicit = "allow"`: the body's dynamic ops may redistribute on their own.
    pub allow_implicit: bool,
}

/// Every check of a function (the arguments were parsed by [`crate::ast::parse_fn`]).
pub(crate) fn validate_fn<'a>(
    args: &'a Args,
    item: &ItemFn,
    slots: Vec<(usize, TensorSlot)>,
    errs: &mut Errors,
) -> Option<FnPlan<'a>> {
    if let Some(lit) = &args.fsdp {
        errs.spanned(lit, "`fsdp` only applies to structs (the parameters that rest sharded)");
    }
    let mesh = require_mesh(args, &item.sig.ident, errs)?;
    let mut out = Vec::new();
    for (i, s) in slots {
        if let Some(ms) = resolve_slot(&s, args, mesh, Use::Value, "argument", errs) {
            out.push((i, s, ms));
        }
    }
    let mut ret_tensors = Vec::new();
    if let ReturnType::Type(_, ty) = &item.sig.output {
        errs.ok(crate::ast::find_tensors(ty, &mut ret_tensors));
    }
    let mut ret = Vec::new();
    match &args.returns {
        Some(Returns::PerTensor(lists, tokens)) => {
            if lists.len() != ret_tensors.len() {
                errs.spanned(
                    tokens,
                    format!(
                        "`returns` gives {} placement lists but the result holds {} `DTensor`s: give one list per tensor, in order",
                        lists.len(),
                        ret_tensors.len()
                    ),
                );
            } else {
                for (k, (l, t)) in lists.iter().zip(&ret_tensors).enumerate() {
                    let what = format!("result tensor {k}");
                    if let Some(ms) = resolve(l, mesh, t.rank, t.rank_explicit, &what, Use::Value, errs) {
                        ret.push(ms);
                    }
                }
            }
        }
        returns => {
            let list = match returns {
                Some(Returns::All(l)) => Some(l),
                _ => args.placements.as_ref(),
            };
            for t in &ret_tensors {
                match list {
                    Some(l) => {
                        if let Some(ms) = resolve(l, mesh, t.rank, t.rank_explicit, "the result", Use::Value, errs) {
                            ret.push(ms);
                        }
                    }
                    None if args.had_error => {}
                    None => errs.spanned(
                        &t.tokens,
                        "the result has no placements: add `returns = [..]` or `placements = [..]` to `#[distribute]`",
                    ),
                }
            }
        }
    }
    if out.is_empty() && ret_tensors.is_empty() {
        errs.spanned(
            &item.sig.ident,
            "`#[distribute]` function has no `DTensor<T>` argument or result: nothing in it would be typed",
        );
    }
    let allow_implicit = args.implicit.as_ref().is_some_and(|(a, _)| *a);
    if !allow_implicit {
        check_nothing_deferred(item, errs);
    }
    Some(FnPlan { mesh, args: out, ret, allow_implicit })
}

/// A `#[distribute]` body's promise (no collective it does not show) is kept by a guard that
/// lives while the body runs. A closure, iterator or future in the result would run the body's
/// ops after the guard ended, where a dynamic op could redistribute unseen: refused, with the
/// ways out.
fn check_nothing_deferred(item: &ItemFn, errs: &mut Errors) {
    if let Some(a) = &item.sig.asyncness {
        errs.spanned(
            a,
            "a `#[distribute]` function cannot be `async`: its body would run after the call returned, outside the guard that refuses hidden collectives; make it a plain function (or write `implicit = \"allow\"`)",
        );
    }
    if let ReturnType::Type(_, ty) = &item.sig.output {
        if let Some((t, name)) = crate::ast::deferred_work(ty) {
            let what = match name.as_str() {
                n if n.contains("Fn") => "a closure",
                n if n.contains("Iter") => "an iterator",
                _ => "a future",
            };
            errs.spanned(
                t,
                format!(
                    "a `#[distribute]` function cannot return {what} (`{name}`): its ops would run after the function returned, outside the guard that refuses hidden collectives; return the tensors, or put `#[distribute]` on the function it calls (or write `implicit = \"allow\"`)"
                ),
            );
        }
    }
}

/// The extra checks of a method in a trait impl (expanded by
/// [`crate::expand::expand_trait_fn`]): the trait fixes the signature, so each tensor argument
/// must be one `DTensor` the body can view as typed (`&DTensor<T>` or `DTensor<T>`, bound to a
/// name) and the result must be `Result<DTensor<T>>`.
pub(crate) fn check_trait_fn(item: &ItemFn, plan: &FnPlan<'_>, errs: &mut Errors) {
    for (i, slot, _) in &plan.args {
        let syn::FnArg::Typed(pt) = &item.sig.inputs[*i] else { continue };
        let direct = matches!(crate::ast::tensor_ty(&pt.ty), Ok(Some(_)));
        let mutable = slot.ty.reference.as_ref().is_some_and(|r| r.mutability.is_some());
        if !direct || mutable {
            errs.spanned(
                &pt.ty,
                "in a trait impl, `#[distribute]` checks tensor arguments on entry: write `&DTensor<T>` or `DTensor<T>` (the trait fixes the signature, so containers and `&mut` cannot be typed)",
            );
        } else if !matches!(&*pt.pat, syn::Pat::Ident(_)) {
            errs.spanned(&pt.pat, "in a trait impl, bind a tensor argument to a name (`x: &DTensor<f32>`)");
        }
    }
    let ok = match &item.sig.output {
        ReturnType::Type(_, ty) => result_of_tensor(ty),
        ReturnType::Default => false,
    };
    if !ok {
        let span = match &item.sig.output {
            ReturnType::Type(_, ty) => ty.to_token_stream(),
            ReturnType::Default => item.sig.ident.to_token_stream(),
        };
        errs.spanned(
            span,
            "in a trait impl, `#[distribute]` needs the result `Result<DTensor<T>>`: the body's typed result is handed back as the trait's `DTensor`",
        );
    }
}

/// Is `ty` `Result<DTensor<T>, ..>` (any path ending in `Result`)?
fn result_of_tensor(ty: &syn::Type) -> bool {
    let syn::Type::Path(p) = ty else { return false };
    let Some(last) = p.path.segments.last() else { return false };
    let syn::PathArguments::AngleBracketed(a) = &last.arguments else { return false };
    let first = a.args.first();
    last.ident == "Result"
        && matches!(first, Some(syn::GenericArgument::Type(t))
            if matches!(crate::ast::tensor_ty(t), Ok(Some(tt)) if tt.reference.is_none()))
}
