//! [`TensorMap`]: where a module's parameters come from when the checkpoint names or fuses
//! them differently from the module (GPT-2's fused `c_attn` holds q, k and v side by side).

use crate::error::{Error, Result};
use crate::names::matches_pattern;

/// Part `part` of `parts` equal parts of a tensor along `dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// The dim cut into parts.
    pub dim: usize,
    /// Which part (from 0).
    pub part: usize,
    /// How many equal parts.
    pub parts: usize,
}

/// One rule: parameters matching `param` come from `tensor` (`*` segments carried over),
/// whole or split.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    param: String,
    tensor: String,
    split: Option<Split>,
}

/// Where each parameter of a module is read from, for
/// [`HfCheckpoint::load_module_mapped`](super::HfCheckpoint::load_module_mapped). Patterns
/// are dotted paths whose `*` segments match one segment each and are carried, in order, into
/// the tensor name (`h.*.attn.q.weight` → `h.*.attn.c_attn.weight`). The first matching rule
/// applies; a parameter no rule matches is read from the tensor of its own name.
///
/// A split reads one of `parts` equal parts of a fused tensor along `dim` and then shards that
/// part by the parameter's placements, so a rank's shard of q, of k and of v are each its own
/// heads (sharding the fused tensor as one block would give the first ranks all of q: the
/// corruption Megatron-LM #2769 reports). Only the bytes of the rank's shard are read.
///
/// ```
/// use dtensor_runtime::checkpoint::hf::{Split, TensorMap};
/// // GPT-2: q, k, v are thirds of `c_attn` along the output dim (Conv1D weights are [in, out]).
/// let map = TensorMap::new()
///     .split("h.*.attn.q.weight", "h.*.attn.c_attn.weight", 1, 0, 3)
///     .split("h.*.attn.k.weight", "h.*.attn.c_attn.weight", 1, 1, 3)
///     .rename("wte", "wte.weight");
/// let k = Some(Split { dim: 1, part: 1, parts: 3 });
/// assert_eq!(map.source("h.3.attn.k.weight").unwrap(), ("h.3.attn.c_attn.weight".to_string(), k));
/// assert_eq!(map.source("wte").unwrap(), ("wte.weight".to_string(), None));
/// assert_eq!(map.source("ln_f.weight").unwrap(), ("ln_f.weight".to_string(), None));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TensorMap {
    rules: Vec<Rule>,
    ignored: Vec<String>,
}

impl TensorMap {
    /// No rules: every parameter from the tensor of its name.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parameters matching `param` are the tensor `tensor`.
    pub fn rename(mut self, param: &str, tensor: &str) -> Self {
        self.rules.push(Rule { param: param.into(), tensor: tensor.into(), split: None });
        self
    }

    /// Checkpoint tensors matching `tensor` (names under the prefix, `*` segments allowed)
    /// may stay unread: buffers the module does not hold, such as old GPT-2 exports' causal
    /// masks `h.*.attn.bias` or Llama's `layers.*.self_attn.rotary_emb.inv_freq`
    /// (transformers drops them on load as well).
    pub fn ignore(mut self, tensor: &str) -> Self {
        self.ignored.push(tensor.into());
        self
    }

    /// Whether the tensor `name` (under the prefix) may stay unread.
    pub fn ignores(&self, name: &str) -> bool {
        self.ignored.iter().any(|p| matches_pattern(p, name))
    }

    /// Parameters matching `param` are part `part` of `parts` equal parts of `tensor` along
    /// `dim`.
    pub fn split(mut self, param: &str, tensor: &str, dim: usize, part: usize, parts: usize) -> Self {
        self.rules.push(Rule { param: param.into(), tensor: tensor.into(), split: Some(Split { dim, part, parts }) });
        self
    }

    /// The tensor name and split of parameter `path`. An error for a rule that cannot apply
    /// (a part out of range, more `*` in the tensor than in the pattern).
    pub fn source(&self, path: &str) -> Result<(String, Option<Split>)> {
        let Some(rule) = self.rules.iter().find(|r| matches_pattern(&r.param, path)) else {
            return Ok((path.to_string(), None));
        };
        let bad =
            |reason: String| Error::InvalidArgument { context: format!("TensorMap rule `{}`", rule.param), reason };
        if let Some(Split { part, parts, .. }) = rule.split {
            if parts == 0 || part >= parts {
                return Err(bad(format!("part {part} of {parts} does not exist")));
            }
        }
        let mut stars = rule.param.split('.').zip(path.split('.')).filter(|(p, _)| *p == "*").map(|(_, s)| s);
        let mut name = Vec::new();
        for seg in rule.tensor.split('.') {
            if seg == "*" {
                let Some(s) = stars.next() else {
                    return Err(bad(format!("the tensor `{}` has more `*` than the pattern", rule.tensor)));
                };
                name.push(s);
            } else {
                name.push(seg);
            }
        }
        Ok((name.join("."), rule.split))
    }

    /// Whether a rule sends some parameter at or below the module path `path` to a tensor
    /// for which `exists` holds (so that an `Option` or `Vec` of mapped parameters is found).
    pub(crate) fn maps_below(&self, path: &str, exists: impl Fn(&str) -> bool) -> bool {
        let depth = path.split('.').count();
        self.rules.iter().any(|r| {
            let segs: Vec<&str> = r.param.split('.').collect();
            if segs.len() < depth || !matches_pattern(&segs[..depth].join("."), path) {
                return false;
            }
            // The pattern's `*` below `path` stand for any index: try the parameter that
            // `path` + the rest of the pattern with `0` for each `*` would be.
            let rest: Vec<&str> = segs[depth..].iter().map(|s| if *s == "*" { "0" } else { s }).collect();
            let probe = if rest.is_empty() { path.to_string() } else { format!("{path}.{}", rest.join(".")) };
            self.source(&probe).is_ok_and(|(t, _)| exists(&t))
        })
    }
}
