//! The load plan: which placements each tensor of a checkpoint gets, by name pattern, as
//! PyTorch's `parallelize_module(model, mesh, {"layers.*.mlp.up_proj": ColwiseParallel()})`.

use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::module::{LayerKind, ParallelStyle};
use crate::placement::Placement;

/// What a plan entry gives the tensors it matches.
enum Rule {
    /// These placements, one per mesh dim.
    Placements(Vec<Placement>),
    /// The style's placement of a layer of this kind on its tensor-parallel mesh dim,
    /// `Replicate` on the others.
    Style(LayerKind, Box<dyn ParallelStyle + Send + Sync>),
}

struct Entry {
    pattern: String,
    rule: Rule,
}

/// Placements for the tensors of a checkpoint, by name pattern.
///
/// A pattern is a dotted path whose components may hold `*` (any run of characters within one
/// component) and `?` (one character), as PyTorch matches plan keys. It matches a tensor when
/// it matches the tensor's full name or a leading part of it (a module path: the plan entry
/// then covers every tensor under that module). Patterns are anchored at the start of the
/// name: `model.layers.*.mlp.up_proj` matches `model.layers.0.mlp.up_proj.weight`, and
/// `layers.*.mlp.up_proj` does not.
///
/// Tensors no entry matches are replicated. A tensor matched by two entries, an entry that
/// matches no tensor, and a style that does not apply to a tensor (e.g. `RowwiseParallel` on a
/// norm weight) are errors, so a typo cannot silently replicate a layer.
///
/// ```
/// use dtensor_runtime::checkpoint::hf::LoadPlan;
/// use dtensor_runtime::module::{ColwiseParallel, LayerKind, RowwiseParallel};
/// use dtensor_runtime::{Replicate, Shard};
/// let plan = LoadPlan::new()
///     .layer("model.embed_tokens", LayerKind::Embedding, RowwiseParallel::new())
///     .style("model.layers.*.self_attn.q_proj", ColwiseParallel::new())
///     .style("model.layers.*.mlp.up_proj", ColwiseParallel::new())
///     .style("model.layers.*.mlp.down_proj", RowwiseParallel::new())
///     .placements("lm_head.weight", &[Replicate, Shard(0)]);
/// assert_eq!(plan.len(), 5);
/// ```
#[derive(Default)]
pub struct LoadPlan {
    entries: Vec<Entry>,
}

impl LoadPlan {
    /// An empty plan: every tensor replicated.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the plan has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Tensors matching `pattern` get `placements` (one per mesh dim; `Partial` is refused
    /// when loading).
    pub fn placements(mut self, pattern: &str, placements: &[Placement]) -> Self {
        self.entries.push(Entry { pattern: pattern.to_string(), rule: Rule::Placements(placements.to_vec()) });
        self
    }

    /// Tensors under the Linear layers matching `pattern` are sharded by `style` (see
    /// [`parallelize_module`](crate::module::parallelize_module) for what each style does to
    /// `weight` and `bias`).
    pub fn style(self, pattern: &str, style: impl ParallelStyle + Send + Sync + 'static) -> Self {
        self.layer(pattern, LayerKind::Linear, style)
    }

    /// Like [`LoadPlan::style`] for layers of another kind (an `Embedding` shards differently).
    pub fn layer(mut self, pattern: &str, kind: LayerKind, style: impl ParallelStyle + Send + Sync + 'static) -> Self {
        self.entries.push(Entry { pattern: pattern.to_string(), rule: Rule::Style(kind, Box::new(style)) });
        self
    }

    /// Placements of each of `names` on `mesh` (`source` names the checkpoint in errors).
    pub(crate) fn resolve(&self, names: &[&str], mesh: &DeviceMesh, source: &str) -> Result<Vec<Vec<Placement>>> {
        let bad = |reason: String| Error::InvalidArgument { context: format!("load plan for `{source}`"), reason };
        for e in &self.entries {
            if e.pattern.split('.').any(str::is_empty) {
                return Err(bad(format!("pattern `{}` has an empty component", e.pattern)));
            }
        }
        let mut used = vec![false; self.entries.len()];
        let mut out = Vec::with_capacity(names.len());
        for &name in names {
            let mut hits = self.entries.iter().enumerate().filter(|(_, e)| covers(&e.pattern, name));
            let Some((i, entry)) = hits.next() else {
                out.push(vec![Placement::Replicate; mesh.ndim()]);
                continue;
            };
            if let Some((_, other)) = hits.next() {
                return Err(bad(format!(
                    "tensor `{name}` is matched by two entries, `{}` and `{}`",
                    entry.pattern, other.pattern
                )));
            }
            used[i] = true;
            out.push(match &entry.rule {
                Rule::Placements(p) => p.clone(),
                Rule::Style(kind, style) => {
                    let md = match style.mesh_dim() {
                        Some(dim) => mesh.dim_index(dim)?,
                        None => mesh.ndim() - 1,
                    };
                    let leaf = name.rsplit('.').next().unwrap_or(name);
                    let mut p = vec![Placement::Replicate; mesh.ndim()];
                    p[md] = style
                        .param_placement(*kind, leaf)
                        .map_err(|e| bad(format!("entry `{}`, tensor `{name}`: {e}", entry.pattern)))?;
                    p
                }
            });
        }
        if let Some(i) = used.iter().position(|u| !u) {
            return Err(bad(format!("pattern `{}` matches no tensor", self.entries[i].pattern)));
        }
        Ok(out)
    }
}

/// Does `pattern` match `name` or a leading run of its dotted components?
fn covers(pattern: &str, name: &str) -> bool {
    let mut parts = name.split('.');
    pattern.split('.').all(|p| parts.next().is_some_and(|n| matches_component(p.as_bytes(), n.as_bytes())))
}

/// `*` and `?` wildcard match of one component; linear time (greedy with one backtrack point).
fn matches_component(p: &[u8], s: &[u8]) -> bool {
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < s.len() {
        if i < p.len() && (p[i] == b'?' || p[i] == s[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        assert!(covers("model.layers.*.mlp.up_proj", "model.layers.0.mlp.up_proj.weight"));
        assert!(covers("model.layers.*.mlp.up_proj", "model.layers.17.mlp.up_proj.bias"));
        assert!(covers("model.layers.*.mlp.up_proj.weight", "model.layers.3.mlp.up_proj.weight"));
        assert!(!covers("layers.*.mlp.up_proj", "model.layers.0.mlp.up_proj.weight"), "anchored");
        assert!(!covers("model.layers.*.mlp.up_proj", "model.layers.0.mlp.up_proj_x.weight"));
        assert!(!covers("model.layers.*.mlp.up_proj.weight.x", "model.layers.0.mlp.up_proj.weight"));
        assert!(covers("model.layers.*.self_attn.?_proj", "model.layers.1.self_attn.q_proj.weight"));
        assert!(covers("*.*_proj", "attn.out_proj.weight"));
        assert!(matches_component(b"a*b*c", b"aXXbYYbc"));
        assert!(!matches_component(b"a*b*c", b"aXXbYYb"));
        assert!(matches_component(b"*", b""));
        assert!(!matches_component(b"?", b""));
    }
}
