//! The runtime's module graph against `docs/ARCHITECTURE.md`: no file imports from a floor
//! above its own, and the only import cycles are the ones the document names (and says why).
//!
//! An import is a `crate::` or `super::` path in code (comments are skipped): what the file
//! takes from another file of the crate. Paths through the crate root's re-exports
//! (`crate::DTensor`) count as imports of the file that defines the item's module. A folder's
//! `mod.rs` re-exporting its own children by relative paths (`pub use buf::Buf`) is the
//! folder's face, not an import. The floors and the named cycles are read from the tables of
//! ARCHITECTURE.md's "Floors" and "Cycles that stay" sections, so the document and this check
//! cannot disagree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn architecture() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ARCHITECTURE.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every `.rs` file under `src/`, as a path relative to it with `/` separators.
fn source_files() -> Vec<String> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, base, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p.strip_prefix(base).unwrap().to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut out = Vec::new();
    walk(&src_dir(), &src_dir(), &mut out);
    out.sort();
    out
}

/// The module path of a file: `comm/mod.rs` → `[comm]`, `comm/buf.rs` → `[comm, buf]`.
fn module_of(file: &str) -> Vec<String> {
    let mut segs: Vec<String> = file.trim_end_matches(".rs").split('/').map(String::from).collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
        segs.pop();
    }
    segs
}

/// The text with comments blanked (kept the same length, so positions still line up).
fn strip_comments(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = b.to_vec();
    let (mut i, mut in_str) = (0, false);
    while i < b.len() {
        if in_str {
            if b[i] == b'\\' {
                i += 2;
                continue;
            }
            in_str = b[i] != b'"';
            i += 1;
        } else if b[i] == b'r'
            && (b[i + 1..].starts_with(b"\"") || b[i + 1..].starts_with(b"#"))
            && !(i > 0 && is_ident(b[i - 1]))
        {
            // A raw string: skip to its closing quote and as many hashes as it opened with.
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let body = i + 2 + hashes;
            i = b[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |k| body + k + close.len());
        } else if b[i] == b'"' && !(i > 0 && b[i - 1] == b'\'') {
            in_str = true;
            i += 1;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                out[i] = b' ';
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            while i < b.len() && !b[i..].starts_with(b"*/") {
                out[i] = if b[i] == b'\n' { b'\n' } else { b' ' };
                i += 1;
            }
            if i < b.len() {
                out[i] = b' ';
                out[i + 1] = b' ';
                i += 2;
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The byte ranges of the inline `mod name { ... }` blocks of a file (where `super` means the
/// file's own module).
fn inline_mods(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(k) = s[from..].find("mod ") {
        let at = from + k;
        from = at + 4;
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        let mut j = at + 4;
        while j < b.len() && is_ident(b[j]) {
            j += 1;
        }
        while j < b.len() && b[j] == b' ' {
            j += 1;
        }
        if j >= b.len() || b[j] != b'{' {
            continue;
        }
        let (mut depth, mut e) = (0usize, j);
        while e < b.len() {
            match b[e] {
                b'{' => depth += 1,
                b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            e += 1;
        }
        out.push((j, e));
    }
    out
}

/// Parses the path tree that starts at `i` (after `crate::` or `super::`): every full path it
/// names, as segments (`a::{b, c::d}` → `[a, b]`, `[a, c, d]`).
fn path_tree(b: &[u8], mut i: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut segs = prefix;
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i < b.len() && b[i] == b'{' {
            i += 1;
            loop {
                while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    return i + 1;
                }
                let next = path_tree(b, i, segs.clone(), out);
                i = next.max(i + 1);
            }
        }
        if i < b.len() && b[i] == b'*' {
            out.push(segs);
            return i + 1;
        }
        let start = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        if i > start {
            let seg = String::from_utf8_lossy(&b[start..i]).into_owned();
            if seg != "self" {
                segs.push(seg);
            }
        }
        if b[i..].starts_with(b"::") {
            i += 2;
            continue;
        }
        out.push(segs);
        return i;
    }
}

struct Crate {
    /// Module path → file.
    modules: BTreeMap<Vec<String>, String>,
    /// Name re-exported at the crate root → the path it stands for.
    root: BTreeMap<String, Vec<String>>,
}

impl Crate {
    fn new(files: &[String]) -> Crate {
        let modules = files.iter().map(|f| (module_of(f), f.clone())).collect();
        let mut c = Crate { modules, root: BTreeMap::new() };
        let lib = strip_comments(&std::fs::read_to_string(src_dir().join("lib.rs")).unwrap());
        let b = lib.as_bytes();
        let mut from = 0;
        while let Some(k) = lib[from..].find("pub use ") {
            let at = from + k + "pub use ".len();
            let mut paths = Vec::new();
            from = path_tree(b, at, Vec::new(), &mut paths);
            // `pub mod prelude { pub use crate::{..} }` names the root again: not a definition.
            for p in paths.into_iter().filter(|p| p.first().is_some_and(|s| s != "crate")) {
                if let Some(name) = p.last() {
                    c.root.insert(name.clone(), p.clone());
                }
            }
        }
        c
    }

    /// The file a crate path points into: the longest prefix of it that is a module.
    fn resolve(&self, segs: &[String]) -> Option<&String> {
        let segs: Vec<String> = match segs.first() {
            Some(first) if !self.modules.contains_key(std::slice::from_ref(first)) => {
                let mut s = self.root.get(first)?.clone();
                s.extend_from_slice(&segs[1..]);
                s
            }
            _ => segs.to_vec(),
        };
        (1..=segs.len()).rev().find_map(|n| self.modules.get(&segs[..n]))
    }

    /// The files `file` imports from (itself excluded).
    fn imports(&self, file: &str) -> BTreeSet<String> {
        let text = strip_comments(&std::fs::read_to_string(src_dir().join(file)).unwrap());
        let b = text.as_bytes();
        let mods = inline_mods(&text);
        let me = module_of(file);
        let mut out = BTreeSet::new();
        for key in ["crate::", "super::"] {
            let mut from = 0;
            while let Some(k) = text[from..].find(key) {
                let at = from + k;
                from = at + key.len();
                if at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b'$' || b[at - 1] == b':') {
                    continue;
                }
                let mut paths = Vec::new();
                let base = if key == "crate::" {
                    Vec::new()
                } else {
                    // `super` inside an inline `mod tests { }` is the file's own module.
                    let mut ups: usize = 1;
                    let mut j = from;
                    while b[j..].starts_with(b"super::") {
                        ups += 1;
                        j += "super::".len();
                    }
                    from = j;
                    let inside = mods.iter().filter(|(s, e)| *s < at && at < *e).count();
                    let up = ups.saturating_sub(inside);
                    if up > me.len() {
                        continue;
                    }
                    me[..me.len() - up].to_vec()
                };
                path_tree(b, from, base, &mut paths);
                for p in paths {
                    if let Some(f) = self.resolve(&p) {
                        if f != file {
                            out.insert(f.clone());
                        }
                    }
                }
            }
        }
        out
    }
}

/// The rows of the first table after the heading `## {title}`: cells, backticks kept.
fn table(doc: &str, title: &str) -> Vec<Vec<String>> {
    let head = format!("## {title}");
    let at = doc.find(&head).unwrap_or_else(|| panic!("ARCHITECTURE.md has no `{head}` section"));
    let rest = &doc[at + head.len()..];
    let rest = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    rest.lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| ---"))
        .skip(1)
        .map(|l| l.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .collect()
}

/// The backticked names of a cell.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(String::from).collect()
}

/// Floor of each path pattern (`x.rs` a file, `dir/` a folder); the longest match wins.
fn floors(doc: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for row in table(doc, "Floors") {
        let n: usize = row[0]
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("floor row {row:?} does not start with its number"));
        out.extend(ticked(&row[1]).into_iter().map(|p| (p, n)));
    }
    out
}

fn floor_of(floors: &[(String, usize)], file: &str) -> Option<usize> {
    floors
        .iter()
        .filter(|(p, _)| p == file || (p.ends_with('/') && file.starts_with(p.as_str())))
        .max_by_key(|(p, _)| p.len())
        .map(|&(_, n)| n)
}

/// Strongly connected components of more than one file (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct T<'g> {
        g: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<BTreeSet<String>>,
    }
    impl<'g> T<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            for w in self.g.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let lw = self.low[w.as_str()];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w.as_str()) {
                    let iw = self.index[w.as_str()];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.insert(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let files = source_files();
    let c = Crate::new(&files);
    files.iter().map(|f| (f.clone(), c.imports(f))).collect()
}

#[test]
fn no_file_imports_from_a_floor_above_its_own() {
    let doc = architecture();
    let floors = floors(&doc);
    let g = graph();
    let unplaced: Vec<&String> = g.keys().filter(|f| floor_of(&floors, f).is_none()).collect();
    assert!(unplaced.is_empty(), "files with no floor in ARCHITECTURE.md's table: {unplaced:?}");
    let mut up = Vec::new();
    for (f, targets) in &g {
        let ff = floor_of(&floors, f).unwrap();
        for t in targets {
            let ft = floor_of(&floors, t).unwrap();
            if ft > ff {
                up.push(format!("{f} (floor {ff}) imports {t} (floor {ft})"));
            }
        }
    }
    let edges: usize = g.values().map(BTreeSet::len).sum();
    println!("{} files, {edges} imports between files, {} running upward", g.len(), up.len());
    assert!(up.is_empty(), "imports running up a floor:\n{}", up.join("\n"));
}

#[test]
fn the_only_cycles_are_the_named_ones() {
    let doc = architecture();
    let named: Vec<BTreeSet<String>> =
        table(&doc, "Cycles that stay").iter().map(|row| ticked(&row[0]).into_iter().collect()).collect();
    let found = cycles(&graph());
    for c in &found {
        println!("cycle of {} files: {c:?}", c.len());
    }
    let unnamed: Vec<&BTreeSet<String>> = found.iter().filter(|c| !named.contains(c)).collect();
    assert!(unnamed.is_empty(), "import cycles ARCHITECTURE.md does not name: {unnamed:?}");
    let stale: Vec<&BTreeSet<String>> = named.iter().filter(|c| !found.contains(c)).collect();
    assert!(stale.is_empty(), "cycles ARCHITECTURE.md names that the code no longer has: {stale:?}");
}

/// The parser itself: nested groups, `self`, root re-exports and `super` in a test module.
#[test]
fn paths_are_read_as_rust_reads_them() {
    let mut out = Vec::new();
    let text = "a::{b, c::{d, self}, e::*}; x";
    path_tree(text.as_bytes(), 0, Vec::new(), &mut out);
    let want: Vec<Vec<String>> = [vec!["a", "b"], vec!["a", "c", "d"], vec!["a", "c"], vec!["a", "e"]]
        .iter()
        .map(|p| p.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(out, want);
    assert_eq!(strip_comments("x // crate::a\ny"), format!("x{}\ny", " ".repeat(12)));
    assert_eq!(strip_comments("\"// not a comment\" z"), "\"// not a comment\" z");
    assert_eq!(strip_comments("r#\"\" // \"# // c"), format!("r#\"\" // \"#{}", " ".repeat(5)));
    assert_eq!(inline_mods("mod a;\nmod tests {\n fn f() {}\n}\n").len(), 1);
    let c = Crate::new(&source_files());
    assert_eq!(c.resolve(&["DTensor".to_string()]).map(String::as_str), Some("dtensor.rs"));
    assert_eq!(c.resolve(&["comm".into(), "buf".into(), "Buf".into()]).map(String::as_str), Some("comm/buf.rs"));
    // `use super::*` in `shape.rs`'s test module is shape.rs itself, not the crate root.
    assert!(!c.imports("shape.rs").contains("lib.rs"));
}
