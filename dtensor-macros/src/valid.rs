//! Validation: resolves a placement list against the mesh and the tensor rank, reporting every
//! problem on the token that caused it.

use crate::attr::{Kind, ListKind, MeshAst, PlacementAst, PlacementList};
use crate::errors::Errors;

/// A placement checked against the mesh and the rank: what the typed marker will be.
#[derive(Clone, Copy, PartialEq, Eq)]
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
                let nd = if d < 0 { d + rank as i64 } else { d };
                if nd < 0 || nd >= rank as i64 {
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
                Marker::Shard(nd.max(0) as usize)
            }
        };
        out.push(m);
    }
    ok.then_some(out)
}

fn list_names(mesh: &MeshAst) -> String {
    let names: Vec<String> = mesh.names.iter().map(|n| format!("`{n}`")).collect();
    names.join(", ")
}
