//! Keeps the documentation honest without building anything: reads README.md and every
//! docs/*.md and checks
//!
//! - every relative link points to a file that exists, and every `#anchor` to a heading of
//!   its target (GitHub's heading ids);
//! - README.md stays a newcomer's page: at most [`README_MAX_LINES`] lines, the two set-up
//!   commands CI and people rely on, and no markdown table cell (in any of the files) over
//!   [`MAX_CELL_CHARS`] characters;
//! - every code fence names its language (rustdoc compiles an unnamed one as Rust), and every
//!   file with a Rust block is compiled as doctests by the facade (`src/lib.rs`);
//! - every function, module or item docs/ARCHITECTURE.md cites as `name()` or as a `::` path,
//!   and every source file or folder it names, exists in dtensor-runtime/ or dtensor-macros/
//!   (a grep for `fn name`, `mod name`, `struct`/`enum`/`trait`/`type`/`const`/`static`/
//!   `macro_rules!`, an enum variant, or a file or folder so named).

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 350;
const MAX_CELL_CHARS: usize = 300;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and docs/*.md, as (path, text).
fn doc_files() -> Vec<(PathBuf, String)> {
    let mut paths = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("readable docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let text = fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, text)
        })
        .collect()
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

/// The lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            out.push((i + 1, line));
        }
    }
    out
}

/// The contents of the inline code spans of `line` (single backticks).
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// `line` with its inline code spans removed, so that code is never read as a link.
fn without_code(line: &str) -> String {
    line.split('`').step_by(2).collect()
}

/// GitHub's id of a heading: lower case, punctuation dropped, spaces to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The heading ids of a markdown text (a repeated heading gets `-1`, `-2`, ... as on GitHub).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let mut id = base.clone();
        let mut n = 0;
        while seen.contains(&id) {
            n += 1;
            id = format!("{base}-{n}");
        }
        seen.insert(id);
    }
    seen
}

/// The link targets `](target)` of a line's prose.
fn link_targets(line: &str) -> Vec<String> {
    let prose = without_code(line);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        out.push(rest[..end].trim().to_string());
        rest = &rest[end..];
    }
    out
}

#[test]
fn relative_links_and_anchors_resolve() {
    let mut bad = Vec::new();
    for (path, text) in doc_files() {
        let dir = path.parent().expect("a file has a folder");
        for (n, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, anchor) = target.split_once('#').unwrap_or((target.as_str(), ""));
                let dest = if file.is_empty() { path.clone() } else { dir.join(file) };
                if !dest.exists() {
                    bad.push(format!("{}:{n}: `{target}`: no file {}", rel(&path), dest.display()));
                    continue;
                }
                if !anchor.is_empty() && dest.extension().is_some_and(|x| x == "md") {
                    let dest_text = fs::read_to_string(&dest).expect("readable link target");
                    if !anchors(&dest_text).contains(anchor) {
                        bad.push(format!("{}:{n}: `{target}`: no heading `#{anchor}` in {}", rel(&path), rel(&dest)));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn readme_is_short_and_keeps_the_set_up_commands() {
    let text = fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = text.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"
    );
    // CI (.ci/run) and newcomers run exactly these two commands.
    for cmd in ["cargo run --example mlp_tp", "cargo test --workspace"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(cmd)),
            "README.md lost the set-up command line `{cmd}`"
        );
    }
}

/// Splits a table row into cells on `|` that is not escaped as `\|`.
fn cells(row: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut prev = ' ';
    for c in row.trim().trim_start_matches('|').chars() {
        if c == '|' && prev != '\\' {
            out.push(String::new());
        } else {
            out.last_mut().expect("at least one cell").push(c);
        }
        prev = c;
    }
    out
}

#[test]
fn no_table_cell_is_a_page() {
    let mut bad = Vec::new();
    for (path, text) in doc_files() {
        for (n, line) in prose_lines(&text) {
            if !line.trim_start().starts_with('|') {
                continue;
            }
            for cell in cells(line) {
                let len = cell.trim().chars().count();
                if len > MAX_CELL_CHARS {
                    let head: String = cell.trim().chars().take(60).collect();
                    bad.push(format!("{}:{n}: a cell of {len} characters (`{head}`...)", rel(&path)));
                }
            }
        }
    }
    assert!(bad.is_empty(), "table cells over {MAX_CELL_CHARS} characters:\n{}", bad.join("\n"));
}

#[test]
fn code_fences_name_their_language_and_rust_blocks_are_doctests() {
    let lib = fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    let mut bad = Vec::new();
    for (path, text) in doc_files() {
        let mut in_fence = false;
        let mut has_rust = false;
        for (i, line) in text.lines().enumerate() {
            let t = line.trim_start();
            if !t.starts_with("```") {
                continue;
            }
            if !in_fence {
                let lang = t.trim_start_matches('`').trim();
                if lang.is_empty() {
                    bad.push(format!(
                        "{}:{}: a code block without a language (rustdoc would compile it as Rust)",
                        rel(&path),
                        i + 1
                    ));
                }
                has_rust |= lang == "rust" || lang.starts_with("rust,");
            }
            in_fence = !in_fence;
        }
        let include = format!("include_str!(\"../{}\")", rel(&path));
        if has_rust && !lib.contains(&include) {
            bad.push(format!(
                "{}: has Rust blocks but src/lib.rs has no `#[doc = {include}]`, so they are never compiled",
                rel(&path)
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Every name the source tree defines: items, enum variants, modules, files and folders.
fn source_names() -> HashSet<String> {
    fn walk(dir: &Path, names: &mut HashSet<String>) {
        for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("readable entry").path();
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
            if path.is_dir() {
                names.insert(stem);
                walk(&path, names);
            } else if path.extension().is_some_and(|x| x == "rs") {
                names.insert(stem);
                let text = fs::read_to_string(&path).expect("readable source");
                scan_items(&text, names);
            }
        }
    }
    let mut names = HashSet::new();
    for dir in ["dtensor-runtime/src", "dtensor-macros/src"] {
        walk(&root().join(dir), &mut names);
    }
    names
}

/// Adds the names `fn`, `mod`, `struct`, ... introduce, and enum-variant-like lines
/// (`Name(..)`, `Name {`, `Name,`), to `names`.
fn scan_items(text: &str, names: &mut HashSet<String>) {
    const KEYWORDS: [&str; 10] =
        ["fn", "mod", "struct", "enum", "trait", "type", "const", "static", "union", "macro_rules"];
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    for line in text.lines() {
        let words: Vec<&str> = line.split(|c: char| !ident(c)).filter(|w| !w.is_empty()).collect();
        for pair in words.windows(2) {
            if KEYWORDS.contains(&pair[0]) {
                names.insert(pair[1].to_string());
            }
        }
        let t = line.trim_start();
        if t.starts_with(|c: char| c.is_ascii_uppercase()) {
            let name: String = t.chars().take_while(|&c| ident(c)).collect();
            let after = t[name.len()..].trim_start();
            if after.is_empty() || after.starts_with(['(', '{', ',', '=']) {
                names.insert(name);
            }
        }
    }
}

/// The path a code span cites, if it cites one the check covers: `name()` or a `::` path
/// (optionally called, `Along::Dim(i)`), without crate prefixes; `None` for anything else
/// and for paths into other crates (std's `Arc::make_mut`).
fn cited_path(span: &str) -> Option<Vec<String>> {
    const OURS: [&str; 6] = ["crate", "self", "super", "dtensor", "dtensor_runtime", "dtensor_macros"];
    const FOREIGN: [&str; 10] = ["std", "core", "Arc", "Rc", "Box", "Vec", "Option", "String", "ndarray", "cudarc"];
    let s = span.trim().trim_start_matches('.');
    let (path, args) = match s.find('(') {
        Some(i) if s.ends_with(')') => (&s[..i], Some(&s[i..])),
        Some(_) => return None,
        None => (s, None),
    };
    let segs: Vec<&str> = path.split("::").collect();
    let is_ident = |w: &str| {
        w.starts_with(|c: char| c.is_alphabetic() || c == '_') && w.chars().all(|c| c.is_alphanumeric() || c == '_')
    };
    if !segs.iter().all(|w| is_ident(w)) || (segs.len() < 2 && args != Some("()")) {
        return None;
    }
    if FOREIGN.contains(&segs[0]) {
        return None;
    }
    Some(segs.into_iter().filter(|w| !OURS.contains(w)).map(str::to_string).collect())
}

/// A source file or folder a code span names (`layout/pack.rs`, `comm/threads/`), if any.
fn cited_file(span: &str) -> Option<&str> {
    let s = span.trim();
    let pathish = !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || "_-./".contains(c));
    // `torch/...` is PyTorch's tree, cited as where an op's strategies come from.
    (pathish && (s.ends_with(".rs") || (s.ends_with('/') && s.len() > 1)) && !s.starts_with("torch/")).then_some(s)
}

#[test]
fn architecture_cites_only_what_exists() {
    let text = fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let names = source_names();
    let bases = ["", "dtensor-runtime/src/", "dtensor-runtime/", "dtensor-macros/src/"];
    let mut bad = Vec::new();
    let mut checked = 0;
    for (n, line) in prose_lines(&text) {
        for span in code_spans(line) {
            if let Some(segs) = cited_path(span) {
                checked += 1;
                let missing: Vec<&String> = segs.iter().filter(|s| !names.contains(*s)).collect();
                if !missing.is_empty() {
                    bad.push(format!("docs/ARCHITECTURE.md:{n}: `{span}`: nothing named {missing:?} in the source"));
                }
            } else if let Some(file) = cited_file(span) {
                checked += 1;
                if !bases.iter().any(|b| root().join(format!("{b}{file}")).exists()) {
                    bad.push(format!("docs/ARCHITECTURE.md:{n}: `{file}`: no such file or folder"));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} citations found: the parser no longer reads ARCHITECTURE.md");
    assert!(bad.is_empty(), "ARCHITECTURE.md names what does not exist:\n{}", bad.join("\n"));
}

/// The checks themselves, on inputs whose answer is known.
#[test]
fn the_parsers_read_what_they_should() {
    assert_eq!(slug("Layout semantics (PyTorch-compatible)"), "layout-semantics-pytorch-compatible");
    assert_eq!(slug("The `#[distribute]` macro"), "the-distribute-macro");
    assert_eq!(link_targets("see [a](docs/A.md#x) and [b](#y), not `[c](z)`"), ["docs/A.md#x", "#y"]);
    assert_eq!(cells("| a | b \\| c |"), [" a ", " b \\| c ", ""]);
    assert_eq!(cited_path("redistribute::plan()"), Some(vec!["redistribute".to_string(), "plan".to_string()]));
    assert_eq!(cited_path("Along::Dim(i)"), Some(vec!["Along".to_string(), "Dim".to_string()]));
    assert_eq!(cited_path("crate::comm::storage"), Some(vec!["comm".to_string(), "storage".to_string()]));
    assert_eq!(cited_path("backward()"), Some(vec!["backward".to_string()]));
    assert_eq!(cited_path("Arc::make_mut"), None);
    assert_eq!(cited_path("ceil(s/n)"), None);
    assert_eq!(cited_path("x.matmul(&b)"), None);
    assert_eq!(cited_file("layout/pack.rs"), Some("layout/pack.rs"));
    assert_eq!(cited_file("comm/"), Some("comm/"));
    assert_eq!(cited_file("torch/distributed/tensor/_ops/"), None);
    let mut names = HashSet::new();
    scan_items(
        "pub(crate) fn plan_x<T>() {}\nenum E {\n    Dim(usize),\n    Other { a: u8 },\n}\nmacro_rules! m { }",
        &mut names,
    );
    for n in ["plan_x", "E", "Dim", "Other", "m"] {
        assert!(names.contains(n), "{n} not found in {names:?}");
    }
    let ids = anchors("# A\n```rust\n# not a heading\n```\n## A\n");
    assert!(ids.contains("a") && ids.contains("a-1") && !ids.contains("not-a-heading"));
}
