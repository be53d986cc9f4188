//! Scopes in which an op may not redistribute its inputs on its own: the body of a
//! `#[distribute]` function promises that no collective runs that its code does not show.
//!
//! [`forbid_implicit`] pushes such a scope on this thread (one rank of the thread backend, or
//! the process of one MPI rank) and [`allow_implicit`] an opted-out one inside it; the
//! innermost scope decides. Every place where an op would redistribute an input that it was
//! not asked to (the strategy search, and the ops that reduce a `Partial` or unshard a dim
//! before their kernel) calls `check` first with the move's plan, which then returns
//! [`Error::ImplicitCollective`] instead of communicating. A move whose plan runs no collective
//! (`Replicate` → `Partial` is a local partition, any step on a mesh dim of one rank is local)
//! is no collective and passes: the typed rules, which type `Partial<Sum> + Replicate` as
//! legal without communication, and this guard read the same plan. An explicit
//! `.redistribute()` never passes through here. Every rank takes the same decision (the strategy search is
//! rank-independent), so no rank is left waiting in a collective.

use crate::error::{Error, Result};
use crate::mesh::current::with_current_mesh;
use crate::mesh::DeviceMesh;
use crate::placement::{fmt_placements, Placement};
use crate::redistribute::RedistributePlan;
use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

/// Where a scope was opened: the `#[distribute]` function and its source location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopeSite {
    /// The function's name.
    pub function: &'static str,
    /// Its source file.
    pub file: &'static str,
    /// Its line.
    pub line: u32,
}

/// One entry of the scope stack.
#[derive(Debug, Clone, Copy)]
enum Scope {
    /// `implicit = "allow"`: ops may redistribute their inputs.
    Allow,
    /// A `#[distribute]` body: they may not.
    Forbid(ScopeSite),
    /// A typed op (`Dt`'s methods) running its dynamic op: its rule promised the output
    /// layout without any collective, so a communicating redistribution here means the
    /// tensor's layout is not its type's, or the rule and the runtime disagree. Refused before
    /// anything is sent, whatever the enclosing scopes say.
    TypedOp { op: &'static str, at: &'static std::panic::Location<'static> },
}

thread_local! {
    /// Innermost last.
    static SCOPES: RefCell<Vec<Scope>> = const { RefCell::new(Vec::new()) };
}

/// The `#[distribute]` scopes open on every thread, by rank: what a thread that opened none
/// of its own (a helper thread spawned inside a `#[distribute]` body) answers to. A rank is
/// known by its communicator (the current mesh's, [`rank_key`]); entries of one thread are
/// in opening order.
static OPEN: Mutex<Vec<Open>> = Mutex::new(Vec::new());

struct Open {
    rank: usize,
    thread: ThreadId,
    /// `None`: an `implicit = "allow"` scope.
    forbid: Option<ScopeSite>,
}

fn open_scopes() -> MutexGuard<'static, Vec<Open>> {
    // Entries are pushed and removed whole: a poisoned lock holds consistent data.
    OPEN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which rank `mesh` belongs to, as the registry of open scopes knows it: the address of its
/// communicator (every mesh of a rank shares it; two ranks never do).
fn rank_key(mesh: &DeviceMesh) -> usize {
    Arc::as_ptr(mesh.comm()) as *const () as usize
}

/// Closes its scope when dropped (also on an early return or `?`).
#[must_use = "the scope ends when this guard is dropped"]
#[derive(Debug)]
pub struct ImplicitScope {
    /// Registered for this thread's rank (a `#[distribute]` scope opened on a rank thread).
    registered: bool,
    // Not `Send`: the scope belongs to the thread that opened it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ImplicitScope {
    fn drop(&mut self) {
        SCOPES.with(|s| s.borrow_mut().pop());
        if self.registered {
            let me = std::thread::current().id();
            let mut open = open_scopes();
            if let Some(i) = open.iter().rposition(|o| o.thread == me) {
                open.remove(i);
            }
        }
    }
}

fn push(scope: Scope) -> ImplicitScope {
    SCOPES.with(|s| s.borrow_mut().push(scope));
    ImplicitScope { registered: false, _not_send: std::marker::PhantomData }
}

/// [`push`] for a `#[distribute]` scope, also registered under this thread's rank (when it
/// has a current mesh) for the helper threads it may spawn.
fn push_registered(scope: Scope, forbid: Option<ScopeSite>) -> ImplicitScope {
    let mut guard = push(scope);
    if let Some(rank) = with_current_mesh(|m| m.map(rank_key)) {
        open_scopes().push(Open { rank, thread: std::thread::current().id(), forbid });
        guard.registered = true;
    }
    guard
}

/// The `#[distribute]` scope that forbids implicit redistributions on `mesh`'s rank for a
/// thread that opened no scope of its own: the innermost scope of another thread of that
/// rank (the thread that spawned this one, inside a `#[distribute]` body).
fn forbidding_on_rank(mesh: &DeviceMesh) -> Option<ScopeSite> {
    let rank = rank_key(mesh);
    let me = std::thread::current().id();
    let open = open_scopes();
    open.iter().rev().find(|o| o.rank == rank && o.thread != me).and_then(|o| o.forbid)
}

/// Until the guard drops, the dynamic op that the typed op `op` (called at `at`) runs may not
/// redistribute its inputs in a way that communicates.
pub(crate) fn typed_op(op: &'static str, at: &'static std::panic::Location<'static>) -> ImplicitScope {
    push(Scope::TypedOp { op, at })
}

/// Until the guard drops, an op on this thread that would redistribute an input on its own
/// returns [`Error::ImplicitCollective`] naming `site` (what `#[distribute]` puts around a
/// function body unless it says `implicit = "allow"`).
///
/// ```
/// use dtensor_runtime::ops::implicit::{forbid_implicit, ScopeSite};
/// let site = ScopeSite { function: "block_forward", file: file!(), line: line!() };
/// let _scope = forbid_implicit(site);
/// assert_eq!(dtensor_runtime::ops::implicit::forbidding(), Some(site));
/// ```
pub fn forbid_implicit(site: ScopeSite) -> ImplicitScope {
    push_registered(Scope::Forbid(site), Some(site))
}

/// Until the guard drops, ops may redistribute their inputs again (`implicit = "allow"`
/// inside a forbidding scope).
pub fn allow_implicit() -> ImplicitScope {
    push_registered(Scope::Allow, None)
}

/// The `#[distribute]` scope that currently forbids implicit redistributions on this thread,
/// if any (the innermost of [`forbid_implicit`] and [`allow_implicit`] decides; typed ops'
/// own scopes are not counted).
pub fn forbidding() -> Option<ScopeSite> {
    SCOPES
        .with(|s| {
            s.borrow().iter().rev().find_map(|x| match x {
                Scope::Allow => Some(None),
                Scope::Forbid(site) => Some(Some(*site)),
                Scope::TypedOp { .. } => None,
            })
        })
        .flatten()
}

/// Called where `op` is about to redistribute its input `input` from `from` to `to` by `plan`
/// without being asked: an error inside a forbidding scope when the plan communicates.
pub(crate) fn check(
    op: &str,
    input: usize,
    mesh: &DeviceMesh,
    from: &[Placement],
    to: &[Placement],
    plan: &RedistributePlan,
) -> Result<()> {
    if plan.num_collectives() == 0 {
        return Ok(());
    }
    let redistribution = || format!("input {input} from {} to {}", fmt_placements(from), fmt_placements(to));
    let (innermost, own) = SCOPES.with(|s| (s.borrow().last().copied(), !s.borrow().is_empty()));
    if let Some(Scope::TypedOp { op: typed, at }) = innermost {
        return Err(Error::TypedOpCollective {
            op: typed.to_string(),
            redistribution: format!("{} (in `{op}`)", redistribution()),
            at: at.to_string(),
        });
    }
    let (site, helper) = match own {
        true => (forbidding(), false),
        // A thread without scopes of its own answers to its rank's (a helper thread spawned
        // inside a `#[distribute]` body cannot run the collective the body may not).
        false => (forbidding_on_rank(mesh), true),
    };
    match site {
        None => Ok(()),
        Some(site) => Err(Error::ImplicitCollective {
            op: op.to_string(),
            redistribution: redistribution(),
            function: format!(
                "`{}` ({}:{}){}",
                site.function,
                site.file,
                site.line,
                if helper { ", from a thread running while it does" } else { "" }
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::ReduceOp;

    #[test]
    fn innermost_scope_decides_and_guards_pop() {
        let site = ScopeSite { function: "f", file: "x.rs", line: 3 };
        let p = [Placement::Partial(ReduceOp::Sum)];
        let r = [Placement::Replicate];
        let all_reduce = RedistributePlan {
            steps: vec![crate::redistribute::RedistributeStep {
                mesh_dim: 0,
                from: p[0],
                to: r[0],
                logical_shape: vec![2],
                collective: Some(crate::comm::debug::CollectiveKind::AllReduce),
                bytes: 8,
                wire_bytes: 8,
            }],
        };
        let mesh = crate::autograd::local_mesh();
        let check =
            |op: &str, i: usize, from: &[Placement], to: &[Placement]| check(op, i, &mesh, from, to, &all_reduce);
        assert!(check("exp", 0, &p, &r).is_ok());
        {
            let _deny = forbid_implicit(site);
            let e = check("exp", 0, &p, &r).unwrap_err().to_string();
            assert!(e.contains("`exp`") && e.contains("`f`") && e.contains("x.rs:3"), "{e}");
            {
                let _allow = allow_implicit();
                assert!(check("exp", 0, &p, &r).is_ok());
            }
            assert!(check("exp", 0, &p, &r).is_err());
        }
        assert!(check("exp", 0, &p, &r).is_ok());
    }
}
