//! The backward pass: reverse topological walk over the graph of [`Node`]s.

use super::grad_reducer::GradReducer;
use super::{no_grad_guard, redistribute_grad, BackwardOptions, Node, NodeKind};
use crate::comm::debug::op_scope;
use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::placement::without_partials;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

thread_local! {
    /// Which inputs of the node whose backward is running need a gradient.
    static NEEDS: RefCell<Vec<bool>> = const { RefCell::new(Vec::new()) };
}

/// Inside a backward function: does input `i` need a gradient? (Lets a backward skip work,
/// and the collectives that work would need, for inputs without `requires_grad`.)
pub(crate) fn input_needs_grad(i: usize) -> bool {
    NEEDS.with(|n| n.borrow().get(i).copied().unwrap_or(true))
}

fn key<T: Element>(n: &Arc<Node<T>>) -> usize {
    Arc::as_ptr(n) as usize
}

/// Nodes reachable from `root`, each after every node that consumes it.
fn topo_order<T: Element>(root: &Arc<Node<T>>) -> Vec<Arc<Node<T>>> {
    // Iterative post-order DFS (graphs of long training loops are deep).
    let mut post = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut stack: Vec<(Arc<Node<T>>, usize)> = vec![(Arc::clone(root), 0)];
    seen.insert(key(root));
    while let Some((node, next)) = stack.pop() {
        let inputs = match &node.kind {
            NodeKind::Op { inputs, .. } => inputs.as_slice(),
            NodeKind::Leaf { .. } => &[],
        };
        let child = inputs[next.min(inputs.len())..]
            .iter()
            .enumerate()
            .find_map(|(j, c)| c.as_ref().filter(|c| !seen.contains(&key(c))).map(|c| (next + j, Arc::clone(c))));
        match child {
            Some((j, c)) => {
                seen.insert(key(&c));
                stack.push((node, j + 1));
                stack.push((c, 0));
            }
            None => post.push(node),
        }
    }
    post.reverse();
    post
}

pub(super) fn run_backward<T: Element>(root: &DTensor<T>, grad: DTensor<T>, opts: &BackwardOptions) -> Result<()> {
    let BackwardOptions { retain_graph, reduce_dtype: leaf_dtype, overlap } = *opts;
    let Some(root_node) = root.autograd.node.clone() else {
        return Err(Error::Autograd(
            "backward on a tensor that does not require grad (no input had requires_grad, or it was computed under no_grad)"
                .into(),
        ));
    };
    let _ng = no_grad_guard();
    let mut reducer = overlap.map(GradReducer::new);
    let mut grads: HashMap<usize, DTensor<T>> = HashMap::new();
    grads.insert(key(&root_node), grad);
    for node in topo_order(&root_node) {
        let Some(g) = grads.remove(&key(&node)) else { continue };
        match &node.kind {
            NodeKind::Leaf { grad, placements, shape } => {
                if &g.shape != shape {
                    return Err(Error::Autograd(format!(
                        "gradient of shape {:?} reached a leaf of shape {shape:?}",
                        g.shape
                    )));
                }
                let target = without_partials(placements);
                match &mut reducer {
                    Some(r) => r.push(&node, g, &target, leaf_dtype)?,
                    None => accumulate(grad, redistribute_grad(&g, &target, leaf_dtype, "grad_accumulate")?)?,
                }
            }
            NodeKind::Op { inputs, backward } => {
                NEEDS.with(|n| *n.borrow_mut() = inputs.iter().map(|i| i.is_some()).collect());
                let mut slot = backward.lock().unwrap_or_else(|e| e.into_inner());
                let Some(f) = slot.as_ref() else {
                    NEEDS.with(|n| n.borrow_mut().clear());
                    return Err(Error::Autograd(format!(
                        "backward through {} a second time: the first backward freed its saved tensors \
                         (use backward_retaining_graph for the first pass, or run the forward again)",
                        node.name
                    )));
                };
                let input_grads = op_scope(node.name, || f(&g));
                if !retain_graph {
                    *slot = None;
                }
                drop(slot);
                NEEDS.with(|n| n.borrow_mut().clear());
                let input_grads = input_grads?;
                if input_grads.len() != inputs.len() {
                    return Err(Error::Autograd(format!(
                        "{} returned {} gradients for {} inputs",
                        node.name,
                        input_grads.len(),
                        inputs.len()
                    )));
                }
                for (input, gi) in inputs.iter().zip(input_grads) {
                    let (Some(input), Some(gi)) = (input, gi) else { continue };
                    let k = key(input);
                    let acc = match grads.remove(&k) {
                        None => gi,
                        Some(prev) => prev.add(&gi)?,
                    };
                    grads.insert(k, acc);
                }
            }
        }
    }
    if let Some(r) = reducer {
        for (node, g) in r.finish()? {
            if let NodeKind::Leaf { grad, .. } = &node.kind {
                accumulate(grad, g)?;
            }
        }
    }
    Ok(())
}

/// Adds `g` to a leaf's gradient cell.
fn accumulate<T: Element>(cell: &Mutex<Option<DTensor<T>>>, g: DTensor<T>) -> Result<()> {
    let mut cell = cell.lock().unwrap_or_else(|e| e.into_inner());
    *cell = Some(match cell.take() {
        None => g,
        Some(prev) => prev.add(&g)?.detach(),
    });
    Ok(())
}
