//! Parsing of the macro's own syntax: `#[distribute(mesh = "..", placements = [..], returns = [..])]`
//! and `#[placements = [..]]` / `#[placements(..)]` on fields and arguments.

use crate::errors::Errors;
use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::punctuated::Punctuated;
use syn::{Attribute, Expr, ExprLit, Lit, LitStr, Meta, Token, UnOp};

/// Reduce ops of `Partial(op)`, as `(accepted spelling, marker type name)`: the spellings
/// `dtensor_runtime::ReduceOp::parse` accepts (a unit test checks they agree).
pub(crate) const REDUCE_OPS: &[(&str, &str)] = &[
    ("sum", "Sum"),
    ("avg", "Avg"),
    ("mean", "Avg"),
    ("min", "Min"),
    ("max", "Max"),
    ("product", "Product"),
    ("prod", "Product"),
];

/// One placement as written.
#[derive(Clone)]
pub(crate) enum Kind {
    /// `Shard(d)`, possibly negative (counts from the end).
    Shard(i64),
    Replicate,
    /// `Partial(op)` with the marker type name of `op` (`Sum`, `Avg`, ...).
    Partial(&'static str),
}

/// A placement and the tokens it was written as (for spans).
#[derive(Clone)]
pub(crate) struct PlacementAst {
    pub kind: Kind,
    pub tokens: TokenStream,
}

/// A placement list: positional (`[Shard(0), Replicate]`, one per mesh dim) or keyed by mesh
/// dim name (`[tp = Shard(1)]`, unnamed dims are `Replicate`).
#[derive(Clone)]
pub(crate) enum ListKind {
    Positional(Vec<PlacementAst>),
    Keyed(Vec<(String, TokenStream, PlacementAst)>),
}

/// A placement list and its tokens.
#[derive(Clone)]
pub(crate) struct PlacementList {
    pub kind: ListKind,
    pub tokens: TokenStream,
}

/// The mesh string: names of the mesh dims.
pub(crate) struct MeshAst {
    pub names: Vec<String>,
    pub lit: LitStr,
}

/// `returns = [..]`: one list for every tensor of the result, or (`returns = [[..], [..]]`)
/// one list per tensor of a tuple result, in order.
pub(crate) enum Returns {
    All(PlacementList),
    PerTensor(Vec<PlacementList>, TokenStream),
}

/// Arguments of `#[distribute(..)]`.
#[derive(Default)]
pub(crate) struct Args {
    pub mesh: Option<MeshAst>,
    pub placements: Option<PlacementList>,
    pub returns: Option<Returns>,
    /// `crate = "path"`: where the facade crate is (default `::dtensor`).
    pub krate: Option<syn::Path>,
    /// `elem = T`: the element type of a struct whose parameters all live in nested fields.
    pub elem: Option<syn::Type>,
    /// `implicit = "allow"` (true) or `"deny"` (false, the default): may dynamic ops in a
    /// function's body redistribute their inputs on their own? With the tokens, for spans.
    pub implicit: Option<(bool, TokenStream)>,
    /// `fsdp = "dp"`: the struct's parameters rest fully sharded over this mesh dim; generates
    /// `{Name}Shards` with their resting layouts as types.
    pub fsdp: Option<LitStr>,
    /// Some argument was given but was invalid or unknown (already reported): follow-up
    /// "missing" errors would only repeat it.
    pub had_error: bool,
}

impl Args {
    /// These arguments, each missing one taken from `defaults` (a method's own
    /// `#[distribute(..)]` over its impl block's).
    pub(crate) fn or(self, defaults: Args) -> Args {
        Args {
            mesh: self.mesh.or(defaults.mesh),
            placements: self.placements.or(defaults.placements),
            returns: self.returns.or(defaults.returns),
            krate: self.krate.or(defaults.krate),
            elem: self.elem.or(defaults.elem),
            implicit: self.implicit.or(defaults.implicit),
            fsdp: self.fsdp.or(defaults.fsdp),
            had_error: self.had_error || defaults.had_error,
        }
    }
}

/// Parses the arguments of `#[distribute(..)]`.
pub(crate) fn parse_args(tokens: TokenStream, errs: &mut Errors) -> Args {
    let mut args = Args::default();
    let metas = match syn::parse::Parser::parse2(Punctuated::<Meta, Token![,]>::parse_terminated, tokens) {
        Ok(m) => m,
        Err(e) => {
            errs.push(e);
            args.had_error = true;
            return args;
        }
    };
    for meta in metas {
        let Meta::NameValue(nv) = &meta else {
            errs.spanned(
                &meta,
                "expected `key = value`: `#[distribute(mesh = \"dp,tp\", placements = [Shard(0), Replicate])]`",
            );
            args.had_error = true;
            continue;
        };
        let key = if nv.path.is_ident("crate") || nv.path.segments.first().is_some_and(|s| s.ident == "crate") {
            "crate".to_string()
        } else {
            nv.path.get_ident().map(|i| i.to_string()).unwrap_or_default()
        };
        let ok = match key.as_str() {
            "crate" if args.krate.is_some() => {
                errs.spanned(&nv.path, "duplicate `crate` argument");
                true
            }
            "crate" => {
                args.krate = parse_crate(&nv.value, errs);
                args.krate.is_some()
            }
            "elem" if args.elem.is_some() => {
                errs.spanned(&nv.path, "duplicate `elem` argument");
                true
            }
            "elem" => {
                args.elem = errs.ok(syn::parse2::<syn::Type>(nv.value.to_token_stream()));
                args.elem.is_some()
            }
            "implicit" if args.implicit.is_some() => {
                errs.spanned(&nv.path, "duplicate `implicit` argument");
                true
            }
            "implicit" => {
                args.implicit = parse_implicit(&nv.value, errs);
                args.implicit.is_some()
            }
            "fsdp" if args.fsdp.is_some() => {
                errs.spanned(&nv.path, "duplicate `fsdp` argument");
                true
            }
            "fsdp" => match &nv.value {
                Expr::Lit(ExprLit { lit: Lit::Str(lit), .. }) => {
                    args.fsdp = Some(lit.clone());
                    true
                }
                other => {
                    errs.spanned(other, "`fsdp` must be the name of a mesh dim, e.g. `fsdp = \"dp\"`");
                    false
                }
            },
            "mesh" if args.mesh.is_some() => {
                errs.spanned(&nv.path, "duplicate `mesh` argument");
                true
            }
            "mesh" => {
                args.mesh = parse_mesh(&nv.value, errs);
                args.mesh.is_some()
            }
            "placements" | "returns"
                if key == "placements" && args.placements.is_some() || key == "returns" && args.returns.is_some() =>
            {
                errs.spanned(&nv.path, format!("duplicate `{key}` argument"));
                true
            }
            "placements" => {
                args.placements = parse_list_expr(&nv.value, errs);
                args.placements.is_some()
            }
            "returns" => {
                args.returns = parse_returns(&nv.value, errs);
                args.returns.is_some()
            }
            _ => {
                errs.spanned(
                    &nv.path,
                    format!(
                        "unknown `#[distribute]` argument `{}`: expected `mesh`, `placements`, `returns`, `implicit`, `elem`, `fsdp` or `crate`",
                        nv.path.to_token_stream()
                    ),
                );
                false
            }
        };
        args.had_error |= !ok;
    }
    args
}

/// `implicit = "allow"` / `"deny"`.
fn parse_implicit(value: &Expr, errs: &mut Errors) -> Option<(bool, TokenStream)> {
    let allow = match value {
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) if s.value() == "allow" => Some(true),
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) if s.value() == "deny" => Some(false),
        _ => None,
    };
    if allow.is_none() {
        errs.spanned(
            value,
            "`implicit` is `\"deny\"` (the default: a dynamic op that would redistribute its inputs on its own is an error) or `\"allow\"`",
        );
    }
    allow.map(|a| (a, value.to_token_stream()))
}

/// `crate = "::my_dtensor"` (a string, as serde's `crate = ".."`).
fn parse_crate(value: &Expr, errs: &mut Errors) -> Option<syn::Path> {
    let Expr::Lit(ExprLit { lit: Lit::Str(lit), .. }) = value else {
        errs.spanned(value, "`crate` must be a string path, e.g. `crate = \"::dtensor\"`");
        return None;
    };
    match lit.parse::<syn::Path>() {
        Ok(p) => Some(p),
        Err(_) => {
            errs.spanned(lit, format!("`crate = \"{}\"` is not a path, e.g. `crate = \"::dtensor\"`", lit.value()));
            None
        }
    }
}

fn parse_mesh(value: &Expr, errs: &mut Errors) -> Option<MeshAst> {
    let Expr::Lit(ExprLit { lit: Lit::Str(lit), .. }) = value else {
        errs.spanned(value, "`mesh` must be a string of mesh dim names, e.g. `mesh = \"dp,tp\"`");
        return None;
    };
    let text = lit.value();
    if text.trim().is_empty() {
        errs.spanned(lit, "empty mesh: `mesh` must name at least one mesh dim, e.g. `mesh = \"dp,tp\"`");
        return None;
    }
    let mut names: Vec<String> = Vec::new();
    let mut ok = true;
    for raw in text.split(',') {
        let name = raw.trim();
        if name.is_empty() {
            errs.spanned(lit, format!("empty mesh dim name in `{text}`: names are separated by single commas"));
            ok = false;
        } else if let Some(bare) = name.strip_prefix("r#") {
            // A raw identifier would name a type `r#..` that the runtime spells without `r#`.
            errs.spanned(
                lit,
                format!(
                    "mesh dim name `{name}` is a raw identifier: write `{bare}` (a mesh dim name cannot be a keyword)"
                ),
            );
            ok = false;
        } else if syn::parse_str::<syn::Ident>(name).is_err() {
            errs.spanned(lit, format!("mesh dim name `{name}` is not a Rust identifier"));
            ok = false;
        } else if names.iter().any(|n| n == name) {
            errs.spanned(lit, format!("duplicate mesh dim name `{name}` in `{text}`"));
            ok = false;
        } else {
            names.push(name.to_string());
        }
    }
    ok.then(|| MeshAst { names, lit: lit.clone() })
}

/// Parses `[a, b]` or `[[a, b], [c, d]]` (the value of `returns = ..`).
fn parse_returns(value: &Expr, errs: &mut Errors) -> Option<Returns> {
    match value {
        Expr::Array(arr) if !arr.elems.is_empty() && arr.elems.iter().all(|e| matches!(e, Expr::Array(_))) => {
            let lists: Vec<Option<PlacementList>> = arr.elems.iter().map(|e| parse_list_expr(e, errs)).collect();
            lists.into_iter().collect::<Option<Vec<_>>>().map(|l| Returns::PerTensor(l, value.to_token_stream()))
        }
        _ => parse_list_expr(value, errs).map(Returns::All),
    }
}

/// Parses `[a, b]` (the value of `placements = ..`).
fn parse_list_expr(value: &Expr, errs: &mut Errors) -> Option<PlacementList> {
    let Expr::Array(arr) = value else {
        errs.spanned(value, "expected a placement list in brackets, e.g. `[Shard(0), Replicate]`");
        return None;
    };
    parse_list(arr.elems.iter(), value.to_token_stream(), errs)
}

fn parse_list<'a>(
    elems: impl Iterator<Item = &'a Expr>,
    tokens: TokenStream,
    errs: &mut Errors,
) -> Option<PlacementList> {
    let mut positional = Vec::new();
    let mut keyed = Vec::new();
    let mut ok = true;
    for e in elems {
        match e {
            Expr::Assign(a) => {
                let name = match &*a.left {
                    Expr::Path(p) if p.path.get_ident().is_some() => p.path.get_ident().map(|i| i.to_string()),
                    _ => None,
                };
                match (name, parse_placement(&a.right, errs)) {
                    (Some(n), Some(p)) => keyed.push((n, a.left.to_token_stream(), p)),
                    (None, _) => {
                        errs.spanned(&a.left, "expected a mesh dim name before `=`, e.g. `tp = Shard(1)`");
                        ok = false;
                    }
                    _ => ok = false,
                }
            }
            _ => match parse_placement(e, errs) {
                Some(p) => positional.push(p),
                None => ok = false,
            },
        }
    }
    if !positional.is_empty() && !keyed.is_empty() {
        errs.spanned(
            &tokens,
            "mixed placement list: give either one placement per mesh dim (`[Shard(0), Replicate]`) or name the mesh dims (`[tp = Shard(1)]`)",
        );
        return None;
    }
    let kind = if keyed.is_empty() { ListKind::Positional(positional) } else { ListKind::Keyed(keyed) };
    ok.then_some(PlacementList { kind, tokens })
}

fn last_ident(e: &Expr) -> Option<String> {
    match e {
        Expr::Path(p) if p.qself.is_none() => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

fn int_lit(e: &Expr) -> Option<i64> {
    match e {
        Expr::Lit(ExprLit { lit: Lit::Int(i), .. }) => i.base10_parse::<i64>().ok(),
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => int_lit(&u.expr).map(|v| -v),
        Expr::Paren(p) => int_lit(&p.expr),
        _ => None,
    }
}

const EXPECTED: &str = "expected `Shard(d)`, `Replicate` or `Partial(op)`";

/// Parses one placement expression.
fn parse_placement(e: &Expr, errs: &mut Errors) -> Option<PlacementAst> {
    let tokens = e.to_token_stream();
    let kind = match e {
        Expr::Path(_) => match last_ident(e).as_deref() {
            Some("Replicate") => Kind::Replicate,
            Some("Partial") => Kind::Partial("Sum"),
            Some("Shard") => {
                errs.spanned(e, "`Shard` needs the tensor dim it splits, e.g. `Shard(0)`");
                return None;
            }
            _ => {
                errs.spanned(e, format!("unknown placement `{tokens}`: {EXPECTED}"));
                return None;
            }
        },
        Expr::Call(call) => {
            let args: Vec<&Expr> = call.args.iter().collect();
            match last_ident(&call.func).as_deref() {
                Some("Shard") => match (args.as_slice(), args.first().and_then(|a| int_lit(a))) {
                    ([_], Some(d)) => Kind::Shard(d),
                    _ => {
                        errs.spanned(e, "`Shard` takes one integer tensor dim, e.g. `Shard(0)` or `Shard(-1)`");
                        return None;
                    }
                },
                Some("Partial") => match args.as_slice() {
                    [op] => Kind::Partial(parse_reduce_op(op, errs)?),
                    _ => {
                        errs.spanned(e, "`Partial` takes one reduce op, e.g. `Partial(Sum)`");
                        return None;
                    }
                },
                Some("Replicate") => {
                    errs.spanned(e, "`Replicate` takes no arguments");
                    return None;
                }
                _ => {
                    errs.spanned(e, format!("unknown placement `{tokens}`: {EXPECTED}"));
                    return None;
                }
            }
        }
        _ => {
            errs.spanned(e, format!("malformed placement `{tokens}`: {EXPECTED}"));
            return None;
        }
    };
    Some(PlacementAst { kind, tokens })
}

fn parse_reduce_op(op: &Expr, errs: &mut Errors) -> Option<&'static str> {
    let name = match op {
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Some(s.value()),
        _ => last_ident(op),
    };
    let found = name.as_deref().and_then(|n| {
        let n = n.to_ascii_lowercase();
        REDUCE_OPS.iter().find(|(k, _)| *k == n).map(|(_, v)| *v)
    });
    if found.is_none() {
        errs.spanned(
            op,
            format!(
                "unknown reduce op `{}`: expected one of `Sum`, `Avg`, `Min`, `Max`, `Product`",
                op.to_token_stream()
            ),
        );
    }
    found
}

/// Is this a `#[distribute(..)]` attribute on a field or argument?
pub(crate) fn is_field_distribute_attr(a: &Attribute) -> bool {
    a.path().is_ident("distribute")
}

/// Takes `#[distribute(skip)]` / `#[distribute(buffer)]` out of a field's attributes; anything
/// else in it is an error.
pub(crate) fn take_field_flag(attrs: &mut Vec<Attribute>, errs: &mut Errors) -> FieldFlag {
    let mut flag = FieldFlag::None;
    for a in attrs.iter().filter(|a| is_field_distribute_attr(a)) {
        let word = match &a.meta {
            Meta::List(list) => list.parse_args::<syn::Ident>().ok().map(|i| i.to_string()),
            _ => None,
        };
        match word.as_deref() {
            Some("skip") => flag = FieldFlag::Skip,
            Some("buffer") => flag = FieldFlag::Buffer,
            _ => errs.spanned(
                a,
                "on a field, `#[distribute]` takes `skip` (a field without parameters) or `buffer` (tensors that are state, not parameters): `#[distribute(skip)]`, `#[distribute(buffer)]`",
            ),
        }
    }
    attrs.retain(|a| !is_field_distribute_attr(a));
    flag
}

/// What a field's own `#[distribute(..)]` says.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldFlag {
    /// Nothing: tensors are parameters.
    None,
    /// `skip`: no parameters.
    Skip,
    /// `buffer`: tensors that are not trained (no gradient, not given to optimizers), placed,
    /// loaded and saved like parameters.
    Buffer,
}

/// Is this our `placements` helper attribute?
pub(crate) fn is_placements_attr(a: &Attribute) -> bool {
    a.path().is_ident("placements")
}

/// Parses a `#[placements = [..]]`, `#[placements(..)]` or `#[placements[..]]` attribute.
pub(crate) fn parse_placements_attr(a: &Attribute, errs: &mut Errors) -> Option<PlacementList> {
    match &a.meta {
        Meta::NameValue(nv) => parse_list_expr(&nv.value, errs),
        Meta::List(list) => {
            let elems = errs.ok(list.parse_args_with(Punctuated::<Expr, Token![,]>::parse_terminated))?;
            parse_list(elems.iter(), list.tokens.clone(), errs)
        }
        Meta::Path(p) => {
            errs.spanned(p, "`#[placements]` needs a list, e.g. `#[placements = [Replicate, Shard(1)]]`");
            None
        }
    }
}

/// Takes our helper attributes out of `attrs`, parsing the first one (a second one is an error).
pub(crate) fn take_placements_attr(attrs: &mut Vec<Attribute>, errs: &mut Errors) -> Option<PlacementList> {
    let mut found: Option<PlacementList> = None;
    let mut seen = false;
    for a in attrs.iter().filter(|a| is_placements_attr(a)) {
        if seen {
            errs.spanned(a, "duplicate `#[placements]` attribute");
            continue;
        }
        seen = true;
        found = parse_placements_attr(a, errs);
    }
    attrs.retain(|a| !is_placements_attr(a));
    found
}
