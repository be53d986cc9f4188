//! The planner: the cheapest sequence of legal single-mesh-dim steps between two placement
//! lists (Dijkstra over placement states), behind a per-thread cache. What a step may do and
//! costs is [`Transition`]'s.

use super::transition::Transition;
use crate::layout::padded_chunk;
use crate::placement::Placement;
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

type PathKey = (Vec<usize>, Vec<usize>, Vec<Placement>, Vec<Placement>);
/// A plan's steps: (mesh dim, target placement, the transition as it runs on that mesh dim).
pub(super) type Path = Vec<(usize, Placement, Transition)>;

thread_local! {
    static PATHS: RefCell<HashMap<PathKey, Path>> = RefCell::new(HashMap::new());
}

/// [`search_path`] behind a per-thread cache (ops cost candidate strategies with plans).
pub(super) fn cached_path(shape: &[usize], mesh: &[usize], from: &[Placement], to: &[Placement]) -> Path {
    let key = (shape.to_vec(), mesh.to_vec(), from.to_vec(), to.to_vec());
    if let Some(p) = PATHS.with(|c| c.borrow().get(&key).cloned()) {
        return p;
    }
    let path = search_path(shape, mesh, from, to);
    PATHS.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() > 4096 {
            c.clear();
        }
        c.insert(key, path.clone());
    });
    path
}

/// Cheapest sequence of legal single-mesh-dim steps from `src` to `dst`, each as (mesh dim,
/// target placement, the transition as it runs on that mesh dim): Dijkstra over placement
/// states; cost = bytes sent, ties broken by fewer collectives, then fewer steps.
///
/// Costs use padded (ceil) chunk sizes, which do not depend on the rank's coordinate: every
/// rank must choose the same plan, or their collectives would not match.
fn search_path(shape: &[usize], mesh: &[usize], src: &[Placement], dst: &[Placement]) -> Path {
    if src == dst {
        return Vec::new();
    }
    let m = mesh.len();
    let mut options: Vec<Vec<Placement>> = Vec::with_capacity(m);
    for i in 0..m {
        let mut o: Vec<Placement> = std::iter::once(Placement::Replicate)
            .chain((0..shape.len()).map(|d| Placement::Shard(d as isize)))
            .collect();
        for p in [src[i], dst[i]] {
            if p.is_partial() && !o.contains(&p) {
                o.push(p);
            }
        }
        options.push(o);
    }
    // Cost: (wire elements, collectives, steps), compared lexicographically.
    type Cost = (usize, usize, usize);
    let mut best: HashMap<Vec<Placement>, Cost> = HashMap::new();
    let mut prev: HashMap<Vec<Placement>, (Vec<Placement>, usize, Placement, Transition)> = HashMap::new();
    let mut heap = BinaryHeap::new();
    best.insert(src.to_vec(), (0, 0, 0));
    heap.push(Reverse(((0usize, 0usize, 0usize), src.to_vec())));
    while let Some(Reverse((cost, x))) = heap.pop() {
        if x == dst {
            break;
        }
        if best.get(&x).is_some_and(|&b| b < cost) {
            continue;
        }
        for i in 0..m {
            for &p in &options[i] {
                if p == x[i] {
                    continue;
                }
                let t = match Transition::of(x[i], p).map(|t| t.on(mesh[i])) {
                    Some(t) if t.legal_in(&x, i, dst) => t,
                    _ => continue,
                };
                // An overflowing cost ranks last (the plan built from the path reports it).
                let wire = t.wire_elems(&padded_level(shape, mesh, &x, i), mesh[i]).unwrap_or(usize::MAX);
                let communicates = t.collective().is_some() as usize;
                let mut y = x.clone();
                y[i] = p;
                let next = (cost.0.saturating_add(wire), cost.1 + communicates, cost.2 + 1);
                if best.get(&y).is_none_or(|&b| next < b) {
                    best.insert(y.clone(), next);
                    prev.insert(y.clone(), (x.clone(), i, p, t));
                    heap.push(Reverse((next, y)));
                }
            }
        }
    }
    let mut path = Vec::new();
    let mut x = dst.to_vec();
    while let Some((p, i, to, t)) = prev.get(&x) {
        path.push((*i, *to, *t));
        x = p.clone();
        if x == src {
            break;
        }
    }
    path.reverse();
    path
}

/// [`level_shape`](crate::layout::level_shape) with padded (ceil) chunks: the same on every
/// rank.
pub(super) fn padded_level(shape: &[usize], mesh: &[usize], x: &[Placement], i: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    for (j, p) in x.iter().enumerate().filter(|&(j, _)| j != i) {
        if let Some(d) = p.shard_dim() {
            s[d] = padded_chunk(s[d], mesh[j]);
        }
    }
    s
}
