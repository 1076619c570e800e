//! The crate's module imports form a DAG, arrows pointing down (issue 33): no import loop
//! anywhere in `src/`, and `client/` (the async JetStream client) imports nothing from
//! `backend/` (the durable-source seam written on it).
//!
//! The graph is read from the source files themselves: every file is a node; its edges are
//! the crate modules named by its `use` trees (`crate::a::b`, `super::x`,
//! `super::super::y`, grouped `{…}` trees, a child module's name), by inline `crate::…`
//! and `super::…` paths, and by its `mod x;` declarations (a parent owns its children, so
//! a child that reaches back up for an item of its parent closes a loop). A path resolves
//! to the deepest module file it walks through (`a/b.rs` or `a/b/mod.rs`); an item defined
//! or re-exported by a module is an edge to that module's file. `super::` inside an inline
//! module (`mod tests { use super::*; }`) names the file it sits in: no edge. Comments and
//! string literals are skipped, so doc links do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module path from the crate root (`[]` is `lib.rs`, `["backend", "group"]` is
/// `backend/group/mod.rs`).
type ModPath = Vec<String>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// The tokens that matter for imports: identifiers, `::` and punctuation; comments,
/// string, char and byte literals, lifetimes and numbers dropped.
fn tokens(src: &str) -> Vec<Tok> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if (c == b'r' || (c == b'b' && b.get(i + 1) == Some(&b'r'))) && {
            let s = if c == b'b' { i + 2 } else { i + 1 };
            let mut j = s;
            while b.get(j) == Some(&b'#') {
                j += 1;
            }
            b.get(j) == Some(&b'"') && (i == 0 || !is_ident(b[i - 1]))
        } {
            // A raw string: r"…", r#"…"#, br"…".
            let mut j = if c == b'b' { i + 2 } else { i + 1 };
            let mut hashes = 0;
            while b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): a lifetime has no
            // closing quote right after its name.
            if b.get(i + 1) == Some(&b'\\') {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
            } else {
                let ch_len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                if b.get(i + 1 + ch_len) == Some(&b'\'') {
                    i += 2 + ch_len;
                } else {
                    i += 1;
                    while i < b.len() && is_ident(b[i]) {
                        i += 1;
                    }
                }
            }
        } else if c.is_ascii_digit() {
            while i < b.len() && (is_ident(b[i]) || b[i] == b'.') {
                // `1..n` is a range: stop before the second dot.
                if b[i] == b'.' && b.get(i + 1) == Some(&b'.') {
                    break;
                }
                i += 1;
            }
        } else if is_ident(c) {
            let s = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            let word = &src[s..i];
            // `r#ident`
            let word = word.strip_prefix("r#").unwrap_or(word);
            out.push(Tok::Ident(word.to_string()));
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            out.push(Tok::Path);
            i += 2;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else {
            out.push(Tok::Punct(c as char));
            i += 1;
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80
}

/// Expands a `use` tree starting at `toks[*i]` into its paths, until the `;` or the `,`/`}`
/// that ends it.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(*i) {
            Some(Tok::Ident(w)) => {
                path.push(w.clone());
                *i += 1;
                if toks.get(*i) == Some(&Tok::Ident("as".into())) {
                    *i += 2;
                }
            }
            Some(Tok::Path) => *i += 1,
            Some(Tok::Punct('*')) => *i += 1,
            Some(Tok::Punct('{')) => {
                *i += 1;
                loop {
                    match toks.get(*i) {
                        Some(Tok::Punct('}')) => {
                            *i += 1;
                            break;
                        }
                        Some(Tok::Punct(',')) => *i += 1,
                        None => break,
                        _ => use_tree(toks, i, &path, out),
                    }
                }
                return;
            }
            _ => {
                out.push(path);
                return;
            }
        }
    }
}

/// One file's module paths named in it, each with the module it is named from (the file's
/// own module plus any inline modules around the name).
fn named_paths(toks: &[Tok], file_mod: &ModPath) -> (Vec<(ModPath, Vec<String>)>, Vec<String>) {
    let mut named = Vec::new();
    let mut declared = Vec::new();
    // Inline modules open around the current token: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let here = |inline: &[(String, usize)]| {
        let mut m = file_mod.clone();
        m.extend(inline.iter().map(|(n, _)| n.clone()));
        m
    };
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Ident(w) if w == "mod" => match (toks.get(i + 1), toks.get(i + 2)) {
                (Some(Tok::Ident(name)), Some(Tok::Punct(';'))) => {
                    if inline.is_empty() {
                        declared.push(name.clone());
                    }
                    named.push((here(&inline), vec!["self".into(), name.clone()]));
                    i += 3;
                }
                (Some(Tok::Ident(name)), Some(Tok::Punct('{'))) => {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                }
                _ => i += 1,
            },
            Tok::Ident(w) if w == "use" => {
                i += 1;
                let mut paths = Vec::new();
                if toks.get(i) == Some(&Tok::Path) {
                    i += 1;
                }
                use_tree(toks, &mut i, &[], &mut paths);
                let m = here(&inline);
                named.extend(paths.into_iter().map(|p| (m.clone(), p)));
            }
            Tok::Ident(w)
                if (w == "crate" || w == "super")
                    && toks.get(i + 1) == Some(&Tok::Path)
                    && !(i > 0 && toks[i - 1] == Tok::Path) =>
            {
                let mut p = vec![w.clone()];
                let mut j = i + 1;
                while toks.get(j) == Some(&Tok::Path) {
                    match toks.get(j + 1) {
                        Some(Tok::Ident(s)) => {
                            p.push(s.clone());
                            j += 2;
                        }
                        _ => break,
                    }
                }
                named.push((here(&inline), p));
                i = j;
            }
            _ => i += 1,
        }
    }
    (named, declared)
}

struct Crate {
    src: PathBuf,
    /// Every module that has a file, and that file (relative to `src`).
    files: BTreeMap<ModPath, String>,
}

impl Crate {
    fn read(src: &Path) -> Self {
        let mut files = BTreeMap::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let rel = path.strip_prefix(src).unwrap();
                let rel_s = rel.to_str().unwrap().replace('\\', "/");
                let mut m: ModPath = rel_s
                    .trim_end_matches(".rs")
                    .split('/')
                    .map(str::to_string)
                    .collect();
                if m.last().is_some_and(|l| l == "mod" || l == "lib") {
                    m.pop();
                }
                if rel_s != "main.rs" {
                    files.insert(m, rel_s);
                }
            }
        }
        Crate {
            src: src.to_path_buf(),
            files,
        }
    }

    /// The module file `path` (named from module `from`) lands in, or `None` for a path
    /// outside the crate (`std::…`, `tidings::…`, a local name).
    fn resolve(&self, from: &ModPath, path: &[String], children: &[String]) -> Option<ModPath> {
        let mut segs = path.iter().peekable();
        let mut at: ModPath = match segs.peek().map(|s| s.as_str()) {
            Some("crate") => {
                segs.next();
                Vec::new()
            }
            Some("super") | Some("self") => from.clone(),
            Some(first) if children.iter().any(|c| c == first) => from.clone(),
            _ => return None,
        };
        while segs.peek().is_some_and(|s| *s == "super" || *s == "self") {
            if segs.next().unwrap() == "super" {
                at.pop()?;
            }
        }
        // The deepest module with a file the rest of the path walks through.
        let mut file = self.owner(&at);
        for s in segs {
            if s == "self" {
                continue;
            }
            at.push(s.clone());
            if self.files.contains_key(&at) {
                file = at.clone();
            } else {
                break;
            }
        }
        Some(file)
    }

    /// The module with a file that holds module `m` (itself, or the file an inline module
    /// sits in).
    fn owner(&self, m: &ModPath) -> ModPath {
        let mut m = m.clone();
        while !self.files.contains_key(&m) {
            m.pop();
        }
        m
    }

    /// Edges between files: importer → imported, with the path that made each.
    fn edges(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (m, file) in &self.files {
            let text = fs::read_to_string(self.src.join(file)).unwrap();
            let toks = tokens(&text);
            let (named, children) = named_paths(&toks, m);
            let out = edges.entry(file.clone()).or_default();
            for (from, path) in named {
                let Some(to) = self.resolve(&from, &path, &children) else {
                    continue;
                };
                let to_file = &self.files[&to];
                if to_file != file {
                    out.entry(to_file.clone())
                        .or_insert_with(|| path.join("::"));
                }
            }
        }
        edges
    }
}

/// The crate's strongly connected components of more than one file: each is an import
/// loop (Tarjan's algorithm).
fn loops(edges: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        if let Some(next) = t.edges.get(v) {
            for w in next.keys() {
                let w = w.as_str();
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let l = t.low[w].min(t.low[v]);
                    t.low.insert(v, l);
                } else if t.on.contains(w) {
                    let l = t.index[w].min(t.low[v]);
                    t.low.insert(v, l);
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                scc.push(w.to_string());
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
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// One cycle through `start` inside its loop `scc`, as `a -> b -> … -> a`, each arrow with
/// the path that made it (breadth-first: a shortest one).
fn cycle(edges: &BTreeMap<String, BTreeMap<String, String>>, scc: &[String]) -> String {
    let start = &scc[0];
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.as_str()]);
    let mut end = None;
    'bfs: while let Some(v) = queue.pop_front() {
        for w in edges[v].keys() {
            if !scc.contains(w) {
                continue;
            }
            if w == start {
                end = Some(v);
                break 'bfs;
            }
            if !prev.contains_key(w.as_str()) {
                prev.insert(w.as_str(), v);
                queue.push_back(w);
            }
        }
    }
    let mut path = vec![start.as_str()];
    let mut v = end.unwrap();
    while v != start {
        path.push(v);
        v = prev[v];
    }
    path.push(start);
    path.reverse();
    path.windows(2)
        .map(|p| format!("{} -({})-> ", p[0], edges[p[0]][p[1]]))
        .collect::<String>()
        + start
}

fn crate_src() -> PathBuf {
    // TIDINGS_LAYERING_SRC checks another tree (an older checkout, say) with the same rules.
    std::env::var_os("TIDINGS_LAYERING_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

#[test]
fn the_module_imports_form_no_loop() {
    let krate = Crate::read(&crate_src());
    assert!(
        krate.files.len() > 20,
        "read only {} files from {}",
        krate.files.len(),
        krate.src.display()
    );
    let edges = krate.edges();
    let found = loops(&edges);
    let report: Vec<String> = found
        .iter()
        .map(|scc| {
            let inside: String = scc
                .iter()
                .flat_map(|f| {
                    edges[f]
                        .iter()
                        .filter(|(t, _)| scc.contains(t))
                        .map(move |(t, p)| format!("\n    {f} -> {t} ({p})"))
                })
                .collect();
            format!(
                "loop among {scc:?}\n  e.g. {}\n  its edges:{inside}",
                cycle(&edges, scc)
            )
        })
        .collect();
    assert!(
        report.is_empty(),
        "{} import loop(s) in {}:\n{}",
        report.len(),
        krate.src.display(),
        report.join("\n")
    );
}

#[test]
fn the_client_imports_nothing_from_the_backend() {
    let krate = Crate::read(&crate_src());
    let edges = krate.edges();
    let up: Vec<String> = edges
        .iter()
        .filter(|(from, _)| from.starts_with("client/"))
        .flat_map(|(from, to)| {
            to.iter()
                .filter(|(t, _)| t.starts_with("backend/"))
                .map(move |(t, p)| format!("{from} -> {t} ({p})"))
        })
        .collect();
    assert!(
        up.is_empty(),
        "client/ imports backend/:\n{}",
        up.join("\n")
    );
}

/// The reader itself: grouped trees, `super` from an inline module, a child module, a
/// re-export, and comments and strings skipped.
#[test]
fn the_reader_resolves_paths_as_rustc_does() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    fs::create_dir_all(src.join("a/b")).unwrap();
    fs::create_dir_all(src.join("c")).unwrap();
    fs::write(src.join("lib.rs"), "mod a; mod c; pub use a::X;").unwrap();
    fs::write(
        src.join("a/mod.rs"),
        "mod b; mod d; pub struct X; use b::{self, e::Y};",
    )
    .unwrap();
    fs::write(src.join("a/b/mod.rs"), "mod e; use super::d::{Z};").unwrap();
    fs::write(
        src.join("a/b/e.rs"),
        "pub struct Y; fn f() { super::super::X; }",
    )
    .unwrap();
    fs::write(
        src.join("a/d.rs"),
        "pub struct Z; // crate::c::q\n const S: &str = \"crate::c::q\";\n\
         #[cfg(test)] mod tests { use super::*; use super::super::X; }",
    )
    .unwrap();
    fs::write(
        src.join("c/mod.rs"),
        "mod q; fn g() -> crate::a::d::Z { todo() }",
    )
    .unwrap();
    fs::write(
        src.join("c/q.rs"),
        "use crate::X; use crate::{a::{b::e::Y}};",
    )
    .unwrap();
    let krate = Crate::read(src);
    let edges = krate.edges();
    let of = |f: &str| edges[f].keys().cloned().collect::<Vec<_>>();
    assert_eq!(of("lib.rs"), ["a/mod.rs", "c/mod.rs"]);
    assert_eq!(of("a/mod.rs"), ["a/b/e.rs", "a/b/mod.rs", "a/d.rs"]);
    assert_eq!(of("a/b/mod.rs"), ["a/b/e.rs", "a/d.rs"]);
    assert_eq!(of("a/b/e.rs"), ["a/mod.rs"]);
    assert_eq!(of("a/d.rs"), ["a/mod.rs"]);
    assert_eq!(of("c/mod.rs"), ["a/d.rs", "c/q.rs"]);
    assert_eq!(of("c/q.rs"), ["a/b/e.rs", "lib.rs"]);
    let mut found = loops(&edges);
    found.sort();
    assert_eq!(
        found,
        [
            vec!["a/b/e.rs", "a/b/mod.rs", "a/d.rs", "a/mod.rs"],
            vec!["c/mod.rs", "c/q.rs", "lib.rs"]
        ]
    );
    let c = cycle(&edges, &found[0]);
    assert!(
        c.starts_with("a/b/e.rs -(super::super::X)-> a/mod.rs"),
        "{c}"
    );
    assert!(c.ends_with("-> a/b/e.rs"), "{c}");
}
