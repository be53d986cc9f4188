//! Dotted parameter names (`layers.0.self_attn.q_proj.weight`): joining a prefix and a name,
//! and patterns whose `*` segments match any one segment. Shared by the typed layer (a
//! struct's declared layouts by pattern) and the checkpoint loaders (`TensorMap`).

/// `prefix.name`, or `name` at the top.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Does `name` match `pattern`, where a `*` segment matches any one segment?
pub fn matches_pattern(pattern: &str, name: &str) -> bool {
    let (mut p, mut n) = (pattern.split('.'), name.split('.'));
    loop {
        match (p.next(), n.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == "*" || a == b => {}
            _ => return false,
        }
    }
}
