//! The layering of `src/`, checked from the source text (the map in `src/lib.rs`, "Layers").
//!
//! Every `src/**/*.rs` is read; its references to modules of the crate are extracted — `use`
//! statements (grouped, nested, over several lines), inline paths such as
//! `crate::exec::confine::reported()`, `self::` and `super::` paths resolved against the
//! module they are written in (inline `mod tests { … }` included), and paths that start with a
//! child module's name — and each is mapped to the *unit* it names: a top-level module, or a
//! wing of `nylorun`. The checks, each listing every violation it finds:
//!
//! * every edge between two units is one the table [`ALLOWED`] lists: the layers run
//!   CLI (`main.rs`, `config`) → fronts (`local`, `nylorun`, `byoh`; `probe`, a client for
//!   `podhost health`, imports only `floor`) → `chat` → `agent` → `tools` → `exec` → `floor`,
//!   each importing only from layers below it; a front never imports another front or
//!   `config`; inside `nylorun` the wings run `host` → `turn` → `artifacts` → `link`, and the
//!   root `nylorun/mod.rs` is importable by every wing; `failpoints` (crash and fault
//!   boundaries, and its `failpoint!`/`failpoint_fails!` macros) sits beside `floor`, importable
//!   by every layer above it, and `fuzzing` (the fuzz targets' bodies, test builds only) beside
//!   the CLI, importing what it fuzzes;
//! * no cycle between units;
//! * no cycle between the files of one room (e.g. two files of `byoh`, or of `agent`, importing
//!   each other).
//!   A file and the files of its own submodules are one module tree and may use each other (a
//!   child uses its parent's private items, the parent re-exports the child).
//!
//! * every file of `src/` is in a unit the table knows.
//!
//! Beside the layers, the length of functions: one of `src/` that spans more than
//! [`LONG_FN_LINES`] lines (its `fn` line to its closing brace; unit tests left out) says why in
//! its doc comment (`Long: …`), and at most [`MAX_LONG_FNS`] do.
//!
//! The cycle checks leave out `#[cfg(test)]` modules: a unit test may call across to what it
//! tests alongside. The layer check reads them too.
//!
//! Paths that start with anything else (`std::…`, an external crate, a name another `use`
//! brought into scope) are not references to a module of ours, or were counted at the `use`
//! that named them. Paths inside string literals (e.g. a serde `with = "…"`) are not read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

// ---- the table ----

/// The units, top to bottom; a unit may import itself and the units this table lists for it.
const ALLOWED: &[(&str, &[&str])] = &[
    (
        "cli",
        &[
            "local",
            "byoh",
            "probe",
            "nylorun",
            "nylorun::host",
            "nylorun::turn",
            "nylorun::artifacts",
            "nylorun::link",
            "chat",
            "agent",
            "tools",
            "exec",
            "floor",
            "failpoints",
        ],
    ),
    (
        "local",
        &["chat", "agent", "tools", "exec", "floor", "failpoints"],
    ),
    (
        "byoh",
        &["chat", "agent", "tools", "exec", "floor", "failpoints"],
    ),
    ("probe", &["floor"]),
    (
        "nylorun::host",
        &[
            "nylorun",
            "nylorun::turn",
            "nylorun::artifacts",
            "nylorun::link",
            "chat",
            "agent",
            "tools",
            "exec",
            "floor",
            "failpoints",
        ],
    ),
    (
        "nylorun::turn",
        &[
            "nylorun",
            "nylorun::artifacts",
            "nylorun::link",
            "chat",
            "agent",
            "tools",
            "exec",
            "floor",
            "failpoints",
        ],
    ),
    (
        "nylorun::artifacts",
        &[
            "nylorun",
            "nylorun::link",
            "chat",
            "agent",
            "tools",
            "exec",
            "floor",
            "failpoints",
        ],
    ),
    (
        "nylorun::link",
        &[
            "nylorun",
            "chat",
            "agent",
            "tools",
            "exec",
            "floor",
            "failpoints",
        ],
    ),
    (
        "nylorun",
        &["chat", "agent", "tools", "exec", "floor", "failpoints"],
    ),
    ("chat", &["agent", "tools", "exec", "floor", "failpoints"]),
    ("agent", &["tools", "exec", "floor", "failpoints"]),
    ("tools", &["exec", "floor", "failpoints"]),
    ("exec", &["floor", "failpoints"]),
    ("floor", &[]),
    // Crash and fault boundaries: any layer marks one; they import nothing of ours.
    ("failpoints", &[]),
    // The fuzz targets' bodies (test builds only): they drive every layer's parsers, as the CLI
    // does; nothing imports them.
    (
        "fuzzing",
        &[
            "byoh",
            "nylorun",
            "nylorun::host",
            "nylorun::turn",
            "nylorun::artifacts",
            "nylorun::link",
            "chat",
            "agent",
            "tools",
            "exec",
            "floor",
            "failpoints",
        ],
    ),
];

/// The rooms (top-level modules) whose files must not import each other in a cycle: all of them.
const ROOMS: &[&str] = &[
    "config",
    "local",
    "byoh",
    "probe",
    "nylorun",
    "chat",
    "agent",
    "tools",
    "exec",
    "floor",
    "failpoints",
    "fuzzing",
];

/// What a unit is called in a failure message.
fn layer_name(unit: &str) -> String {
    match unit {
        "cli" => "cli".to_owned(),
        "local" | "byoh" | "probe" => format!("front {unit}"),
        "nylorun" => "nylorun root".to_owned(),
        u => match u.strip_prefix("nylorun::") {
            Some(wing) => format!("nylorun wing {wing}"),
            None => u.to_owned(),
        },
    }
}

/// The unit of an absolute module path (`["nylorun", "turn", "run"]` → `nylorun::turn`).
fn unit_of(path: &[String]) -> String {
    match path {
        [] => "crate root".to_owned(),
        [first, ..] if first == "config" => "cli".to_owned(),
        // The failpoint macros, exported at the crate's root.
        [first, ..] if first == "failpoint" || first == "failpoint_fails" => {
            "failpoints".to_owned()
        }
        [first, wing, ..]
            if first == "nylorun"
                && ["host", "turn", "artifacts", "link"].contains(&wing.as_str()) =>
        {
            format!("nylorun::{wing}")
        }
        [first, ..] => first.clone(),
    }
}

fn allowed(from: &str, to: &str) -> bool {
    from == to
        || from == "crate root"
        || ALLOWED
            .iter()
            .any(|(f, tos)| *f == from && tos.contains(&to))
}

// ---- the sources ----

/// One reference of a file to a module path of the crate.
#[derive(Clone, Debug, PartialEq)]
struct Ref {
    /// The absolute module path (without `crate::`).
    path: Vec<String>,
    line: usize,
    /// Inside a `#[cfg(test)]` module.
    in_test: bool,
}

struct Source {
    /// `src/…`, for messages.
    name: String,
    /// Its module path; empty for the crate roots (`lib.rs`, and the binaries).
    module: Vec<String>,
    unit: String,
    refs: Vec<Ref>,
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rs_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of `src/<rel>`, and whether it is a binary's root.
fn module_of(rel: &Path) -> (Vec<String>, bool) {
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [f] if f == "lib.rs" => (Vec::new(), false),
        [f] if f == "main.rs" => (Vec::new(), true),
        [d, _] if d == "bin" => (Vec::new(), true),
        _ => {
            let mut m = parts;
            let last = m.pop().unwrap();
            if last != "mod.rs" {
                m.push(last.trim_end_matches(".rs").to_owned());
            }
            (m, false)
        }
    }
}

fn sources() -> Vec<Source> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    files.sort();
    let modules: Vec<(PathBuf, Vec<String>, bool)> = files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(&src).unwrap().to_path_buf();
            let (m, bin) = module_of(&rel);
            (rel, m, bin)
        })
        .collect();
    modules
        .iter()
        .map(|(rel, module, bin)| {
            let text = std::fs::read_to_string(src.join(rel)).unwrap();
            let children: Vec<String> = modules
                .iter()
                .filter(|(_, m, b)| {
                    !*b && m.len() == module.len() + 1
                        && m.starts_with(module)
                        && !module.is_empty()
                })
                .map(|(_, m, _)| m[m.len() - 1].clone())
                .collect();
            let crate_name = bin.then_some("podhost");
            let unit = if *bin {
                "cli".to_owned()
            } else if module.is_empty() {
                "crate root".to_owned()
            } else {
                unit_of(module)
            };
            Source {
                name: format!("src/{}", rel.display()),
                module: module.clone(),
                unit,
                refs: extract(&text, module, &children, crate_name),
            }
        })
        .collect()
}

// ---- the extractor ----

/// `src` with comments, string and char literals blanked (newlines kept, so lines still count).
fn strip(src: &str) -> Vec<char> {
    let c: Vec<char> = src.chars().collect();
    let mut out = c.clone();
    let ident = |k: usize| c[k].is_alphanumeric() || c[k] == '_';
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in &mut out[from..to.min(c.len())] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        match c[i] {
            '/' if next == Some('/') => {
                let end = (i..c.len()).find(|&k| c[k] == '\n').unwrap_or(c.len());
                blank(&mut out, i, end);
                i = end;
            }
            '/' if next == Some('*') => {
                let (mut depth, mut k) = (1, i + 2);
                while k < c.len() && depth > 0 {
                    if c[k] == '/' && c.get(k + 1) == Some(&'*') {
                        depth += 1;
                        k += 2;
                    } else if c[k] == '*' && c.get(k + 1) == Some(&'/') {
                        depth -= 1;
                        k += 2;
                    } else {
                        k += 1;
                    }
                }
                blank(&mut out, i, k);
                i = k;
            }
            '"' => {
                let mut k = i + 1;
                while k < c.len() && c[k] != '"' {
                    k += if c[k] == '\\' { 2 } else { 1 };
                }
                blank(&mut out, i, k + 1);
                i = k + 1;
            }
            'r' if (i == 0 || !ident(i - 1) || (c[i - 1] == 'b' && (i < 2 || !ident(i - 2))))
                && matches!(next, Some('"' | '#')) =>
            {
                let hashes = c[i + 1..].iter().take_while(|&&h| h == '#').count();
                if c.get(i + 1 + hashes) != Some(&'"') {
                    i += 1; // a raw identifier, `r#type`
                    continue;
                }
                let mut k = i + 2 + hashes;
                while k < c.len()
                    && !(c[k] == '"'
                        && c[k + 1..]
                            .iter()
                            .take(hashes)
                            .filter(|&&h| h == '#')
                            .count()
                            == hashes)
                {
                    k += 1;
                }
                blank(&mut out, i, k + 1 + hashes);
                i = k + 1 + hashes;
            }
            '\'' if next == Some('\\') => {
                let end = (i + 3..c.len()).find(|&k| c[k] == '\'').unwrap_or(c.len());
                blank(&mut out, i, end + 1);
                i = end + 1;
            }
            '\'' if c.get(i + 2) == Some(&'\'') => {
                blank(&mut out, i, i + 3);
                i += 3;
            }
            _ => i += 1,
        }
    }
    out
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let c = strip(src);
    let mut toks = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            toks.push((Tok::Ident(c[start..i].iter().collect()), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            toks.push((Tok::PathSep, line));
            i += 2;
        } else {
            toks.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    toks
}

fn is_ident(t: Option<&(Tok, usize)>, s: &str) -> bool {
    matches!(t, Some((Tok::Ident(x), _)) if x == s)
}

fn is_punct(t: Option<&(Tok, usize)>, p: char) -> bool {
    matches!(t, Some((Tok::Punct(x), _)) if *x == p)
}

/// The paths of one use tree starting at `toks[*j]`, under `prefix`.
fn use_tree(
    toks: &[(Tok, usize)],
    j: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, usize)>,
) {
    let line = toks.get(*j).map_or(0, |t| t.1);
    let mut path = prefix;
    if matches!(toks.get(*j), Some((Tok::PathSep, _))) {
        path.push("::".to_owned()); // `use ::name`: an external crate
        *j += 1;
    }
    loop {
        match toks.get(*j) {
            Some((Tok::Ident(s), _)) => {
                path.push(s.clone());
                *j += 1;
                if matches!(toks.get(*j), Some((Tok::PathSep, _))) {
                    *j += 1;
                    continue;
                }
                break;
            }
            Some((Tok::Punct('{'), _)) => {
                *j += 1;
                while *j < toks.len() && !is_punct(toks.get(*j), '}') {
                    use_tree(toks, j, path.clone(), out);
                    if is_punct(toks.get(*j), ',') {
                        *j += 1;
                    }
                }
                *j += 1;
                return;
            }
            Some((Tok::Punct('*'), _)) => {
                *j += 1;
                break;
            }
            _ => break,
        }
    }
    if is_ident(toks.get(*j), "as") {
        *j += 2;
    }
    if path.len() > 1 && path.last().is_some_and(|s| s == "self") {
        path.pop(); // `{self, …}`: the prefix itself
    }
    out.push((path, line));
}

/// Resolves `path`, written in module `current` of a file whose module is `file` and whose
/// child modules are `children`, to an absolute module path; `None` for what is not a module of
/// the crate.
fn resolve(
    path: &[String],
    current: &[String],
    file: &[String],
    children: &[String],
    crate_name: Option<&str>,
) -> Option<Vec<String>> {
    let first = path.first()?;
    if Some(first.as_str()) == crate_name {
        return Some(path[1..].to_vec());
    }
    match first.as_str() {
        "crate" if crate_name.is_some() => None, // a binary's own items
        "crate" => Some(path[1..].to_vec()),
        "self" | "super" => {
            let mut at = current.to_vec();
            let mut rest = path;
            while let Some(s) = rest.first() {
                match s.as_str() {
                    "self" => {}
                    "super" => {
                        at.pop()?;
                    }
                    _ => break,
                }
                rest = &rest[1..];
            }
            at.extend(rest.iter().cloned());
            Some(at)
        }
        // A child module of the file's module: in scope in the file, and through
        // `use super::*` in its inline modules.
        c if children.iter().any(|k| k == c) => {
            let mut at = file.to_vec();
            at.extend(path.iter().cloned());
            Some(at)
        }
        _ => None,
    }
}

/// Every reference of a file (in module `module`, whose child modules are `children`) to a
/// module path of the crate. `crate_name` is `Some("podhost")` in a binary's root, where the
/// library is `podhost::…`.
fn extract(
    src: &str,
    module: &[String],
    children: &[String],
    crate_name: Option<&str>,
) -> Vec<Ref> {
    let toks = tokens(src);
    let mut refs = Vec::new();
    // Inline modules open: (name, the brace depth inside it, under `#[cfg(test)]`).
    let mut inline: Vec<(String, usize, bool)> = Vec::new();
    let mut depth = 0usize;
    let mut cfg_test = false;
    let current = |inline: &[(String, usize, bool)]| -> Vec<String> {
        let mut m = module.to_vec();
        m.extend(inline.iter().map(|(n, _, _)| n.clone()));
        m
    };
    let in_test = |inline: &[(String, usize, bool)]| inline.last().is_some_and(|i| i.2);
    let push = |path: &[String],
                line: usize,
                inline: &[(String, usize, bool)],
                refs: &mut Vec<Ref>,
                test: bool| {
        if let Some(p) = resolve(path, &current(inline), module, children, crate_name) {
            refs.push(Ref {
                path: p,
                line,
                in_test: test,
            });
        }
    };
    let mut i = 0;
    while i < toks.len() {
        let (tok, line) = &toks[i];
        match tok {
            Tok::Punct('#')
                if is_punct(toks.get(i + 1), '[')
                    && is_ident(toks.get(i + 2), "cfg")
                    && is_punct(toks.get(i + 3), '(')
                    && is_ident(toks.get(i + 4), "test")
                    && is_punct(toks.get(i + 5), ')') =>
            {
                cfg_test = true;
                i += 6;
            }
            Tok::Ident(k) if k == "mod" && is_punct(toks.get(i + 2), '{') => {
                if let Some((Tok::Ident(name), _)) = toks.get(i + 1) {
                    depth += 1;
                    let test = cfg_test || in_test(&inline);
                    inline.push((name.clone(), depth, test));
                    i += 3;
                } else {
                    i += 1;
                }
                cfg_test = false;
            }
            Tok::Ident(k) if k == "use" => {
                let mut j = i + 1;
                let mut paths = Vec::new();
                use_tree(&toks, &mut j, Vec::new(), &mut paths);
                let test = cfg_test || in_test(&inline);
                for (p, l) in paths {
                    push(&p, l, &inline, &mut refs, test);
                }
                cfg_test = false;
                i = j;
            }
            Tok::Ident(first)
                if matches!(toks.get(i + 1), Some((Tok::PathSep, _)))
                    && !matches!(toks.get(i.wrapping_sub(1)), Some((Tok::PathSep, _)))
                    && !is_punct(toks.get(i.wrapping_sub(1)), '.')
                    && (["crate", "self", "super"].contains(&first.as_str())
                        || Some(first.as_str()) == crate_name
                        || children.iter().any(|k| k == first)) =>
            {
                let mut path = vec![first.clone()];
                let mut j = i + 1;
                while matches!(toks.get(j), Some((Tok::PathSep, _))) {
                    match toks.get(j + 1) {
                        Some((Tok::Ident(s), _)) => {
                            path.push(s.clone());
                            j += 2;
                        }
                        _ => break,
                    }
                }
                push(&path, *line, &inline, &mut refs, in_test(&inline));
                i = j;
            }
            Tok::Punct('{') => {
                depth += 1;
                cfg_test = false;
                i += 1;
            }
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                while inline.last().is_some_and(|m| m.1 > depth) {
                    inline.pop();
                }
                cfg_test = false;
                i += 1;
            }
            Tok::Punct(';') => {
                cfg_test = false;
                i += 1;
            }
            _ => i += 1,
        }
    }
    refs
}

// ---- the checks ----

/// `from → to` edges between units that the table does not list.
fn layer_violations(sources: &[Source]) -> Vec<String> {
    let mut bad = BTreeSet::new();
    for s in sources {
        for r in &s.refs {
            let to = unit_of(&r.path);
            if !allowed(&s.unit, &to) {
                bad.insert(format!(
                    "{}:{} imports crate::{} ({} → {} is not allowed)",
                    s.name,
                    r.line,
                    r.path.join("::"),
                    layer_name(&s.unit),
                    layer_name(&to)
                ));
            }
        }
    }
    bad.into_iter().collect()
}

/// The strongly connected components of more than one node (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on_stack.insert(v);
        for w in t.edges.get(v).into_iter().flatten() {
            if !t.index.contains_key(w.as_str()) {
                visit(t, w);
                let lw = t.low[w.as_str()];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on_stack.contains(w.as_str()) {
                let iw = t.index[w.as_str()];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on_stack.remove(w);
                scc.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out.sort();
    t.out
}

/// Reports each cycle with the imports that make it: `(edges, witnesses of each edge)`.
fn report_cycles(
    edges: &BTreeMap<String, BTreeSet<String>>,
    witness: &BTreeMap<(String, String), String>,
) -> Vec<String> {
    cycles(edges)
        .into_iter()
        .map(|scc| {
            let mut lines = vec![format!("cycle between {}:", scc.join(", "))];
            for a in &scc {
                for b in edges.get(a).into_iter().flatten() {
                    if scc.contains(b) {
                        lines.push(format!("    {}", witness[&(a.clone(), b.clone())]));
                    }
                }
            }
            lines.join("\n")
        })
        .collect()
}

/// Cycles between units (top-level modules, and the wings of `nylorun`).
fn unit_cycles(sources: &[Source]) -> Vec<String> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut witness = BTreeMap::new();
    for s in sources.iter().filter(|s| !s.module.is_empty()) {
        for r in s.refs.iter().filter(|r| !r.in_test) {
            let to = unit_of(&r.path);
            if to != s.unit {
                edges.entry(s.unit.clone()).or_default().insert(to.clone());
                witness.entry((s.unit.clone(), to)).or_insert_with(|| {
                    format!("{}:{} imports crate::{}", s.name, r.line, r.path.join("::"))
                });
            }
        }
    }
    report_cycles(&edges, &witness)
}

/// Cycles between the files of one room.
fn file_cycles(sources: &[Source]) -> Vec<String> {
    let mut out = Vec::new();
    for room in ROOMS {
        let files: Vec<&Source> = sources
            .iter()
            .filter(|s| s.module.first().is_some_and(|m| m == room))
            .collect();
        // The file a path names: the one whose module is its longest prefix.
        let file_of = |path: &[String]| {
            files
                .iter()
                .filter(|f| path.starts_with(&f.module))
                .max_by_key(|f| f.module.len())
                .copied()
        };
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut witness = BTreeMap::new();
        for s in &files {
            for r in s.refs.iter().filter(|r| !r.in_test) {
                let Some(target) = file_of(&r.path) else {
                    continue;
                };
                // A file and the files of its own submodules are one module tree: a child uses
                // its parent's private items and the parent re-exports the child, as Rust
                // modules do. Only files that are not each other's ancestors form a cycle.
                let related =
                    target.module.starts_with(&s.module) || s.module.starts_with(&target.module);
                let to = target.name.clone();
                if !related {
                    edges.entry(s.name.clone()).or_default().insert(to.clone());
                    witness.entry((s.name.clone(), to)).or_insert_with(|| {
                        format!("{}:{} imports crate::{}", s.name, r.line, r.path.join("::"))
                    });
                }
            }
        }
        out.extend(report_cycles(&edges, &witness));
    }
    out
}

#[test]
fn every_import_follows_the_layers() {
    let bad = layer_violations(&sources());
    assert!(
        bad.is_empty(),
        "{} imports the layers do not allow (src/lib.rs, \"Layers\"; the table is ALLOWED in \
         tests/layers.rs):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn no_import_cycle_between_units() {
    let bad = unit_cycles(&sources());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn no_import_cycle_between_the_files_of_a_room() {
    let bad = file_cycles(&sources());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn every_file_of_src_is_in_a_layer() {
    let known: BTreeSet<&str> = ALLOWED.iter().map(|(u, _)| *u).collect();
    let lost: Vec<String> = sources()
        .iter()
        .filter(|s| s.unit != "crate root" && !known.contains(s.unit.as_str()))
        .map(|s| format!("{} is in no layer (unit {})", s.name, s.unit))
        .collect();
    assert!(lost.is_empty(), "{}", lost.join("\n"));
}

// ---- the extractor, on small strings ----

fn m(path: &str) -> Vec<String> {
    path.split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The paths `src` references, written in module `module` with child modules `children`.
fn paths(src: &str, module: &str, children: &[&str]) -> Vec<String> {
    let children: Vec<String> = children.iter().map(|c| (*c).to_owned()).collect();
    extract(src, &m(module), &children, None)
        .into_iter()
        .map(|r| r.path.join("::"))
        .collect()
}

#[test]
fn grouped_uses_over_several_lines_expand_to_each_path() {
    let src = "use crate::{\n    agent::turn::{self, TurnEnd},\n    tools::{Toolbox, codes as c},\n};\nuse std::io;\n";
    assert_eq!(
        paths(src, "local", &[]),
        [
            "agent::turn",
            "agent::turn::TurnEnd",
            "tools::Toolbox",
            "tools::codes"
        ]
    );
}

#[test]
fn nested_groups_and_globs() {
    let src = "pub use crate::nylorun::{link::{protocol::{RunGrant, methods}, *}, turn};";
    assert_eq!(
        paths(src, "nylorun::host::pod", &[]),
        [
            "nylorun::link::protocol::RunGrant",
            "nylorun::link::protocol::methods",
            "nylorun::link",
            "nylorun::turn"
        ]
    );
}

#[test]
fn inline_paths_count_and_method_calls_do_not() {
    let src = "fn f() { let x = crate::exec::confine::reported(); self.run(); let v = Vec::<u8>::new(); }";
    assert_eq!(paths(src, "tools::bash", &[]), ["exec::confine::reported"]);
}

#[test]
fn self_paths_resolve_in_the_current_module() {
    let src = "use self::output::Shape;\nfn f() { self::helper(); }";
    assert_eq!(
        paths(src, "nylorun::turn::run", &[]),
        [
            "nylorun::turn::run::output::Shape",
            "nylorun::turn::run::helper"
        ]
    );
}

#[test]
fn super_paths_climb_from_the_files_module() {
    let src = "use super::super::wire::Begin;\nuse super::Client;\nfn f() { super::super::super::link::channel::open(); }";
    assert_eq!(
        paths(src, "nylorun::artifacts::client::folder", &[]),
        [
            "nylorun::artifacts::wire::Begin",
            "nylorun::artifacts::client::Client",
            "nylorun::link::channel::open"
        ]
    );
}

#[test]
fn super_in_an_inline_module_names_the_files_module() {
    let src = "fn a() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::exec::Executor;\n}\nuse super::Other;";
    let children: Vec<String> = Vec::new();
    let refs = extract(src, &m("tools::read"), &children, None);
    let got: Vec<(String, bool)> = refs
        .into_iter()
        .map(|r| (r.path.join("::"), r.in_test))
        .collect();
    assert_eq!(
        got,
        [
            ("tools::read".to_owned(), true),
            ("tools::exec::Executor".to_owned(), true),
            ("tools::Other".to_owned(), false)
        ]
    );
}

#[test]
fn paths_from_a_child_module_resolve_under_the_file() {
    let src = "mod toolbox;\npub use toolbox::{CallContext, Toolbox};\nfn f() { read::run(); serde::x(); }";
    assert_eq!(
        paths(src, "tools", &["toolbox", "read"]),
        [
            "tools::toolbox::CallContext",
            "tools::toolbox::Toolbox",
            "tools::read::run"
        ]
    );
}

#[test]
fn comments_strings_and_chars_are_not_code() {
    let src = concat!(
        "// use crate::agent;\n",
        "/* crate::byoh::x /* nested */ crate::local::y */\n",
        "const S: &str = \"crate::chat::z \\\" crate::chat::w\";\n",
        "const R: &str = r#\"use crate::probe::q;\"#;\n",
        "fn f<'a>(s: &'a str) -> char { let _ = b'\"'; '\\'' }\n",
        "use crate::floor::text;\n",
    );
    let children: Vec<String> = Vec::new();
    let refs = extract(src, &m("tools::grep"), &children, None);
    assert_eq!(
        refs,
        [Ref {
            path: m("floor::text"),
            line: 6,
            in_test: false
        }]
    );
}

#[test]
fn a_binary_names_the_library_by_its_crate_name() {
    let children: Vec<String> = Vec::new();
    let refs = extract(
        "use podhost::config::Cli;\nfn main() { podhost::exec::supervise::main(); crate::x(); }",
        &[],
        &children,
        Some("podhost"),
    );
    let got: Vec<String> = refs.into_iter().map(|r| r.path.join("::")).collect();
    assert_eq!(got, ["config::Cli", "exec::supervise::main"]);
}

#[test]
fn units_and_the_table() {
    assert_eq!(unit_of(&m("nylorun::turn::run")), "nylorun::turn");
    assert_eq!(unit_of(&m("nylorun::Thing")), "nylorun");
    assert_eq!(unit_of(&m("config::PodArgs")), "cli");
    assert!(allowed("nylorun::host", "nylorun::link"));
    assert!(allowed("nylorun::link", "nylorun"));
    assert!(!allowed("nylorun::link", "nylorun::turn"));
    assert!(!allowed("byoh", "local"));
    assert!(!allowed("byoh", "cli"));
    assert!(!allowed("probe", "exec"));
    assert!(!allowed("agent", "chat"));
    assert!(!allowed("floor", "exec"));
}

#[test]
fn a_cycle_is_reported_with_the_imports_that_make_it() {
    let sources = vec![
        Source {
            name: "src/byoh/a.rs".into(),
            module: m("byoh::a"),
            unit: "byoh".into(),
            refs: vec![Ref {
                path: m("byoh::b::B"),
                line: 3,
                in_test: false,
            }],
        },
        Source {
            name: "src/byoh/b.rs".into(),
            module: m("byoh::b"),
            unit: "byoh".into(),
            refs: vec![Ref {
                path: m("byoh::a::A"),
                line: 7,
                in_test: false,
            }],
        },
    ];
    assert_eq!(
        file_cycles(&sources),
        [
            "cycle between src/byoh/a.rs, src/byoh/b.rs:\n    src/byoh/a.rs:3 imports crate::byoh::b::B\n    src/byoh/b.rs:7 imports crate::byoh::a::A"
        ]
    );
}

#[test]
fn a_file_and_its_own_submodule_make_no_cycle() {
    let source = |name: &str, module: &str, to: &str| Source {
        name: name.into(),
        module: m(module),
        unit: "nylorun".into(),
        refs: vec![Ref {
            path: m(to),
            line: 1,
            in_test: false,
        }],
    };
    let sources = vec![
        source(
            "src/nylorun/artifacts/client.rs",
            "nylorun::artifacts::client",
            "nylorun::artifacts::client::folder::FolderFile",
        ),
        source(
            "src/nylorun/artifacts/client/folder.rs",
            "nylorun::artifacts::client::folder",
            "nylorun::artifacts::client::ArtifactError",
        ),
    ];
    assert_eq!(file_cycles(&sources), Vec::<String>::new());
}

#[test]
fn a_unit_tests_imports_make_no_cycle() {
    let children: Vec<String> = Vec::new();
    let a = "pub struct A;\n#[cfg(test)]\nmod tests {\n    use crate::byoh::b::B;\n}\n";
    let b = "use crate::byoh::a::A;\n";
    let source = |name: &str, module: &str, text: &str| Source {
        name: name.into(),
        module: m(module),
        unit: "byoh".into(),
        refs: extract(text, &m(module), &children, None),
    };
    let sources = vec![
        source("src/byoh/a.rs", "byoh::a", a),
        source("src/byoh/b.rs", "byoh::b", b),
    ];
    assert_eq!(file_cycles(&sources), Vec::<String>::new());
    assert_eq!(unit_cycles(&sources), Vec::<String>::new());
}

#[test]
fn a_cycle_inside_a_room_below_the_fronts_is_reported() {
    let source = |name: &str, module: &str, to: &str, line: usize| Source {
        name: name.into(),
        module: m(module),
        unit: "agent".into(),
        refs: vec![Ref {
            path: m(to),
            line,
            in_test: false,
        }],
    };
    let sources = vec![
        source(
            "src/agent/turn.rs",
            "agent::turn",
            "agent::compaction::fit",
            27,
        ),
        source(
            "src/agent/compaction.rs",
            "agent::compaction",
            "agent::turn::TurnHost",
            23,
        ),
    ];
    assert_eq!(
        file_cycles(&sources),
        [
            "cycle between src/agent/compaction.rs, src/agent/turn.rs:\n    src/agent/compaction.rs:23 imports crate::agent::turn::TurnHost\n    src/agent/turn.rs:27 imports crate::agent::compaction::fit"
        ]
    );
}

#[test]
fn a_cycle_between_files_of_exec_is_reported() {
    let source = |name: &str, module: &str, to: &str, line: usize| Source {
        name: name.into(),
        module: m(module),
        unit: "exec".into(),
        refs: vec![Ref {
            path: m(to),
            line,
            in_test: false,
        }],
    };
    // The circle `exec` had: the confinement read the probe's level from `session`.
    let sources = vec![
        source(
            "src/exec/confine/mod.rs",
            "exec::confine",
            "exec::session::Namespaces",
            285,
        ),
        source(
            "src/exec/session/mod.rs",
            "exec::session",
            "exec::supervise::PIDFD_MARK",
            413,
        ),
        source(
            "src/exec/supervise.rs",
            "exec::supervise",
            "exec::confine",
            47,
        ),
    ];
    assert_eq!(
        file_cycles(&sources),
        [
            "cycle between src/exec/confine/mod.rs, src/exec/session/mod.rs, src/exec/supervise.rs:\n    src/exec/confine/mod.rs:285 imports crate::exec::session::Namespaces\n    src/exec/session/mod.rs:413 imports crate::exec::supervise::PIDFD_MARK\n    src/exec/supervise.rs:47 imports crate::exec::confine"
        ]
    );
}

// ---- long functions ----

/// The most lines a function of `src/` may span, from its `fn` line to its closing brace,
/// without saying why.
const LONG_FN_LINES: usize = 80;
/// The most functions that may be longer, each saying why in its doc comment (`Long: …`).
const MAX_LONG_FNS: usize = 10;

/// A function longer than [`LONG_FN_LINES`].
#[derive(Debug, PartialEq)]
struct LongFn {
    /// `name` at its `fn` line.
    at: String,
    lines: usize,
    /// Its doc comment says why (`Long:`).
    says_why: bool,
}

/// The spans (in chars) of the `#[cfg(test)] mod … { … }` of stripped text; a `mod tests;` is
/// a file of its own, left out by its name (`tests.rs`).
fn test_modules(c: &[char]) -> Vec<(usize, usize)> {
    let text: String = c.iter().collect();
    let mut out = Vec::new();
    for (at, _) in text.match_indices("#[cfg(test)]") {
        let rest = text[at + "#[cfg(test)]".len()..].trim_start();
        let rest = rest.strip_prefix("pub(super)").unwrap_or(rest).trim_start();
        let Some(rest) = rest.strip_prefix("mod ") else {
            continue;
        };
        let Some(open) = rest
            .find(['{', ';'])
            .filter(|&k| rest[k..].starts_with('{'))
        else {
            continue;
        };
        let open = char_index(&text, text.len() - rest.len() + open);
        out.push((char_index(&text, at), matching_brace(c, open)));
    }
    out
}

/// The index in chars of byte `at` of `text`.
fn char_index(text: &str, at: usize) -> usize {
    text[..at].chars().count()
}

/// The index of the brace that closes the one at `open`.
fn matching_brace(c: &[char], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, &ch) in c.iter().enumerate().skip(open) {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    c.len()
}

/// The functions of `src` (one file's text) longer than `limit` lines, outside test modules.
fn long_fns_in(src: &str, limit: usize) -> Vec<LongFn> {
    let c = strip(src);
    let lines: Vec<&str> = src.lines().collect();
    let tests = test_modules(&c);
    let ident = |k: usize| c[k].is_alphanumeric() || c[k] == '_';
    let line_of = |k: usize| c[..k].iter().filter(|&&ch| ch == '\n').count() + 1;
    let mut out = Vec::new();
    for i in 0..c.len().saturating_sub(2) {
        if !(c[i] == 'f' && c[i + 1] == 'n' && c[i + 2].is_whitespace())
            || (i > 0 && ident(i - 1))
            || tests.iter().any(|&(a, b)| (a..=b).contains(&i))
        {
            continue;
        }
        let name_at = (i + 2..c.len())
            .find(|&k| !c[k].is_whitespace())
            .unwrap_or(c.len());
        let name: String = c[name_at..]
            .iter()
            .take_while(|ch| ch.is_alphanumeric() || **ch == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body: the first `{` outside the parameters' brackets; a `;` first is a declaration.
        let mut depth = 0i32;
        let mut body = None;
        for (k, &ch) in c.iter().enumerate().skip(name_at) {
            match ch {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth == 0 => break,
                '{' if depth == 0 => {
                    body = Some(k);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = body else { continue };
        let (first, last) = (line_of(i), line_of(matching_brace(&c, open)));
        let span = last - first + 1;
        if span <= limit {
            continue;
        }
        let says_why = lines[..first - 1]
            .iter()
            .rev()
            .map(|l| l.trim_start())
            .take_while(|l| l.starts_with("///") || l.starts_with("#["))
            .any(|l| l.contains("Long:"));
        out.push(LongFn {
            at: format!("{name} at line {first}"),
            lines: span,
            says_why,
        });
    }
    out
}

/// Every function of `src/` longer than [`LONG_FN_LINES`] (unit tests left out: `tests.rs`
/// files and `#[cfg(test)]` modules).
fn long_fns() -> Vec<(String, LongFn)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    files.sort();
    files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "tests.rs"))
        .flat_map(|f| {
            let name = format!("src/{}", f.strip_prefix(&src).unwrap().display());
            long_fns_in(&std::fs::read_to_string(f).unwrap(), LONG_FN_LINES)
                .into_iter()
                .map(move |l| (name.clone(), l))
        })
        .collect()
}

#[test]
fn long_functions_say_why_and_are_few() {
    let long = long_fns();
    let show = |(file, l): &(String, LongFn)| format!("    {file}: {} ({} lines)", l.at, l.lines);
    let silent: Vec<String> = long.iter().filter(|(_, l)| !l.says_why).map(show).collect();
    assert!(
        silent.is_empty(),
        "functions over {LONG_FN_LINES} lines whose doc comment does not say why: split them \
         along a seam, or add a line `Long: <why>` to the doc comment:\n{}",
        silent.join("\n")
    );
    assert!(
        long.len() <= MAX_LONG_FNS,
        "{} functions over {LONG_FN_LINES} lines, past the {MAX_LONG_FNS} allowed; split one:\n{}",
        long.len(),
        long.iter().map(show).collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn long_functions_are_measured_from_fn_to_brace_outside_tests() {
    let body = |n: usize| "    let x = '{';\n".repeat(n);
    let src = format!(
        "/// Short.\nfn short() {{\n{}}}\n\n/// Why.\n/// Long: a table.\npub(crate) async fn long<T>(\n    t: T,\n) -> Vec<[u8; 2]> {{\n{}    \"}}\";\n}}\n\ntrait Port {{\n    fn declared(&self);\n}}\n\nfn silent() {{\n{}}}\n\n#[cfg(test)]\nmod tests {{\n    fn in_test() {{\n{}    }}\n}}\n",
        body(3),
        body(5),
        body(4),
        body(9)
    );
    assert_eq!(
        long_fns_in(&src, 5),
        [
            LongFn {
                at: "long at line 10".into(),
                lines: 10,
                says_why: true,
            },
            LongFn {
                at: "silent at line 25".into(),
                lines: 6,
                says_why: false,
            },
        ]
    );
}
